"""The standard streams, the environment TF reads, and workers that never
come: one line on stderr (where stderr can be written), the documented
exit code, and nothing lost. Real processes, real descriptors."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from support.cli import REPO, free_ports
from support.idx import make_idx_folder

from xla_mnist.runtime import streams


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
    'from xla_mnist.runtime import streams\n'
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


def worker_config(ports: list[int], index: int = 0) -> str:
  return json.dumps(
    {
      'cluster': {'worker': [f'127.0.0.1:{p}' for p in ports]},
      'task': {'type': 'worker', 'index': index},
    }
  )


@pytest.mark.slow
def test_a_worker_that_never_comes_is_named_after_the_wait(tmp_path):
  ports = free_ports(2)
  proc = train(
    tmp_path, '--strategy=multi_worker',
    TF_CONFIG=worker_config(ports), XLA_MNIST_WORKER_TIMEOUT='2',
  )  # fmt: skip
  line = one_line(proc.stderr)
  assert proc.returncode == 1, line
  assert line == (
    f'error: worker 127.0.0.1:{ports[1]} of TF_CONFIG did not start within'
    ' 2 s: start the same command there with its "index", check that this'
    ' host reaches that address, or wait longer'
    ' (XLA_MNIST_WORKER_TIMEOUT=SECONDS)'
  )


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_waiting_worker_obeys_a_stop_signal_at_once(tmp_path, signum):
  ports = free_ports(2)
  folder = tmp_path / 'idx'
  make_idx_folder(str(folder))
  proc = subprocess.Popen(
    [
      sys.executable, '-m', 'xla_mnist.train', '--config=fashion_mnist',
      f'--config.idx_dir={folder}', f'--data_dir={tmp_path / "tfds"}',
      f'--workdir={tmp_path / "run"}', '--strategy=multi_worker',
    ],
    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    env={**os.environ, 'TF_CONFIG': worker_config(ports)},
  )  # fmt: skip
  # It waits once it holds its own port: the moment to signal.
  deadline = time.monotonic() + 120
  while not listening(ports[0]):
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.1)
  proc.send_signal(signum)
  _, stderr = proc.communicate(timeout=10)  # At once, not after 300 s.
  line = one_line(stderr)
  assert proc.returncode == 128 + signum, line
  assert line.startswith(f'error: interrupted by {signum.name}:'), line


def listening(port: int) -> bool:
  with contextlib.suppress(OSError):
    socket.create_connection(('127.0.0.1', port), timeout=1).close()
    return True
  return False


@pytest.mark.slow
def test_a_worker_port_in_use_is_one_line(tmp_path):
  ports = free_ports(2)
  with socket.socket() as holder:
    holder.bind(('127.0.0.1', ports[0]))
    holder.listen()
    proc = train(
      tmp_path, '--strategy=multi_worker', TF_CONFIG=worker_config(ports)
    )
  line = one_line(proc.stderr)
  assert proc.returncode == 1, line
  assert line.startswith(
    f'error: port {ports[0]} of this worker (127.0.0.1:{ports[0]} in'
    ' TF_CONFIG) is in use'
  ), line


@pytest.mark.parametrize(
  'variables, said',
  [
    ({'XLA_MNIST_WORKER_TIMEOUT': 'soon'}, "XLA_MNIST_WORKER_TIMEOUT='soon'"),
    ({'XLA_MNIST_WORKER_TIMEOUT': '0'}, "XLA_MNIST_WORKER_TIMEOUT='0'"),
    ({'XLA_MNIST_WORKER_TIMEOUT': '-5'}, "XLA_MNIST_WORKER_TIMEOUT='-5'"),
    ({'XLA_MNIST_WORKER_TIMEOUT': 'nan'}, "XLA_MNIST_WORKER_TIMEOUT='nan'"),
    ({'TF_CONFIG': '{"cluster":'}, 'TF_CONFIG is not JSON'),
    ({'TF_CONFIG': ''}, '--config.strategy=multi_worker needs TF_CONFIG'),
  ],
)
def test_a_broken_cluster_setting_is_a_usage_error_before_tf(
  tmp_path, variables, said
):
  """Before TF's import: a `tensorflow` that fails to import comes first on
  the path, and the run ends as it would without it."""
  shadow = tmp_path / 'shadow' / 'tensorflow'
  shadow.mkdir(parents=True)
  (shadow / '__init__.py').write_text('raise ImportError("too late")\n')
  path = os.pathsep.join(
    filter(None, [str(shadow.parent), os.environ.get('PYTHONPATH')])
  )
  variables = {'TF_CONFIG': worker_config(free_ports(2)), **variables}
  proc = train(
    tmp_path, '--strategy=multi_worker', PYTHONPATH=path, **variables
  )
  line = one_line(proc.stderr)
  assert proc.returncode == 2, line
  assert line.startswith(f'error: {said}'), line
