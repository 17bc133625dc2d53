"""The Python API in a process of its own keeps the command line's
promises: the pre-TF layer imports no TensorFlow, the config is checked as
the CLI does, auto-clustering applied or refused, a notebook's process
prepared as the command's, a quiet run prints nothing, and a finished run
says what it holds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from support.cli import REPO, run_train
from support.events import event_scalars
from support.idx import make_idx_folder

from xla_mnist.configs import default
from xla_mnist.runtime.errors import UsageError

# What the CLI imports before it has checked its flags and config.
PRE_TF = (
  'train',
  'compare',
  'aot',
  'config',
  'parse',
  'loop',
  'runtime.console',
  'runtime.env',
  'runtime.errors',
  'runtime.process',
  'runtime.tf_config',
  'runtime.xla_cache',
  'workdir.files',
  'workdir.outputs',
  'workdir.recorded',
  'inspection.why',
  'inspection.by_field',
  'inspection.breakdown',
  'inspection.comparison',
  'export.classifier',
)


def test_the_pre_tf_layer_imports_no_tensorflow():
  modules = ', '.join(f'xla_mnist.{m}' for m in PRE_TF)
  script = f'import sys, {modules}; print(json.dumps(sorted(sys.modules)))'
  proc = subprocess.run(
    [sys.executable, '-c', f'import json; {script}'],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=True,
  )
  loaded = json.loads(proc.stdout)
  assert not [m for m in loaded if m.split('.')[0] == 'tensorflow']
  assert 'xla_mnist.train' in loaded


def small(folder: str, **overrides):
  config = default.get_config()
  config.update(
    idx_dir=folder, num_steps=20, batch_size=20, log_every=10,
    checkpoint_every=0, profile_steps=0,
  )  # fmt: skip
  config.update(overrides)
  import tensorflow as tf  # The threads of this process (see test_trainer).

  config.cpu_threads = tf.config.threading.get_intra_op_parallelism_threads()
  return config


@pytest.mark.parametrize(
  'field, value',
  [('learning_rate', -5.0), ('batch_size', 0), ('jit', 'bogus')],
)
def test_the_api_checks_its_config_as_the_cli_does(tmp_path, field, value):
  from xla_mnist import trainer

  folder = str(tmp_path / 'idx')
  workdir = tmp_path / 'run'
  with pytest.raises(UsageError) as error:
    trainer.train_and_evaluate(
      small(folder, **{field: value}), str(workdir), str(tmp_path / 'tfds')
    )
  assert not workdir.exists()  # Refused before anything was written.
  proc = run_train(f'--config.{field}={value}', f'--workdir={workdir}')
  assert proc.returncode == 2
  assert proc.stderr.splitlines() == [
    f'error: {error.value}'.replace('config.', '--config.')
  ]


@pytest.mark.parametrize(
  'override',
  [
    '--config.cpu_threads=100000',
    '--config.num_cpu_devices=100000',
    '--config.steps_per_loop=2000000000',
  ],
)
def test_numbers_beyond_the_machine_are_one_line_exit_2(tmp_path, override):
  proc = run_train(
    override, '--config.num_steps=100000000000', f'--workdir={tmp_path}/w'
  )
  assert proc.returncode == 2, proc.stderr
  (line,) = proc.stderr.splitlines()
  assert line.startswith('error: ') and override.split('=')[0] in line


def test_a_port_that_is_none_is_refused_by_the_api(tmp_path):
  from xla_mnist import trainer

  for port in (70000, -1, '6009'):
    with pytest.raises(UsageError, match='profiler_port=.* is no port'):
      trainer.train_and_evaluate(
        small(str(tmp_path)), str(tmp_path / 'run'), str(tmp_path),
        profiler_port=port,
      )  # fmt: skip
  assert not (tmp_path / 'run').exists()


TWO_RUNS = """
import json, sys
from xla_mnist import trainer
from xla_mnist.configs import default
from xla_mnist.runtime.errors import UsageError
folder, out = sys.argv[1], sys.argv[2]
def run(name, **fields):
  config = default.get_config()
  config.update(idx_dir=folder, num_steps=20, batch_size=20, log_every=10,
                checkpoint_every=0, profile_steps=5, **fields)
  try:
    r = trainer.train_and_evaluate(config, f'{out}/{name}', f'{out}/tfds',
                                   quiet=True).result
  except UsageError as e:
    return str(e)
  return r.profile['fusions']
print(json.dumps([run('auto', jit='auto'), run('off', jit='off'),
                  run('threads', jit='off', cpu_threads=2),
                  run('dumps', jit='auto', dump_hlo=True)]))
"""


@pytest.mark.slow
def test_the_api_applies_auto_clustering_or_refuses_what_tf_fixed(tmp_path):
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  proc = subprocess.run(
    [sys.executable, '-c', textwrap.dedent(TWO_RUNS), folder, str(tmp_path)],
    cwd=REPO, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  auto, off, threads, dumps = json.loads(proc.stdout.splitlines()[-1])
  assert auto > 0  # XLA clusters ran, as the command's --jit=auto.
  assert off == 0  # The earlier run's clustering stays out of jit='off'.
  assert 'config.cpu_threads=2 cannot apply' in threads
  assert 'new process' in threads and '--' not in threads
  assert not (tmp_path / 'threads').exists()  # Nothing recorded.
  assert 'process.prepare(config, ' in dumps and 'new process' in dumps
  assert not (tmp_path / 'dumps').exists()


PREPARED = """
import json, os, sys
from xla_mnist.configs import default
from xla_mnist.runtime import process
from xla_mnist.runtime.errors import UsageError
folder, out = sys.argv[1], sys.argv[2]
config = default.get_config()
config.update(idx_dir=folder, num_steps=20, batch_size=20, log_every=10,
              checkpoint_every=0, profile_steps=0, jit='auto', dump_hlo=True)
cache = process.prepare(config, f'{out}/run', xla_cache_dir=f'{out}/cache')
from xla_mnist import trainer
trained = trainer.train_and_evaluate(config, f'{out}/run', f'{out}/tfds',
                                     quiet=True)
try:
  process.prepare(config, f'{out}/run')
  late = ''
except UsageError as e:
  late = str(e)
print(json.dumps([cache.directory, trained.result.steps, late]))
"""


@pytest.mark.slow
def test_a_notebook_prepares_its_process_as_the_command_does(tmp_path):
  """`process.prepare` before TF's import is what the command calls: with
  `jit='auto'` and `dump_hlo`, the clusters are dumped into the workdir
  (refused without it, above); no cache is used, since dumps need compiles;
  once TF has started, the call is refused rather than ignored."""
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ('XLA_FLAGS', 'TF_XLA_FLAGS')
  }
  proc = subprocess.run(
    [sys.executable, '-c', textwrap.dedent(PREPARED), folder, str(tmp_path)],
    cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  cache, steps, late = json.loads(proc.stdout.splitlines()[-1])
  assert cache == '' and steps == 20
  assert os.listdir(tmp_path / 'run' / 'clusters' / 'xla')  # XLA's HLO.
  assert 'has started' in late and 'before importing TensorFlow' in late


@pytest.mark.slow
def test_a_finished_run_says_the_steps_it_holds(tmp_path):
  folder, workdir = str(tmp_path / 'idx'), str(tmp_path / 'run')
  make_idx_folder(folder)
  common = (f'--config.idx_dir={folder}', f'--workdir={workdir}',
            f'--data_dir={tmp_path}/tfds', '--config.profile_steps=0',
            '--config.batch_size=20', '--xla_cache_dir=')  # fmt: skip
  assert run_train(*common, '--config.num_steps=30').returncode == 0
  proc = run_train(*common, '--config.num_steps=20')
  assert proc.returncode == 0, proc.stderr
  last = proc.stdout.splitlines()[-1]
  assert 'holds a finished run of 30 steps' in last
  assert '--config.num_steps=20' in last and '--fresh' in last
  assert '(20 steps)' not in proc.stdout
  proc = run_train(*common, '--config.num_steps=30')
  assert 'holds this finished run (30 steps)' in proc.stdout.splitlines()[-1]
  # A longer run whose result.json was never written (a kill): the
  # shorter run's result is not shown as the longer one's.
  shutil.copy(f'{workdir}/result.json', tmp_path / 'short.json')
  assert run_train(*common, '--config.num_steps=40').returncode == 0
  shutil.copy(tmp_path / 'short.json', f'{workdir}/result.json')
  proc = run_train(*common, '--config.num_steps=40')
  assert proc.returncode == 0, proc.stderr
  assert 'holds step 40 of 40 but no result.json' in proc.stdout
  with open(os.path.join(workdir, 'result.json')) as f:
    assert json.load(f)['steps'] == 40


# What TensorFlow's libraries print as they load is theirs, not the run's:
# the marker separates the two.
MARKER = '-- the run starts --'


QUIET_RUN = f"""
import sys
from xla_mnist import trainer
from xla_mnist.configs import default

print({MARKER!r}, flush=True)
print({MARKER!r}, file=sys.stderr, flush=True)

config = default.get_config()
config.update(
  dataset='fashion_mnist', idx_dir=sys.argv[1], num_steps=30, batch_size=20,
  log_every=10, profile_steps=5,
)
trainer.train_and_evaluate(config, sys.argv[2], sys.argv[3], quiet=True)
"""


@pytest.mark.slow
def test_a_quiet_run_prints_nothing_and_writes_its_outputs(
  idx_folder, tmp_path
):
  folder, _ = idx_folder
  workdir = str(tmp_path / 'run')
  # As a notebook's kernel runs it, with TF's own C++ log off.
  proc = subprocess.run(
    [sys.executable, '-c', QUIET_RUN, folder, workdir, str(tmp_path / 'd')],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'},
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  out, err = (t.split(MARKER + '\n', 1)[1] for t in (proc.stdout, proc.stderr))
  assert (out, err) == ('', '')
  with open(os.path.join(workdir, 'result.json')) as f:
    assert json.load(f)['steps'] == 30
  assert [s for s, _ in event_scalars(workdir, 'train/loss')] == [10, 20, 30]
