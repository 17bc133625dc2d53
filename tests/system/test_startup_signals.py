"""Stop signals at every moment of a command's start-up, and a closed stdout:
one line on stderr, exit 128 + N, no traceback, nothing half-written. Real
processes, signalled at a cue of the moment (a marker line, a file that
appears), not after a guessed sleep. (Signals while training: the CLI tests
of test_resume.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from support.cli import FASHION, REPO, run_train
from support.idx import require_fashion_mnist

from xla_mnist.datasets import idx_builder, prepare
from xla_mnist.runtime import errors, streams
from xla_mnist.workdir import files

# Runs a command line as `python -m` does, printing `marker` to stdout as the
# import of module `argv[1]` begins: the moment to signal.
LAUNCH = """
import os, runpy, sys
module, mark = sys.argv.pop(1), sys.argv.pop(1)
def hook(event, args):
  if event == 'import' and args[0] == mark:
    os.write(1, b'marker\\n')
import signal
# As nohup starts it, or as a terminal does, however the tests were started.
ignore = len(sys.argv) > 1 and sys.argv[1] == '--ignore-sighup'
signal.signal(signal.SIGHUP, signal.SIG_IGN if ignore else signal.SIG_DFL)
if ignore:
  sys.argv.pop(1)
sys.addaudithook(hook)
sys.argv[0] = module
runpy.run_module(module, run_name='__main__', alter_sys=True)
"""


def launch(module: str, mark: str, *args: str, **env: str) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, '-c', LAUNCH, module, mark, *args],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env={**os.environ, 'PYTHONUNBUFFERED': '1', **env},
  )


def start(module: str, *args: str, **env: str) -> subprocess.Popen:
  """`python -m module args`, its output unbuffered."""
  return subprocess.Popen(
    [sys.executable, '-m', module, *args],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env={**os.environ, 'PYTHONUNBUFFERED': '1', **env},
  )


def wait_for_marker(proc: subprocess.Popen) -> None:
  for line in proc.stdout:
    if line == 'marker\n':
      return
  raise AssertionError(f'no marker: {proc.communicate()}')


def wait_for_path(path, proc: subprocess.Popen) -> None:
  """Polls until `path` exists; fails if the process ends first."""
  while not os.path.exists(path):
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.01)


def assert_interrupted(proc: subprocess.Popen, signum: int) -> str:
  """Exit 128 + `signum`, and one line on stderr naming the signal."""
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 128 + signum, stderr
  lines = stderr.splitlines()
  assert len(lines) == 1, stderr
  assert lines[0].startswith(
    f'error: interrupted by {signal.Signals(signum).name}: '
  ), stderr
  return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
  'signum', errors.STOP_SIGNALS, ids=lambda s: signal.Signals(s).name
)
def test_a_signal_during_the_tensorflow_import_ends_train_in_one_line(
  signum, tmp_path
):
  proc = launch(
    'xla_mnist.train', 'tensorflow', FASHION, f'--workdir={tmp_path / "run"}'
  )
  wait_for_marker(proc)  # TF's import, seconds long, has begun.
  proc.send_signal(signum)
  line = assert_interrupted(proc, signum)
  assert line.endswith('stopped while starting, nothing saved')
  assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_sighup_the_process_was_started_ignoring_stays_ignored(tmp_path):
  proc = launch(
    'xla_mnist.train',
    'tensorflow',
    '--ignore-sighup',
    FASHION,
    f'--workdir={tmp_path / "run"}',
  )
  wait_for_marker(proc)
  proc.send_signal(signal.SIGHUP)  # nohup's promise: no effect.
  proc.send_signal(signal.SIGTERM)
  assert_interrupted(proc, signal.SIGTERM)


def test_a_signal_while_compare_starts_ends_it_in_one_line(tmp_path):
  proc = launch(
    'xla_mnist.compare',
    'xla_mnist.workdir.outputs',
    f'--workdir={tmp_path / "cmp"}',
  )
  wait_for_marker(proc)
  proc.send_signal(signal.SIGTERM)
  assert_interrupted(proc, signal.SIGTERM)
  assert list(tmp_path.iterdir()) == []


def only_empty_folders(folder) -> bool:
  return not folder.exists() or all(p.is_dir() for p in folder.rglob('*'))


@pytest.mark.slow
def test_a_signal_during_data_preparation_leaves_no_part_of_it(tmp_path):
  require_fashion_mnist()
  data_dir, workdir = tmp_path / 'tfds', tmp_path / 'run'
  proc = start(
    'xla_mnist.train',
    FASHION,
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
  )
  # Taken as the preparation starts; preparing 70,000 images takes seconds.
  wait_for_path(data_dir / prepare.PREPARE_LOCK, proc)
  proc.send_signal(signal.SIGTERM)
  assert_interrupted(proc, signal.SIGTERM)
  builder = idx_builder.IdxMnist(config='fashion_mnist', data_dir=data_dir)
  assert not builder.is_prepared()
  # TFDS's own folders and `.config` metadata at most: no record, no lock.
  left = [p for p in data_dir.rglob('*') if p.is_file()]
  assert all('.config' in p.parts for p in left), left
  assert only_empty_folders(workdir)  # The workdir's lock is gone too.


@pytest.mark.slow
def test_a_signal_during_the_first_compile_ends_train_before_any_save(
  fashion_data_dir, tmp_path
):
  dumps, workdir = tmp_path / 'xla', tmp_path / 'run'
  proc = start(
    'xla_mnist.train',
    FASHION,
    f'--data_dir={fashion_data_dir}',
    f'--workdir={workdir}',
    # XLA writes a module's first dump file as it starts compiling it.
    XLA_FLAGS=f'--xla_dump_to={dumps}',
  )
  while not (dumps.is_dir() and any(dumps.iterdir())):
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.01)
  proc.send_signal(signal.SIGINT)
  line = assert_interrupted(proc, signal.SIGINT)
  assert 'before a checkpoint was saved' in line
  # The run's TensorBoard file only (docs/resume.md): no checkpoint, no
  # result, no lock, no temporary file.
  left = sorted(p.name for p in workdir.rglob('*'))
  assert all(name.startswith('events.out.tfevents.') for name in left), left


@pytest.mark.slow
def test_a_signal_to_compare_stops_its_run_after_a_save(
  fashion_data_dir, tmp_path
):
  workdir = tmp_path / 'cmp'
  proc = start(
    'xla_mnist.compare',
    FASHION,
    f'--data_dir={fashion_data_dir}',
    f'--workdir={workdir}',
    '--config.num_steps=100000',
    '--config.checkpoint_every=100',
  )
  # The first mode's run has trained and saved: it is in its loop.
  wait_for_path(workdir / 'off' / 'checkpoints' / 'checkpoint', proc)
  proc.send_signal(signal.SIGINT)  # Only to compare, as `kill -INT` does.
  line = assert_interrupted(proc, signal.SIGINT)
  assert 'the off run stopped (exit 130)' in line
  assert not any((workdir / name).exists() for name in ('compare.md', 'on'))
  assert not (workdir / 'off' / files.LOCK_FILE).exists()


@pytest.mark.slow
def test_a_closed_stdout_ends_train_in_one_line(fashion_data_dir, tmp_path):
  proc = start(
    'xla_mnist.train',
    FASHION,
    f'--data_dir={fashion_data_dir}',
    f'--workdir={tmp_path / "run"}',
    '--config.num_steps=100000',
    '--config.steps_per_loop=1',
    '--config.log_every=1',
  )
  proc.stdout.readline()  # As `| head -1` does, then goes away.
  proc.stdout.close()
  stderr = proc.stderr.read()
  proc.wait(timeout=300)
  assert proc.returncode == streams.BROKEN_PIPE_EXIT, stderr
  assert len(stderr.splitlines()) == 1, stderr
  assert stderr.startswith('error: stdout was closed (broken pipe)'), stderr
  assert not (tmp_path / 'run' / files.LOCK_FILE).exists()


@pytest.mark.slow
def test_a_profiler_port_says_at_start_that_it_is_open_to_the_network(
  tmp_path,
):
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  # Fails on its data after TF's import: the start line was printed.
  proc = run_train(
    FASHION,
    f'--profiler_port={port}',
    f'--config.idx_dir={tmp_path / "none"}',
    f'--workdir={tmp_path / "run"}',
  )
  assert proc.returncode == 1, proc.stderr
  assert proc.stdout.splitlines()[0] == (
    f'profiler port {port} is open to the network: on every interface,'
    ' without authentication; on a shared machine, close it to others with'
    ' a firewall (docs/profiling.md)'
  )
