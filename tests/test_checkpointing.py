"""Checkpoints, exact resumption, clean stops and the NaN guard, on real TF."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import threading

import ml_collections
import numpy as np
import pytest
import tensorflow as tf
from conftest import event_scalars, fill, run_train, start_train
from support import steps
from test_train import assert_one_line_error

from xla_mnist import data, model
from xla_mnist.runtime import signals
from xla_mnist.runtime.errors import UsageError, UserError
from xla_mnist.workdir import checkpointing


def make_config(**overrides) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(
    {
      'dataset': 'mnist',
      'model': 'softmax',
      'batch_size': 32,
      'seed': 1,
      'learning_rate': 0.5,
      'checkpoint_every': 0,
      'keep_checkpoints': 3,
      'jit': 'on',
      'cpu_threads': 1,
    }
  )
  config.update(overrides)
  return config


DEVICE = 'CPU:0'
DATA = 'digest of the data source'


def new_run(workdir, config, **kwargs) -> Run:
  """A run that found no checkpoint, ready to save (a save needs a restore
  first: it replaces what the restore found)."""
  run = Run(workdir, config, **kwargs)
  assert run.checkpointer.restore(fresh=False) == 0
  return run


class Run:
  """A model, its optimizer, its step and its checkpointer, as the loop has."""

  def __init__(
    self, workdir, config, net=None, resume_from='', device=DEVICE, data=DATA
  ):
    self.config = config
    self.net = net or model.create_model()
    self.optimizer = tf.keras.optimizers.SGD(config.learning_rate)
    self.optimizer.build(self.net.trainable_variables)
    self.step = steps.train_step(
      self.net, self.optimizer, config.jit, config.batch_size
    )
    self.checkpointer = checkpointing.Checkpointer(
      workdir,
      resume_from or workdir,
      self.net,
      self.optimizer,
      config,
      device,
      data,
    )

  def train(self, split, start, stop):
    batches = data.train_batches(
      split, self.config.batch_size, self.config.seed, start
    )
    for images, labels in batches.take(stop - start):
      self.step(images, labels)

  def state(self) -> list[np.ndarray]:
    return [v.numpy() for v in self.net.weights] + [
      self.optimizer.iterations.numpy()
    ]


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b, strict=True):
    assert np.array_equal(x, y)  # Bit for bit, not approximately.


def test_round_trip_restores_every_value_bit_for_bit(split, tmp_path):
  run = Run(tmp_path, make_config())
  assert run.checkpointer.restore(fresh=False) == 0  # Nothing saved yet.
  run.train(split, 0, 5)
  path = run.checkpointer.save(5, loss=0.25)
  assert os.path.basename(path) == 'ckpt-5'
  assert os.path.dirname(path) == str(tmp_path / 'checkpoints')
  again = Run(tmp_path, make_config())
  assert again.checkpointer.restore(fresh=False) == 5
  assert_same(again.state(), run.state())
  assert again.checkpointer.restored_loss == 0.25


@pytest.mark.parametrize('jit', ['off', 'on'])
@pytest.mark.kernels  # Bit-exact under either kernel family.
def test_resumed_run_ends_with_the_uninterrupted_weights(jit, split, tmp_path):
  straight = Run(tmp_path / 'straight', make_config(jit=jit))
  straight.train(split, 0, 10)
  first = new_run(tmp_path / 'resumed', make_config(jit=jit))
  first.train(split, 0, 6)
  first.checkpointer.save(6)
  second = Run(tmp_path / 'resumed', make_config(jit=jit))
  start = second.checkpointer.restore(fresh=False)
  second.train(split, start, 10)
  assert start == 6
  assert_same(second.state(), straight.state())


def test_resumes_from_another_workdir_and_saves_in_its_own(split, tmp_path):
  # A non-chief worker: the chief's checkpoints in, its own folder out.
  chief = new_run(tmp_path / 'chief', make_config())
  chief.train(split, 0, 4)
  chief.checkpointer.save(4)
  worker = Run(
    tmp_path / 'worker', make_config(), resume_from=tmp_path / 'chief'
  )
  assert worker.checkpointer.restore(fresh=False) == 4
  assert_same(worker.state(), chief.state())
  worker.checkpointer.save(5)
  assert sorted(os.listdir(tmp_path / 'chief' / 'checkpoints')) == sorted(
    [
      *(f'ckpt-4{ext}' for ext in ('.index', '.data-00000-of-00001')),
      'checkpoint',
    ]
  )
  assert 'ckpt-5.index' in os.listdir(tmp_path / 'worker' / 'checkpoints')

  other = Run(
    tmp_path / 'worker', make_config(seed=2), resume_from=tmp_path / 'chief'
  )
  with pytest.raises(
    UsageError, match='chief/checkpoints holds a run with seed'
  ):
    other.checkpointer.restore(fresh=False)


@pytest.mark.parametrize(
  'field, value',
  [
    ('dataset', 'fashion_mnist'),
    ('batch_size', 16),
    ('seed', 2),
    ('learning_rate', 0.1),
    ('jit', 'off'),
    ('cpu_threads', 2),
    ('device', '2 replicas (mirrored)'),
    ('data', 'digest of other files'),  # Other files under the same name.
  ],
)
def test_checkpoint_of_another_config_is_a_usage_error(
  field, value, split, tmp_path
):
  new_run(tmp_path, make_config()).checkpointer.save(3)
  if field in ('device', 'data'):  # What the run found, not config fields.
    other = Run(tmp_path, make_config(), **{field: value})
  else:
    other = Run(tmp_path, make_config(**{field: value}))
  with pytest.raises(UsageError, match=f'with {field} .* fresh=True') as e:
    other.checkpointer.restore(fresh=False)
  assert repr(value) in str(e.value)
  assert e.value.exit_code == 2


def test_checkpoint_of_another_model_shape_is_a_usage_error(tmp_path):
  new_run(tmp_path, make_config()).checkpointer.save(3)
  wider = tf.keras.Sequential(
    [tf.keras.Input((model.NUM_FEATURES,)), tf.keras.layers.Dense(12)]
  )
  other = Run(tmp_path, make_config(), net=wider)
  with pytest.raises(UsageError, match='with model .*10x784.*784x12'):
    other.checkpointer.restore(fresh=False)


def test_fresh_replaces_old_checkpoints_only_at_its_first_save(split, tmp_path):
  old = new_run(tmp_path, make_config())
  for i in (4, 8):
    old.checkpointer.save(i)
  fresh = Run(tmp_path, make_config(seed=2))  # Another run may start here.
  assert fresh.checkpointer.restore(fresh=True) == 0
  # A fresh run that fails before its first save leaves the old run intact.
  assert Run(tmp_path, make_config()).checkpointer.restore(fresh=False) == 8
  fresh.train(split, 0, 2)
  fresh.checkpointer.save(2)
  files = sorted(os.listdir(tmp_path / 'checkpoints'))
  assert files == ['checkpoint', 'ckpt-2.data-00000-of-00001', 'ckpt-2.index']
  resumed = Run(tmp_path, make_config(seed=2))
  assert resumed.checkpointer.restore(fresh=False) == 2
  assert_same(resumed.state(), fresh.state())


def test_keeps_the_latest_checkpoints_only(tmp_path):
  checkpointer = new_run(tmp_path, make_config(keep_checkpoints=2)).checkpointer
  for i in (5, 10, 15):
    checkpointer.save(i)
  files = {name.split('.')[0] for name in os.listdir(tmp_path / 'checkpoints')}
  assert files == {'checkpoint', 'ckpt-10', 'ckpt-15'}


def test_saving_the_same_step_again_leaves_the_latest_untouched(tmp_path):
  checkpointer = new_run(tmp_path, make_config()).checkpointer
  path = checkpointer.save(7)
  index = tmp_path / 'checkpoints' / 'ckpt-7.index'
  before = index.stat()
  assert checkpointer.save(7) == path
  after = index.stat()
  assert (after.st_ino, after.st_mtime_ns) == (
    before.st_ino,
    before.st_mtime_ns,
  )


def checkpoint_bytes(folder) -> dict[str, bytes]:
  """Every checkpoint file under `folder`, by relative path, but the pointer."""
  return {
    str(p.relative_to(folder)): p.read_bytes()
    for p in sorted(folder.rglob('*'))
    if p.is_file() and p.name != 'checkpoint'
  }


def prefixes(folder) -> set[str]:
  return {n.split('.')[0] for n in os.listdir(folder) if n != 'checkpoint'}


def test_files_of_a_killed_write_are_swept_without_a_word(
  split, tmp_path, capsys
):
  """What a save killed before its checkpoint was whole leaves behind: TF's
  temp folder, and the temp files of a state-file update (TF's and ours)."""
  run = new_run(tmp_path, make_config())
  run.train(split, 0, 6)
  run.checkpointer.save(6)
  folder = tmp_path / 'checkpoints'
  garbage = b'\x00partial write\xff' * 10
  (folder / 'ckpt-8_temp').mkdir()
  for name in (
    'ckpt-8_temp/part-00000-of-00001.index',
    'ckpt-8_temp/part-00000-of-00001.data-00000-of-00001',
    'checkpoint.tmp0123456789abcdef0123456789abcdef',
    'tmp1a2b3c4d.tmp',
  ):
    (folder / name).write_bytes(garbage)
  capsys.readouterr()
  resumed = Run(tmp_path, make_config())
  assert resumed.checkpointer.restore(fresh=False) == 6
  assert capsys.readouterr().out == ''  # Nothing is wrong: nothing to say.
  assert_same(resumed.state(), run.state())
  resumed.train(split, 6, 8)
  resumed.checkpointer.save(8)
  assert sorted(os.listdir(folder)) == [
    'checkpoint',
    'ckpt-6.data-00000-of-00001',
    'ckpt-6.index',
    'ckpt-8.data-00000-of-00001',
    'ckpt-8.index',
  ]
  last = Run(tmp_path, make_config())
  assert last.checkpointer.restore(fresh=False) == 8
  assert_same(last.state(), resumed.state())


# What the pointer (the `checkpoint` state file) may hold when it is wrong.
POINTER_FAULTS = {
  'missing': None,
  'empty': b'',
  'garbage': b'\x00\xff\xfenot a checkpoint state\n',
  'truncated': b'model_checkpoint_path: "ckp',
  'a missing prefix': b'model_checkpoint_path: "ckpt-40"\n',
  # A save killed after its checkpoint was whole, before it was named.
  'an older prefix': b'model_checkpoint_path: "ckpt-4"\n',
}


@pytest.mark.parametrize('fault', POINTER_FAULTS)
def test_a_wrong_pointer_resumes_from_the_newest_complete_checkpoint(
  fault, split, tmp_path, capsys
):
  run = new_run(tmp_path, make_config())
  for start, stop in ((0, 4), (4, 8)):
    run.train(split, start, stop)
    run.checkpointer.save(stop, loss=float(stop))
  folder = tmp_path / 'checkpoints'
  pointer = folder / 'checkpoint'
  if POINTER_FAULTS[fault] is None:
    pointer.unlink()
  else:
    pointer.write_bytes(POINTER_FAULTS[fault])
  before = checkpoint_bytes(folder)
  capsys.readouterr()

  resumed = Run(tmp_path, make_config())
  assert resumed.checkpointer.restore(fresh=False) == 8
  assert resumed.checkpointer.restored_loss == 8.0
  assert_same(resumed.state(), run.state())
  [note] = capsys.readouterr().out.splitlines()
  assert note.startswith('note: resuming from ckpt-8, the newest complete')
  assert f'{pointer}' in note and 'now names ckpt-8' in note
  # Repaired, atomically (no temp file left), and TF reads it again.
  assert tf.train.latest_checkpoint(str(folder)) == str(folder / 'ckpt-8')
  assert checkpoint_bytes(folder) == before
  resumed.train(split, 8, 10)
  resumed.checkpointer.save(10)
  assert prefixes(folder) == {'ckpt-4', 'ckpt-8', 'ckpt-10'}  # Keeps 3.


def cut(path) -> None:
  path.write_bytes(path.read_bytes()[:100])


def flip(path) -> None:
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))


DATA, INDEX = 'ckpt-8.data-00000-of-00001', 'ckpt-8.index'
DAMAGES = {
  'data cut': (DATA, cut),
  'data missing': (DATA, os.remove),
  'data bit flipped': (DATA, flip),
  'index cut': (INDEX, cut),
  'index missing': (INDEX, os.remove),
}


@pytest.mark.parametrize('damage', DAMAGES)
def test_a_damaged_newest_checkpoint_is_moved_aside_never_deleted(
  damage, split, tmp_path, capsys
):
  run = new_run(tmp_path, make_config(keep_checkpoints=2))
  run.train(split, 0, 4)
  run.checkpointer.save(4)
  at_4 = run.state()
  run.train(split, 4, 8)
  run.checkpointer.save(8)
  folder = tmp_path / 'checkpoints'
  name, spoil = DAMAGES[damage]
  spoil(folder / name)
  damaged = {k: v for k, v in checkpoint_bytes(folder).items() if '8' in k}
  capsys.readouterr()

  resumed = Run(tmp_path, make_config(keep_checkpoints=2))
  assert resumed.checkpointer.restore(fresh=False) == 4
  assert_same(resumed.state(), at_4)
  [note] = capsys.readouterr().out.splitlines()
  aside = folder / 'damaged-ckpt-8'
  assert note.startswith('note: resuming from ckpt-4, the newest complete')
  assert 'ckpt-8 is damaged (' in note and f'moved to {aside}' in note
  assert 'names ckpt-8, which is damaged: it now names ckpt-4' in note
  # Saves and their sweeps, past the damaged step, never touch it.
  for stop in (6, 8, 9, 12):
    resumed.checkpointer.save(stop)
  assert prefixes(folder) == {'ckpt-9', 'ckpt-12', 'damaged-ckpt-8'}
  kept = {f'damaged-ckpt-8/{k}': v for k, v in damaged.items()}
  assert {k: v for k, v in checkpoint_bytes(folder).items() if '8/' in k} == (
    kept
  )


def test_a_damaged_only_checkpoint_is_named_and_left_as_it_is(tmp_path):
  new_run(tmp_path, make_config()).checkpointer.save(3)
  folder = tmp_path / 'checkpoints'
  cut(folder / 'ckpt-3.data-00000-of-00001')
  before = {**checkpoint_bytes(folder), 'checkpoint': b''}
  before['checkpoint'] = (folder / 'checkpoint').read_bytes()
  with pytest.raises(
    UserError, match='ckpt-3 cannot be restored .* no older one .*fresh=True'
  ):
    Run(tmp_path, make_config()).checkpointer.restore(fresh=False)
  after = {**checkpoint_bytes(folder)}
  after['checkpoint'] = (folder / 'checkpoint').read_bytes()
  assert after == before


def test_a_checkpoint_from_before_the_jit_check_is_refused(tmp_path):
  """As this project wrote them before: TF's CheckpointManager, no loss, a
  fingerprint without jit, device and cpu_threads."""
  config = make_config()
  net = model.create_model()
  optimizer = tf.keras.optimizers.SGD(config.learning_rate)
  optimizer.build(net.trainable_variables)
  old_fields = ('dataset', 'model', 'batch_size', 'seed', 'learning_rate')
  current = checkpointing.fingerprint(net, config, DEVICE, DATA)
  old = tf.train.Checkpoint(
    model=net,
    optimizer=optimizer,
    step=tf.Variable(3, dtype=tf.int64),
    fingerprint=tf.Variable(json.dumps({k: current[k] for k in old_fields})),
  )
  folder = str(tmp_path / 'checkpoints')
  tf.train.CheckpointManager(old, folder, 3, checkpoint_name='ckpt').save(3)
  with pytest.raises(UsageError, match='written before .* recorded jit') as e:
    Run(tmp_path, config).checkpointer.restore(fresh=False)
  assert 'fresh=True' in str(e.value)


def test_failed_save_is_named(tmp_path):
  checkpointer = new_run(tmp_path, make_config()).checkpointer
  (tmp_path / 'checkpoints').write_text('not a folder')
  with pytest.raises(UserError, match='checkpoints .*Not a directory.*DIR'):
    Run(tmp_path, make_config()).checkpointer.restore(fresh=False)
  with pytest.raises(
    UserError, match='cannot save a checkpoint in .*workdir=DIR'
  ):
    checkpointer.save(3)


def test_stop_request_catches_a_real_sigterm_then_steps_aside():
  received = []

  def previous(signum, frame):
    received.append(signum)

  old_int = signal.getsignal(signal.SIGINT)
  old_term = signal.signal(signal.SIGTERM, previous)
  try:
    with signals.StopRequest() as stop:
      assert stop.requested is None
      assert signal.getsignal(signal.SIGTERM) is not previous
      os.kill(os.getpid(), signal.SIGTERM)
      assert stop.requested == 'SIGTERM'
      assert received == []
      # The first signal put the handlers back: a second one acts as usual.
      assert signal.getsignal(signal.SIGTERM) is previous
      os.kill(os.getpid(), signal.SIGTERM)
      assert received == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is old_int
  finally:
    signal.signal(signal.SIGTERM, old_term)


def test_stop_request_restores_handlers_when_no_signal_came():
  before = {s: signal.getsignal(s) for s in signals.StopRequest.SIGNALS}
  with signals.StopRequest():
    pass
  after = {s: signal.getsignal(s) for s in signals.StopRequest.SIGNALS}
  assert after == before


def test_stop_request_outside_the_main_thread_does_nothing():
  outcome = []

  def body():
    with signals.StopRequest() as stop:
      outcome.append(stop.requested)

  thread = threading.Thread(target=body)
  thread.start()
  thread.join()
  assert outcome == [None]


# The CLI: real runs on Fashion-MNIST (hence `slow`), interrupted the ways
# users and schedulers interrupt them.

CLI_STEPS = 300


def cli_args(data_dir, workdir, *extra: str) -> list[str]:
  # Calls of 10 fused steps: kills land between and inside calls; a
  # checkpoint every 25 steps is reached inside calls, not at their ends.
  return [
    '--config=fashion_mnist',
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
    f'--config.num_steps={CLI_STEPS}',
    '--config.steps_per_loop=10',
    '--config.log_every=10',
    '--config.checkpoint_every=25',
    *extra,
  ]


def interrupt(args: list[str], after_step: int, signum: int):
  """Starts a run, sends `signum` once it logged `after_step`, waits."""
  proc = start_train(*args)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    match = re.match(r'step +(\d+)/', line)
    if match and int(match.group(1)) >= after_step:
      proc.send_signal(signum)
      break
  out, err = proc.communicate(timeout=120)
  return subprocess.CompletedProcess(
    proc.args, proc.returncode, ''.join(lines) + out, err
  )


def final_state(workdir) -> dict[str, np.ndarray]:
  """Every value of the workdir's latest checkpoint but the save counter."""
  reader = tf.train.load_checkpoint(
    tf.train.latest_checkpoint(str(workdir / 'checkpoints'))
  )
  return {
    key: reader.get_tensor(key)
    for key in reader.get_variable_to_shape_map()
    if not key.startswith(('save_counter', '_CHECKPOINTABLE'))
  }


def assert_same_checkpoint(workdir, reference) -> None:
  state, expected = final_state(workdir), final_state(reference)
  assert state.keys() == expected.keys()
  for key, value in expected.items():
    assert np.array_equal(state[key], value), key
  assert int(state['step/.ATTRIBUTES/VARIABLE_VALUE']) == CLI_STEPS


def assert_same_result(workdir, reference) -> None:
  result, expected = (
    json.loads((w / 'result.json').read_text()) for w in (workdir, reference)
  )
  assert result['final_loss'] == expected['final_loss']
  assert result['test_accuracy'] == expected['test_accuracy']


@pytest.fixture(scope='module')
def straight_run(fashion_data_dir, tmp_path_factory):
  """The uninterrupted run that interrupted ones must match bit for bit."""
  workdir = tmp_path_factory.mktemp('straight')
  proc = run_train(*cli_args(fashion_data_dir, workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


@pytest.mark.slow
def test_runs_killed_at_random_steps_resume_to_identical_weights(
  straight_run, fashion_data_dir, tmp_path
):
  args = cli_args(fashion_data_dir, tmp_path)
  # From step 60 on, a checkpoint (25 or 50) exists when the kill comes.
  kills = sorted(random.sample(range(60, CLI_STEPS - 30, 10), 2))
  for after in kills:
    proc = interrupt(args, after, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, (kills, proc.stdout[-2000:])
  proc = run_train(*args)
  assert proc.returncode == 0, (kills, proc.stderr[-3000:])
  assert 'resuming at step' in proc.stdout
  assert_same_checkpoint(tmp_path, straight_run)
  assert_same_result(tmp_path, straight_run)


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_then_exits_128_plus_its_number_with_one_line(
  signum, straight_run, fashion_data_dir, tmp_path
):
  args = cli_args(fashion_data_dir, tmp_path)
  proc = interrupt(args, 120, signum)
  # Saved, but not finished: a scheduler must not take it for done.
  assert proc.returncode == 128 + signum, proc.stderr[-3000:]
  said = [
    line
    for line in (proc.stdout + proc.stderr).splitlines()
    if signum.name in line
  ]
  assert len(said) == 1, proc.stdout + proc.stderr
  assert 'Traceback' not in proc.stderr
  stopped = int(re.search(r'step (\d+)', said[0]).group(1))
  assert 120 <= stopped < CLI_STEPS
  state = final_state(tmp_path)
  assert int(state['step/.ATTRIBUTES/VARIABLE_VALUE']) == stopped
  assert not (tmp_path / 'result.json').exists()
  proc = run_train(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert_same_checkpoint(tmp_path, straight_run)
  assert_same_result(tmp_path, straight_run)


@pytest.mark.slow
def test_checkpoint_of_another_config_is_refused_in_one_line(
  straight_run, fashion_data_dir, tmp_path
):
  shutil.copytree(straight_run / 'checkpoints', tmp_path / 'checkpoints')
  proc = run_train(*cli_args(fashion_data_dir, tmp_path, '--config.seed=2'))
  assert_one_line_error(proc, 2, 'with seed 1', 'has 2', '--fresh')


def copy_run(run, workdir) -> list[str]:
  """Copies `run`'s checkpoints and event files; returns the files' names."""
  shutil.copytree(run / 'checkpoints', workdir / 'checkpoints')
  events = [p.name for p in run.glob('events.out.tfevents.*')]
  for name in events:
    shutil.copy(run / name, workdir / name)
  return events


@pytest.mark.slow
def test_fresh_run_that_diverges_names_the_fix_and_keeps_the_old_run(
  straight_run, fashion_data_dir, tmp_path
):
  old_events = copy_run(straight_run, tmp_path)
  # Softmax regression diverges to NaN only when W x overflows float32.
  diverging = cli_args(
    fashion_data_dir, tmp_path, '--config.learning_rate=3e38'
  )
  proc = run_train(*diverging, '--fresh')  # Without it: a config conflict.
  assert_one_line_error(
    proc, 1, 'loss is nan at step', 'lower --config.learning_rate (now 3e+38)'
  )
  # It failed before its first checkpoint: the old run is still there.
  assert_same_checkpoint(tmp_path, straight_run)
  assert all(os.path.exists(tmp_path / name) for name in old_events)


@pytest.mark.slow
def test_fresh_run_replaces_the_old_runs_events_at_its_first_save(
  straight_run, fashion_data_dir, tmp_path
):
  old_events = copy_run(straight_run, tmp_path)
  assert old_events
  other_recipe = cli_args(fashion_data_dir, tmp_path, '--config.seed=2')
  proc = run_train(*other_recipe, '--fresh')
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not any(os.path.exists(tmp_path / name) for name in old_events)
  # TensorBoard's own reader: one loss per logged step, the new run's.
  assert logged_steps(tmp_path) == list(range(10, CLI_STEPS + 1, 10))


def logged_steps(workdir) -> list[int]:
  """The steps of every train/loss point in the workdir, as TensorBoard's
  own reader finds them (repeats included)."""
  return [step for step, _ in event_scalars(str(workdir), 'train/loss')]


@pytest.mark.slow
def test_a_kill_9_loses_no_logged_loss_up_to_the_restored_step(
  straight_run, fashion_data_dir, tmp_path
):
  args = cli_args(fashion_data_dir, tmp_path)
  after = random.choice(range(60, CLI_STEPS - 30, 10))
  proc = interrupt(args, after, signal.SIGKILL)
  assert proc.returncode == -signal.SIGKILL, (after, proc.stdout[-2000:])
  saved = int(final_state(tmp_path)['step/.ATTRIBUTES/VARIABLE_VALUE'])
  # What the checkpoint holds is in the event files already.
  assert set(range(10, saved + 1, 10)) <= set(logged_steps(tmp_path)), after
  proc = run_train(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert set(logged_steps(tmp_path)) == set(range(10, CLI_STEPS + 1, 10))
  assert_same_checkpoint(tmp_path, straight_run)


@pytest.mark.slow
@pytest.mark.parametrize(
  'flag, field, stored, given',
  [
    ('--jit=off', 'jit', "'on'", "'off'"),
    ('--config.cpu_threads=2', 'cpu_threads', '1', '2'),
  ],
)
def test_a_resume_that_changes_the_trajectory_is_refused_in_one_line(
  flag, field, stored, given, straight_run, fashion_data_dir, tmp_path
):
  shutil.copytree(straight_run / 'checkpoints', tmp_path / 'checkpoints')
  before = checkpoint_bytes(tmp_path / 'checkpoints')
  proc = run_train(*cli_args(fashion_data_dir, tmp_path, flag))
  assert_one_line_error(
    proc, 2, f'with {field} {stored}', f'has {given}', '--fresh'
  )
  assert checkpoint_bytes(tmp_path / 'checkpoints') == before


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_resumes_from_the_one_before_exactly(
  straight_run, fashion_data_dir, tmp_path
):
  """Also in calls of another length: the steps do not change with it."""
  folder = tmp_path / 'checkpoints'
  shutil.copytree(straight_run / 'checkpoints', folder)
  cut(folder / 'ckpt-300.data-00000-of-00001')
  damaged = (folder / 'ckpt-300.data-00000-of-00001').read_bytes()
  proc = run_train(
    *cli_args(fashion_data_dir, tmp_path, '--config.steps_per_loop=7')
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  [note] = [line for line in proc.stdout.splitlines() if 'note:' in line]
  assert note.startswith('note: resuming from ckpt-280, the newest complete')
  assert 'ckpt-300 is damaged' in note
  aside = folder / 'damaged-ckpt-300' / 'ckpt-300.data-00000-of-00001'
  assert aside.read_bytes() == damaged
  assert 'resuming at step 280' in proc.stdout
  assert_same_checkpoint(tmp_path, straight_run)
  assert_same_result(tmp_path, straight_run)


@pytest.mark.slow
def test_a_garbled_pointer_and_a_lost_result_give_the_restored_figures(
  straight_run, fashion_data_dir, tmp_path
):
  """A run killed between its last save and its result, pointer spoiled."""
  folder = tmp_path / 'checkpoints'
  shutil.copytree(straight_run / 'checkpoints', folder)
  (folder / 'checkpoint').write_bytes(b'\x00garbage\xff')
  before = checkpoint_bytes(folder)
  proc = run_train(*cli_args(fashion_data_dir, tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'note: resuming from ckpt-300, the newest complete' in proc.stdout
  assert 'holds step 300 of 300 but no result.json' in proc.stdout
  assert checkpoint_bytes(folder) == before
  assert_same_result(tmp_path, straight_run)  # Loss restored, accuracy redone.
  text = (tmp_path / 'result.json').read_text()
  result = json.loads(text, parse_constant=lambda c: pytest.fail(c))
  for name in ('compile_seconds', 'train_seconds', 'steps_per_second'):
    assert result[name] is None, name
  assert 'compile not measured' in proc.stdout
  assert '| speed | not measured |' in (tmp_path / 'report.md').read_text()
  proc = run_train(*cli_args(fashion_data_dir, tmp_path))  # Now finished.
  assert proc.returncode == 0 and 'holds this finished run' in proc.stdout


def fill_up(folder) -> None:
  """`fill`, which also raises ENOSPC as it closes its file on the full
  disk (the file's buffer flushes again): the disk is full either way."""
  with contextlib.suppress(OSError):
    fill(folder)
  assert shutil.disk_usage(folder).free == 0


def named_checkpoints(folder) -> dict[str, bytes]:
  """The files of the checkpoints the pointer names: complete by then."""
  state = tf.train.get_checkpoint_state(str(folder))
  names = {os.path.basename(p) for p in state.all_model_checkpoint_paths}
  return {
    k: v
    for k, v in checkpoint_bytes(folder).items()
    if k.split('.')[0] in names
  }


@pytest.mark.slow
def test_a_disk_that_fills_during_a_save_loses_no_checkpoint(
  straight_run, fashion_data_dir, tmp_path, small_disk
):
  folder = small_disk('checkpoints', 512)  # The workdir's, alone.
  args = cli_args(fashion_data_dir, tmp_path)
  proc = start_train(*args)
  for line in proc.stdout:
    match = re.match(r'step +(\d+)/', line)
    if match and int(match.group(1)) >= 100:
      proc.send_signal(signal.SIGSTOP)  # Wherever it is, a save included.
      break
  named = named_checkpoints(tmp_path / 'checkpoints')
  fill_up(folder)
  proc.send_signal(signal.SIGCONT)
  out, err = proc.communicate(timeout=120)
  proc = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
  assert_one_line_error(
    proc, 1, 'cannot save a checkpoint in', 'No space left', 'free space'
  )
  assert named_checkpoints(tmp_path / 'checkpoints') == named
  # Nothing half-written is left.
  left = set(os.listdir(folder)) - {'filler', 'checkpoint'}
  assert {name.split('.')[0] for name in left} == {
    name.split('.')[0] for name in named
  }
  os.remove(os.path.join(folder, 'filler'))
  proc = run_train(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert_same_checkpoint(tmp_path, straight_run)


@pytest.mark.slow
def test_a_full_disk_for_the_events_is_one_line_and_keeps_the_checkpoints(
  straight_run, fashion_data_dir, tmp_path, small_disk
):
  workdir = small_disk('run', 512)
  shutil.copytree(straight_run / 'checkpoints', f'{workdir}/checkpoints')
  before = checkpoint_bytes(tmp_path / 'run' / 'checkpoints')
  fill_up(workdir)
  # One page free: the workdir's lock writes its process id there first.
  filler = os.path.join(workdir, 'filler')
  os.truncate(filler, os.path.getsize(filler) - 4096)
  proc = run_train(*cli_args(fashion_data_dir, workdir))
  assert_one_line_error(
    proc, 1, 'cannot write the TensorBoard events into', 'No space left'
  )
  assert checkpoint_bytes(tmp_path / 'run' / 'checkpoints') == before


@pytest.mark.slow
def test_a_result_that_cannot_be_written_is_one_line(
  straight_run, fashion_data_dir, tmp_path
):
  shutil.copytree(straight_run / 'checkpoints', tmp_path / 'checkpoints')
  (tmp_path / 'result.json' / 'in the way').mkdir(parents=True)
  proc = run_train(*cli_args(fashion_data_dir, tmp_path))
  assert_one_line_error(proc, 1, 'cannot write the result into', 'directory')


@pytest.mark.slow
def test_a_read_only_workdir_is_one_line(
  straight_run, fashion_data_dir, tmp_path, small_disk
):
  workdir = small_disk('run', 512)
  shutil.copytree(straight_run / 'checkpoints', f'{workdir}/checkpoints')
  before = checkpoint_bytes(tmp_path / 'run' / 'checkpoints')
  subprocess.run(['mount', '-o', 'remount,ro', workdir], check=True)
  proc = run_train(*cli_args(fashion_data_dir, workdir))
  assert_one_line_error(proc, 1, 'cannot be written', 'Read-only')
  assert checkpoint_bytes(tmp_path / 'run' / 'checkpoints') == before


def test_restore_model_reads_the_newest_whole_checkpoint_of_its_recipe(
  split, tmp_path
):
  run = new_run(tmp_path, make_config())
  run.train(split, 0, 3)
  run.checkpointer.save(3)
  (tmp_path / 'checkpoints' / 'checkpoint').write_text('garbage')
  net = model.create_model()
  path = checkpointing.restore_model(net, str(tmp_path), make_config())
  assert path.endswith('ckpt-3')
  assert_same([v.numpy() for v in net.weights], run.state()[:-1])
  # It only reads: the damaged pointer is left for a resume to repair.
  assert (tmp_path / 'checkpoints' / 'checkpoint').read_text() == 'garbage'


def test_restore_model_refuses_a_checkpoint_of_another_recipe(tmp_path):
  new_run(tmp_path, make_config()).checkpointer.save(3)
  with pytest.raises(UsageError, match='with batch_size 32, .* has 16') as e:
    checkpointing.restore_model(
      model.create_model(), str(tmp_path), make_config(batch_size=16)
    )
  assert e.value.exit_code == 2
  with pytest.raises(UserError, match='holds no complete checkpoint'):
    checkpointing.restore_model(
      model.create_model(), str(tmp_path / 'elsewhere')
    )
