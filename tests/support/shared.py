"""Set-up built once per session, even when pytest-xdist splits the session
among workers: each worker is a session of its own, so the first to ask
builds the folder under a lock and the others wait for it, then read it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Iterator

import pytest


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
  """Holds an exclusive lock on the file `path` (made if absent)."""
  with open(path, 'a') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def built_once(
  factory: pytest.TempPathFactory, name: str, build: Callable[[str], None]
) -> str:
  """A folder that `build(folder)` filled, once for the whole session.

  Alone, a fresh temporary folder. Under xdist, `name` in the folder the
  workers' temporary folders share: a worker whose build failed leaves no
  mark, so the next one builds again and fails in its own tests too.
  """
  if not os.environ.get('PYTEST_XDIST_WORKER'):
    folder = str(factory.mktemp(name))
    build(folder)
    return folder
  root = factory.getbasetemp().parent
  folder, done = root / name, root / f'{name}.done'
  with locked(str(root / f'{name}.lock')):
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      build(str(folder))
      done.touch()
  return str(folder)
