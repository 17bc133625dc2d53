"""Strategies: the same weights on 2 replicas or 2 workers, one-line errors.

Strategies set process-wide state (logical devices, a cluster), so the
trainings run in subprocesses, `tests/support/dist_worker.py`.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from support import dist_worker, folders
from support.cli import REPO, free_ports, run_train
from support.runs import final_state

from xla_mnist import loop
from xla_mnist.runtime import xla_cache

# tests/support/dist_worker.py, run as `support.dist_worker` with tests/ on
# the path.
WORKER = ['-m', 'support.dist_worker']
TESTS_PATH = os.pathsep.join(
  filter(None, [os.path.join(REPO, 'tests'), os.environ.get('PYTHONPATH')])
)


TIMEOUT = 120


@pytest.fixture(scope='module')
def single_device_weights() -> np.ndarray:
  return dist_worker.train_single()


def start_worker(out: str, *args: str, **env: str) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, *WORKER, *args, out],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    env={
      **os.environ,
      'PYTHONPATH': TESTS_PATH,
      'TF_CPP_MIN_LOG_LEVEL': '2',
      **env,
    },
  )


def wait_all(procs: list[subprocess.Popen]) -> list[str]:
  """Their outputs, within TIMEOUT for all; kills them all on a timeout."""
  deadline = time.monotonic() + TIMEOUT
  try:
    return [
      p.communicate(timeout=max(1, deadline - time.monotonic()))[0]
      for p in procs
    ]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def finish(procs: list[subprocess.Popen]) -> list[str]:
  """Waits for every process; fails unless all exit with 0."""
  outputs = wait_all(procs)
  # Every failed process's output, not just the first: when one worker
  # crashes, the others fail too, and only its own output says why.
  failed = [
    f'process {i} exited with {p.returncode}:\n{output[-3000:]}'
    for i, (p, output) in enumerate(zip(procs, outputs, strict=True))
    if p.returncode != 0
  ]
  assert not failed, '\n\n'.join(failed)
  return outputs


@pytest.mark.slow
def test_mirrored_on_two_cpus_matches_one_device(
  tmp_path, single_device_weights
):
  out = str(tmp_path / 'weights.npy')
  (output,) = finish([start_worker(out, 'mirrored', '2')])
  assert 'replicas 2' in output
  np.testing.assert_allclose(np.load(out), single_device_weights, atol=1e-6)


@pytest.mark.slow
def test_mirrored_trains_a_folder_of_colour_images_as_one_device(tmp_path):
  """The data's facts reach the replicas: RGB images of 12x12 in three
  classes train on 2 logical CPUs to one device's weights."""
  rng = np.random.default_rng(0)
  for split, count in (('train', 8), ('test', 4)):
    for name in ('red', 'green', 'blue'):
      folder = tmp_path / 'images' / split / name
      folder.mkdir(parents=True)
      for i in range(count):
        pixels = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
        (folder / f'{i}.png').write_bytes(folders.encode(pixels, 'png'))
  common = [
    f'--config.image_dir={tmp_path / "images"}', '--config.model=mlp',
    '--config.num_steps=6', '--config.batch_size=4',
    '--config.learning_rate=0.1', f'--data_dir={tmp_path / "data"}',
  ]  # fmt: skip
  states = []
  for name, extra in (
    ('one', []), ('two', ['--strategy=mirrored', '--config.num_cpu_devices=2'])
  ):  # fmt: skip
    proc = run_train(*common, *extra, f'--workdir={tmp_path / name}')
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / name / 'result.json') as f:
      result = json.load(f)
    assert result['image_shape'] == [12, 12, 3]
    assert result['class_names'] == ['blue', 'green', 'red']
    states.append(final_state(tmp_path / name))
  one, two = states
  weights = [k for k in one if '_trainable_variables' in k]
  assert len(weights) == 6 and sorted(weights) == sorted(
    k for k in two if '_trainable_variables' in k
  )  # The MLP's three kernels and biases.
  for key in weights:
    np.testing.assert_allclose(two[key], one[key], atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_two_workers_match_one_device(tmp_path, single_device_weights):
  cluster = {'worker': [f'127.0.0.1:{p}' for p in free_ports(2)]}
  procs = []
  for index in range(2):
    tf_config = {'cluster': cluster, 'task': {'type': 'worker', 'index': index}}
    out = str(tmp_path / f'weights{index}.npy')
    procs.append(
      start_worker(out, 'multi_worker', '0', TF_CONFIG=json.dumps(tf_config))
    )
  outputs = finish(procs)
  assert all('replicas 2' in output for output in outputs)
  assert not os.path.exists(tmp_path / 'weights1.npy')  # Only the chief.
  weights = np.load(tmp_path / 'weights0.npy')
  np.testing.assert_allclose(weights, single_device_weights, atol=1e-6)


def test_one_device_loads_no_other_strategy_nor_a_cluster():
  # A subprocess: the test process may have loaded them already.
  script = (
    'import sys\n'
    'from xla_mnist.runtime import distribute\n'
    "strategy = distribute.make_strategy('default')\n"
    'assert distribute.worker_max(strategy) is None\n'
    'distribute.check_same_start(strategy, 0)\n'
    'with distribute.lost_workers_as_errors(strategy):\n'
    '  pass\n'
    "print('xla_mnist.runtime.cluster' in sys.modules)\n"
    "print('xla_mnist.runtime.strategies' in sys.modules)\n"
  )
  result = run_python(script)
  assert result.stdout.split() == ['False'] * 2, result.stderr[-2000:]


@pytest.mark.slow
def test_missing_tpu_is_one_line_not_a_hang():
  # A subprocess: connecting to a TPU cluster changes TF's eager context. Its
  # timeout guards against a hang; it is no speed check.
  script = (
    'from xla_mnist.runtime import distribute, errors\n'
    'try:\n'
    "  distribute.make_strategy('tpu')\n"
    'except errors.UserError as e:\n'
    "  print(f'error: {e}')\n"
  )
  result = run_python(script, TF_CPP_MIN_LOG_LEVEL='2')
  lines = [line for line in result.stdout.splitlines() if line]
  assert len(lines) == 1 and 'found no TPU' in lines[0], result.stdout


def run_python(script: str, **variables: str) -> subprocess.CompletedProcess:
  """`script` in a new Python process, in the repository."""
  return subprocess.run(
    [sys.executable, '-c', script],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
    env={**os.environ, **variables},
  )


def start_cli_workers(
  workdirs: list, data_dir: str, *flags: str
) -> list[subprocess.Popen]:
  """`python -m xla_mnist.train --strategy=multi_worker`, a worker per
  workdir, on 127.0.0.1."""
  cluster = {'worker': [f'127.0.0.1:{p}' for p in free_ports(len(workdirs))]}
  procs = []
  for index, workdir in enumerate(workdirs):
    tf_config = {'cluster': cluster, 'task': {'type': 'worker', 'index': index}}
    procs.append(
      subprocess.Popen(
        [
          sys.executable,
          '-m',
          'xla_mnist.train',
          '--config=fashion_mnist',
          '--strategy=multi_worker',
          f'--data_dir={data_dir}',
          f'--workdir={workdir}',
          *flags,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
          **os.environ,
          'TF_CONFIG': json.dumps(tf_config),
          'PYTHONUNBUFFERED': '1',  # Lines as they come, to signal at one.
        },
      )
    )
  return procs


@pytest.fixture(scope='module')
def two_worker_run(tmp_path_factory, fashion_data_dir):
  """1000 steps on 2 workers with a workdir each: (workdirs, outputs)."""
  root = tmp_path_factory.mktemp('two_workers')
  workdirs = [root / 'worker0', root / 'worker1']
  return workdirs, finish(start_cli_workers(workdirs, fashion_data_dir))


@pytest.mark.slow
def test_cli_two_workers_train_and_only_the_chief_writes(two_worker_run):
  (chief, other), outputs = two_worker_run
  assert 'device=2 replicas (multi_worker)' in outputs[0]
  result = json.loads((chief / 'result.json').read_text())
  assert result['test_accuracy'] >= 0.82, outputs[0][-2000:]
  assert os.listdir(other) == []  # Only the chief writes.
  assert 'outputs: none kept' in outputs[1]
  assert 'profile: ' in outputs[0] and 'profile: ' not in outputs[1]
  assert 'profiling failed' not in outputs[1]  # It does not try.


@pytest.mark.slow
def test_cli_workers_that_cannot_see_the_chiefs_checkpoints_refuse_to_resume(
  two_worker_run, fashion_data_dir
):
  # Again, without --fresh: the chief would resume at step 1000, the other
  # worker, whose workdir is another folder, start at 0. Both refuse, and the
  # chief's outputs stay as they are.
  workdirs, _ = two_worker_run
  result_file = workdirs[0] / 'result.json'
  kept = result_file.read_text()
  procs = start_cli_workers(workdirs, fashion_data_dir)
  for proc, output in zip(procs, wait_all(procs), strict=True):
    assert proc.returncode == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith('error')]
    assert len(errors) == 1, output[-3000:]
    assert 'would start at different steps (0, 1000)' in errors[0]
    assert 'the same --workdir' in errors[0]
  assert result_file.read_text() == kept
  assert os.listdir(workdirs[1]) == []


def wait_for_line(proc: subprocess.Popen, prefix: str) -> queue.Queue[str]:
  """Reads `proc`'s output until a line starts with `prefix`, within TIMEOUT.

  A thread reads, as a blocked read cannot time out; the rest of the output
  goes on coming into the queue returned, and '' ends it.
  """
  lines: queue.Queue[str] = queue.Queue()

  def read() -> None:
    for line in proc.stdout:
      lines.put(line)
    lines.put('')  # The end of the output.

  threading.Thread(target=read, daemon=True).start()
  deadline = time.monotonic() + TIMEOUT
  while True:
    line = lines.get(timeout=max(0, deadline - time.monotonic()))
    if line.startswith(prefix):
      return lines
    if not line:
      raise AssertionError(f'exited with {proc.wait()} before {prefix!r}')


def signal_at_a_random_step(
  procs: list[subprocess.Popen], index: int, signum: int, after: int = 100
) -> list[str]:
  """Sends `signum` to worker `index` at a random step after step `after`;
  returns every worker's output (the signalled one's from that step on)."""
  try:
    rest = wait_for_line(procs[index], f'step {after:>6}/')  # All train.
  except BaseException:
    for proc in procs:
      proc.kill()
      proc.wait()
    raise
  time.sleep(random.uniform(0, 1.5))
  procs[index].send_signal(signum)
  others = iter(wait_all([p for i, p in enumerate(procs) if i != index]))
  own = ''.join(iter(lambda: rest.get(timeout=TIMEOUT), ''))
  procs[index].wait()
  return [own if i == index else next(others) for i in range(len(procs))]


def assert_resumes_to_the_uninterrupted_weights(
  workdirs: list, data_dir: str, reference, *flags: str
) -> None:
  """Both workers, sharing a workdir as on shared storage, resume from the
  chief's checkpoints there and end as the uninterrupted run `reference`:
  its weights, final loss and test accuracy. (A finished run extended by
  --config.num_steps resumes as one process does: test_paths, test_api.)"""
  outputs = finish(start_cli_workers(workdirs, data_dir, *flags))
  assert all('resuming at step' in output for output in outputs)
  state, expected = final_state(workdirs[0]), final_state(reference)
  assert state.keys() == expected.keys()
  for key, value in expected.items():
    assert np.array_equal(state[key], value), key
  resumed = json.loads((workdirs[0] / 'result.json').read_text())
  whole = json.loads((reference / 'result.json').read_text())
  assert resumed['final_loss'] == whole['final_loss']
  assert resumed['test_accuracy'] == whole['test_accuracy']


def assert_all_stopped_at_one_step(
  procs: list[subprocess.Popen],
  outputs: list[str],
  index: int,
  workdir,
  steps: int,
) -> None:
  """Every worker stopped by the SIGTERM sent to worker `index`, at one step
  where the workers agree to stop, before the end (`steps`), each in one
  line; that step's checkpoint is complete: the latest, restorable."""
  checkpoints = workdir / 'checkpoints'
  stops = set()
  for i, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert 'Traceback' not in output, output[-3000:]
    assert not re.search('^error', output, re.M), output[-3000:]
    said = [line for line in output.splitlines() if 'stopped by' in line]
    assert len(said) == 1, output[-3000:]
    match = re.fullmatch(
      rf'stopped by SIGTERM({" to another worker" if i != index else ""})'
      rf' after step (\d+): run the same command to resume from the'
      rf' checkpoint in {re.escape(str(checkpoints))}',
      said[0],
    )
    assert match, said[0]
    stops.add(int(match.group(2)))
  (stop,) = stops  # The same step on every worker.
  assert stop % loop.AGREE_EVERY == 0 and 100 < stop < steps
  state = final_state(workdir)
  assert int(state['step/.ATTRIBUTES/VARIABLE_VALUE']) == stop
  assert not (workdir / 'result.json').exists()


@pytest.mark.slow
def test_cli_sigterm_to_the_chief_stops_all_at_one_step_then_resumes_exactly(
  two_worker_run, fashion_data_dir, tmp_path
):
  """The SIGTERM to the chief; to another worker: the user's model below."""
  shared = [tmp_path / 'run', tmp_path / 'run']
  procs = start_cli_workers(shared, fashion_data_dir)
  outputs = signal_at_a_random_step(procs, 0, signal.SIGTERM)
  assert_all_stopped_at_one_step(procs, outputs, 0, tmp_path / 'run', 1000)
  (reference, _), _ = two_worker_run
  assert_resumes_to_the_uninterrupted_weights(
    shared, fashion_data_dir, reference
  )


@pytest.mark.slow
def test_cli_a_killed_worker_ends_the_other_in_one_line_then_both_resume(
  two_worker_run, fashion_data_dir, tmp_path
):
  shared = [tmp_path / 'run', tmp_path / 'run']
  procs = start_cli_workers(
    shared, fashion_data_dir, '--config.checkpoint_every=100'
  )
  # After step 200: the checkpoint of step 100 is complete.
  chief, _ = signal_at_a_random_step(procs, 1, signal.SIGKILL, after=200)
  assert procs[1].returncode == -signal.SIGKILL
  assert procs[0].returncode == 1, chief[-3000:]
  assert 'Traceback' not in chief, chief[-3000:]
  errors = [line for line in chief.splitlines() if line.startswith('error')]
  assert len(errors) == 1, chief[-3000:]
  assert errors[0].startswith(
    'error: lost contact with another worker (UnavailableError: '
  )
  # From the last complete checkpoint, of step 100 or later.
  saved = final_state(tmp_path / 'run')['step/.ATTRIBUTES/VARIABLE_VALUE']
  assert 100 <= saved < 1000
  (reference, _), _ = two_worker_run
  assert_resumes_to_the_uninterrupted_weights(
    shared, fashion_data_dir, reference
  )


@pytest.mark.slow
def test_cli_an_xla_cache_that_fails_in_tf_ends_every_worker_in_one_line(
  fashion_data_dir, tmp_path
):
  """One process starts again without the cache; a worker must not, as the
  others would lose it mid-step: every worker ends in one line, the entries
  that failed are gone, and the same command then trains."""
  cache = str(tmp_path / 'xla')
  flags = ('--jit=on', '--config.num_steps=20', f'--xla_cache_dir={cache}')
  finish(start_cli_workers([tmp_path / 'warm'] * 2, fashion_data_dir, *flags))
  poisoned = 0  # Whole, of their names, but of other HLO: TF refuses them.
  for name in sorted(xla_cache.entries(cache)):
    path = os.path.join(cache, name)
    with open(path, 'rb') as f:
      content = f.read()
    if b'__inference_grads_' in content:
      with open(path, 'wb') as f:
        f.write(content.replace(b'__inference_grads_', b'__inference_grabs_'))
      poisoned += 1
  assert poisoned
  shared = [tmp_path / 'run'] * 2
  procs = start_cli_workers(shared, fashion_data_dir, *flags)
  outputs = wait_all(procs)
  for proc, output in zip(procs, outputs, strict=True):
    assert proc.returncode == 1, output[-3000:]
    assert 'Traceback' not in output and 'starting again' not in output
    errors = [line for line in output.splitlines() if line.startswith('error')]
    assert len(errors) == 1, output[-3000:]
  told = [o for o in outputs if f'error: XLA cache {cache} failed in TF' in o]
  assert told, outputs
  assert '(Serialized HLO does not match.)' in told[0]
  assert 'run the same command on every worker again' in told[0]
  assert 'they resume from the last checkpoint' in told[0]
  for name in xla_cache.entries(cache):  # Removed, or stored anew.
    with open(os.path.join(cache, name), 'rb') as f:
      assert b'__inference_grabs_' not in f.read()
  finish(start_cli_workers(shared, fashion_data_dir, *flags))
  assert (tmp_path / 'run' / 'result.json').exists()


@pytest.mark.slow
def test_cli_workers_refuse_a_one_process_checkpoint_in_one_line(
  fashion_data_dir, tmp_path
):
  """Two workers sum their gradients in another order than one device: the
  placement is part of the recipe, so the resume is refused, not mixed."""
  one = subprocess.run(
    [
      sys.executable,
      '-m',
      'xla_mnist.train',
      '--config=fashion_mnist',
      f'--data_dir={fashion_data_dir}',
      f'--workdir={tmp_path}',
      '--config.num_steps=200',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )
  assert one.returncode == 0, one.stderr[-3000:]
  kept = (tmp_path / 'checkpoints' / 'ckpt-200.index').read_bytes()
  procs = start_cli_workers(
    [tmp_path, tmp_path], fashion_data_dir, '--config.num_steps=300'
  )
  outputs = wait_all(procs)
  assert [p.returncode for p in procs] == [2, 2], outputs
  for output in outputs:
    errors = [line for line in output.splitlines() if line.startswith('error')]
    assert len(errors) == 1 and 'with device' in errors[0], output[-2000:]
  assert (tmp_path / 'checkpoints' / 'ckpt-200.index').read_bytes() == kept


def summary(output: str) -> list[str]:
  """A worker's lines of the trained model: test accuracy and final loss."""
  return [
    re.sub(r'compile .*, final loss', 'final loss', line)  # Not the times.
    for line in output.splitlines()
    if line.startswith('test accuracy') or 'final loss' in line
  ]


@pytest.fixture
def user_models(tmp_path, monkeypatch) -> None:
  """The user's module (support.models.FACTORIES) on the workers' PYTHONPATH,
  ahead of the rest of it."""
  from support.models import FACTORIES

  folder = tmp_path / 'user'
  folder.mkdir()
  (folder / 'user_models.py').write_text(FACTORIES)
  path = os.environ.get('PYTHONPATH', '')
  monkeypatch.setenv(
    'PYTHONPATH', os.pathsep.join(filter(None, [str(folder), path]))
  )


@pytest.mark.slow
def test_cli_workers_train_a_users_model_stop_on_sigterm_and_resume_exactly(
  user_models, fashion_data_dir, tmp_path
):
  flags = (
    '--config.model=user_models:small',
    '--config.learning_rate=0.1',
    # The signal comes up to 1.5 s after step 100: below ~130 steps/s (2
    # workers on 127.0.0.1 train the MLP at ~40 here), before step 300's
    # agreement, the last one before the end.
    '--config.num_steps=400',
    '--config.batch_size=20',
    '--config.profile_steps=0',
  )
  reference = tmp_path / 'straight'
  outputs = finish(
    start_cli_workers([reference, reference], fashion_data_dir, *flags)
  )
  # A model with a hidden layer (random, seeded initial weights) trains as
  # the softmax does; both workers end with the same model.
  chief, other = (summary(output) for output in outputs)
  assert len(chief) == 2 and chief == other, (chief, other)
  result = json.loads((reference / 'result.json').read_text())
  assert result['config']['model'] == 'user_models:small'
  assert result['device'] == '2 replicas (multi_worker)'
  assert result['test_accuracy'] >= 0.6, outputs[0][-2000:]  # It learns.
  shapes = {np.shape(v) for v in final_state(reference).values()}
  assert (784, 32) in shapes, shapes  # The user's model, not the softmax.
  # The SIGTERM to another worker than the chief; to the chief: above.
  shared = [tmp_path / 'run', tmp_path / 'run']
  procs = start_cli_workers(shared, fashion_data_dir, *flags)
  outputs = signal_at_a_random_step(procs, 1, signal.SIGTERM)
  assert_all_stopped_at_one_step(procs, outputs, 1, tmp_path / 'run', 400)
  assert_resumes_to_the_uninterrupted_weights(
    shared, fashion_data_dir, reference, *flags
  )
