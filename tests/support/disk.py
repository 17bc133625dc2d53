"""A full disk on demand: a real tmpfs of a few KiB, and a filler."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def mounted_tmpfs(folder: str, size_kib: int) -> Iterator[str]:
  """A real filesystem of `size_kib` KiB at `folder`: a full disk on demand.

  Needs root (CI is root); elsewhere the test skips, except under CI.
  """
  os.makedirs(folder, exist_ok=True)
  mount = ['mount', '-t', 'tmpfs', '-o', f'size={size_kib}k', 'tmpfs', folder]
  proc = subprocess.run(mount, capture_output=True, text=True)
  if proc.returncode:
    reason = f'cannot mount a tmpfs ({proc.stderr.strip()}): run as root'
    if os.environ.get('CI'):
      pytest.fail(reason)
    pytest.skip(reason)
  try:
    yield folder
  finally:
    subprocess.run(['umount', '-l', folder], check=False)


def fill(folder: str) -> None:
  """Fills the filesystem of `folder` to its last byte."""
  path = os.path.join(folder, 'filler')
  with open(path, 'ab', buffering=0) as f, contextlib.suppress(OSError):
    while True:
      f.write(b'\0' * 4096)
  with open(path, 'ab', buffering=0) as f, contextlib.suppress(OSError):
    while True:
      f.write(b'\0')  # The last partial block, byte by byte.
