"""The commands as a user runs them: `python -m <module>` from the repository
root, and the one-line error every failing command ends with."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

# tests/support/cli.py: the repository is three folders up.
REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def run_train(*args: str, **kwargs):
  """Runs `python -m xla_mnist.train` as a user would, from the repo root."""
  return run_module('xla_mnist.train', *args, **kwargs)


def start_train(*args: str) -> subprocess.Popen:
  """`python -m xla_mnist.train` in the background, its output unbuffered,
  so that a test can act at a given progress line."""
  return subprocess.Popen(
    [sys.executable, '-m', 'xla_mnist.train', *args],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},
  )


def run_module(
  module: str, *args: str, cwd: str = REPO, timeout: float = 300, **env: str
):
  """Runs `python -m module` with `args` and `env` added to the environment."""
  return subprocess.run(
    [sys.executable, '-m', module, *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=timeout,
    env={**os.environ, **env},
  )


def run_compare(*args: str) -> subprocess.CompletedProcess:
  """Runs `python -m xla_mnist.compare` as a user would, from the repo root."""
  return subprocess.run(
    [sys.executable, '-m', 'xla_mnist.compare', *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )


FASHION = '--config=fashion_mnist'


def assert_one_line_error(proc, code: int, *fragments: str) -> None:
  """The error is all of stderr: TF's and TFDS's start-up lines included."""
  assert proc.returncode == code, proc.stderr
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


def free_ports(count: int) -> list[int]:
  """`count` ports free on 127.0.0.1 a moment ago, for workers to take."""
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports
