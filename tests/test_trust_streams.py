"""The standard streams, the environment TF reads, and workers that never
come: one line on stderr (where stderr can be written), the documented
exit code, and nothing lost. Real processes, real descriptors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, make_idx_folder

from xla_mnist import streams


def train(tmp_path, *args: str, stdout=None, stderr=None, **env: str):
  """`python -m xla_mnist.train` on tiny IDX data, with the given streams
  (a descriptor, a file object, or None for a pipe)."""
  folder = tmp_path / 'idx'
  if not folder.exists():
    make_idx_folder(str(folder))
  return subprocess.run(
    [
      sys.executable, '-m', 'xla_mnist.train', '--config=fashion_mnist',
      f'--config.idx_dir={folder}', f'--data_dir={tmp_path / "tfds"}',
      f'--workdir={tmp_path / "run"}', '--config.num_steps=20',
      '--config.log_every=5', *args,
    ],
    cwd=REPO,
    stdout=subprocess.PIPE if stdout is None else stdout,
    stderr=subprocess.PIPE if stderr is None else stderr,
    timeout=300,
    env={**os.environ, **env},
    close_fds=True,
  )  # fmt: skip


def one_line(stderr: bytes) -> str:
  lines = stderr.decode().splitlines()
  assert len(lines) == 1, stderr.decode()
  assert lines[0].startswith('error: '), lines
  return lines[0]


def closing(fd: int) -> subprocess.Popen:
  """`fd` closed in the child, as a shell's `>&-` does."""
  return lambda: os.close(fd)


@pytest.mark.slow
@pytest.mark.parametrize('fd, name', [(1, 'stdout'), (2, 'stderr')])
def test_a_stream_closed_at_start_is_refused_before_any_work(
  tmp_path, fd, name
):
  args = [
    sys.executable, '-m', 'xla_mnist.train', '--config=fashion_mnist',
    f'--workdir={tmp_path / "run"}',
  ]  # fmt: skip
  proc = subprocess.run(
    args, cwd=REPO, capture_output=True, timeout=120,
    preexec_fn=closing(fd),
  )  # fmt: skip
  assert proc.returncode == streams.IO_ERROR_EXIT, proc.stderr
  if name == 'stdout':
    assert one_line(proc.stderr) == (
      'error: stdout is closed: give the command a stdout (> run.log, or'
      ' > /dev/null to drop its lines)'
    )
  else:  # Nowhere to say it: the exit code does.
    assert proc.stdout == b''
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_a_full_stdout_stops_with_a_checkpoint_in_one_line(tmp_path):
  with open('/dev/full', 'w') as full:
    proc = train(tmp_path, stdout=full)
  line = one_line(proc.stderr)
  assert proc.returncode == streams.IO_ERROR_EXIT, line
  assert line.startswith(
    'error: stdout cannot be written (No space left on device): stopped after'
    ' step 20 with a checkpoint'
  ), line
  assert 'run the same command to resume' in line
  assert (tmp_path / 'run' / 'checkpoints' / 'checkpoint').exists()
  # And the same command, given a stdout, finishes the run from there.
  again = train(tmp_path)
  assert again.returncode == 0, again.stderr.decode()
  assert (tmp_path / 'run' / 'result.json').exists()


@pytest.mark.slow
def test_a_pipe_closed_midway_stops_with_a_checkpoint(tmp_path):
  folder = tmp_path / 'idx'
  make_idx_folder(str(folder))
  proc = subprocess.Popen(
    [
      sys.executable, '-m', 'xla_mnist.train', '--config=fashion_mnist',
      f'--config.idx_dir={folder}', f'--data_dir={tmp_path / "tfds"}',
      f'--workdir={tmp_path / "run"}', '--config.num_steps=100000',
      '--config.steps_per_loop=1', '--config.log_every=1',
    ],
    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},
  )  # fmt: skip
  proc.stdout.readline()  # As `| head -1` does, then goes away.
  proc.stdout.close()
  stderr = proc.stderr.read()
  proc.wait(timeout=300)
  line = one_line(stderr)
  assert proc.returncode == streams.BROKEN_PIPE_EXIT, line
  assert line.startswith('error: stdout was closed (broken pipe): stopped')
  assert (tmp_path / 'run' / 'checkpoints' / 'checkpoint').exists()


@pytest.mark.slow
def test_a_full_stderr_that_is_never_written_costs_nothing(tmp_path):
  with open('/dev/full', 'w') as full:
    proc = train(tmp_path, stderr=full)
  assert proc.returncode == 0
  assert b'test accuracy' in proc.stdout
  assert (tmp_path / 'run' / 'result.json').exists()


def test_a_guarded_stream_notes_the_fault_once_and_drops_the_rest(tmp_path):
  code = (
    'import sys\n'
    'from xla_mnist import streams\n'
    'streams.guard()\n'
    'for _ in range(3):\n'
    '  print("x" * 100000)\n'
    'sys.stdout.flush()\n'
    'print(streams.fault(), streams.exit_code(), streams.stop_signum(),'
    ' file=sys.stderr)\n'
  )
  with open('/dev/full', 'w') as full:
    proc = subprocess.run(
      [sys.executable, '-c', code], cwd=REPO, stdout=full,
      stderr=subprocess.PIPE, timeout=60,
    )  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  assert proc.stderr.decode() == (
    'stdout cannot be written (No space left on device) 74 13\n'
  )
