"""Folders and files that runs share: checked, written whole, locked, and
named so that TF can take them (`tf_path`). Imports no TensorFlow: the CLI
checks its folders before TF's import."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import UsageError, UserError

LOCK_FILE = layout.LOCK_FILE
# What TF's glob of a checkpoint's prefix reads as a pattern (docs/resume.md).
_GLOB_CHARS = re.compile(r'[*?[\\]')
_FOLDERS: dict[str, int] = {}  # Folder path: its descriptor (`tf_path`).


def tf_path(path: str, arg: str, literal: bool = False) -> str:
  """`path` as TF's file functions take it, naming the same file: one not
  UTF-8, or with `literal` (TF will glob it) one with a glob character, via
  its folder's descriptor, kept open as TF may reopen it (docs/resume.md).
  Without /proc, UsageError naming the argument `arg`."""
  if _utf8(path) and not (literal and _GLOB_CHARS.search(path)):
    return path
  folder, name = (path, '') if os.path.isdir(path) else os.path.split(path)
  if not os.path.isdir('/proc/self/fd') or not _utf8(name):
    why = 'is not UTF-8' if not _utf8(path) else 'has one of * ? [ \\'
    raise UsageError(
      f'TF cannot take {path} as a path: it {why}; pass'
      f' {errors.arg(arg, "DIR")} whose path is UTF-8 and has none of * ? ['
      ' \\'
    )
  key = os.path.abspath(folder)
  fd = _FOLDERS.get(key)
  if fd is None or not os.path.samestat(os.fstat(fd), os.stat(key)):
    if fd is not None:  # The folder was replaced since: the new one's.
      os.close(fd)
    fd = _FOLDERS[key] = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
  return os.path.join(f'/proc/self/fd/{fd}', name)


def check_utf8(path: str, what: str, arg: str) -> None:
  """UsageError, before anything is written, unless `path` is UTF-8: for
  the folders that TFDS, which passes paths on as text, reads and writes."""
  if not _utf8(path):
    raise UsageError(
      f'{what} {path} is not UTF-8 (a name Linux allows), which TFDS cannot'
      f' take as a path: pass {errors.arg(arg, "DIR")} whose name is UTF-8'
    )


def _utf8(text: str) -> bool:
  try:
    text.encode()
  except UnicodeEncodeError:  # Surrogates: bytes of a name not UTF-8.
    return False
  return True


def check_places(workdir: str, data_dir: str, *read: str) -> None:
  """UserError, making and writing nothing, for a run's folder that cannot
  serve: a command's check before TF's import (seconds), of what
  `ensure_writable_dir` would refuse later. The workdir is always written;
  the folders the run `read`s must only be reachable."""
  check_current_folder(workdir, data_dir, *read)
  _check_folder(workdir, 'workdir', 'workdir', written=True)
  check_data_dir(data_dir)


def check_current_folder(*paths: str) -> None:
  """UserError if a relative path among `paths` has no folder to be
  relative to: the current one was deleted since the shell entered it."""
  relative = [p for p in paths if p and not os.path.isabs(p)]
  try:
    _ = relative and os.getcwd()
  except OSError as e:
    are = 'are' if len(relative) > 1 else 'is'
    raise UserError(
      f'the current folder is gone ({e.strerror}), and {", ".join(relative)}'
      f' {are} relative to it: cd to a folder that exists, or pass absolute'
      ' paths'
    ) from None


def check_data_dir(data_dir: str) -> None:
  """UserError, making and writing nothing, for a data dir TFDS cannot
  take: not UTF-8, a file, or one that cannot be made. One that exists is
  not probed: it may hold prepared data to read, read-only or not."""
  check_utf8(data_dir, 'data dir', 'data_dir')
  _check_folder(data_dir, 'data dir', 'data_dir', written=False)


def _check_folder(path: str, what: str, arg: str, written: bool) -> None:
  """UserError unless `path` is a folder (`written`: one that takes a file)
  or could be made one."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise _is_a_file(what, path, arg)
  if os.path.isdir(path) and not written:
    return
  probe = os.path.abspath(path)  # The folder, or the nearest that exists.
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  try:
    if not os.path.isdir(probe):  # A file on its path, as makedirs says.
      raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    tempfile.TemporaryFile(dir=probe).close()  # Unnamed: nothing is left.
  except OSError as e:
    raise _unwritable(what, path, arg, e) from None


def ensure_writable_dir(path: str, what: str, arg: str) -> None:
  """Creates folder `path`, or fails in one line naming the argument `arg`."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise _is_a_file(what, path, arg)
  try:
    os.makedirs(path, exist_ok=True)
    tempfile.TemporaryFile(dir=path).close()
  except OSError as e:  # A parent that is a file: "Not a directory".
    raise _unwritable(what, path, arg, e) from None


def _is_a_file(what: str, path: str, arg: str) -> UserError:
  return UserError(
    f'{what} {path} is a file: pass {errors.arg(arg, "DIR")} with a folder'
  )


def _unwritable(what: str, path: str, arg: str, e: OSError) -> UserError:
  return UserError(
    f'{what} {path} cannot be written ({e.strerror}): pass a writable'
    f' {errors.arg(arg, "DIR")}'
  )


def write_atomically(
  path: str, content: str | bytes | Callable[[BinaryIO], object]
) -> None:
  """Writes `content` (or what a function writes into the binary file it is
  given: data too large to hold twice) to a temp file beside `path`, then
  renames it there. 0666 less the umask, as `open` makes files, not
  mkstemp's 0600: TensorBoard or a colleague as another user reads it."""
  folder = os.path.dirname(path) or '.'
  tmp = os.path.join(folder, f'tmp{secrets.token_hex(6)}.tmp')
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
  try:
    with os.fdopen(fd, 'w' if isinstance(content, str) else 'wb') as f:
      content(f) if callable(content) else f.write(content)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


@contextlib.contextmanager
def waiting_lock(path: str) -> Iterator[None]:
  """Holds an exclusive lock on file `path`, waiting for another holder."""
  fd = _lock(path, wait=True)
  try:
    yield
  finally:
    _unlock(path, fd)


@contextlib.contextmanager
def workdir_lock(workdir: str) -> Iterator[None]:
  """Holds `workdir` for this process; UserError at once if another does,
  naming it: the lock file holds the holder's process id."""
  path = os.path.join(workdir, LOCK_FILE)
  try:
    fd = _lock(path, wait=False)
  except BlockingIOError:
    holder = _holder(path)
    raise UserError(
      f'workdir {workdir} is in use by another run'
      f'{f" (process {holder})" if holder else ""}: wait for it to end, or'
      f' pass another {errors.arg("workdir", "DIR")}'
    ) from None
  try:
    # A file left by a killed run may hold a longer id, or anything. The id
    # is for the message only: on a full disk the run goes on without it.
    with contextlib.suppress(OSError):
      os.ftruncate(fd, 0)
      os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
    yield
  finally:
    _unlock(path, fd)


def _holder(path: str) -> str:
  """The process id in lock file `path`; '' before its holder wrote it."""
  holder = ''
  with contextlib.suppress(OSError), open(path) as f:
    holder = f.read(32).strip()
  return holder if holder.isdecimal() else ''


def _lock(path: str, wait: bool) -> int:
  """An flock on file `path` (BlockingIOError if held and not `wait`), which
  the kernel drops when its holder dies, even by kill -9. A holder removes
  the file as it releases it: one who had opened it finds it gone once
  locked, and starts over on a new one."""
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
      if os.path.samestat(os.fstat(fd), os.stat(path)):
        return fd
    except FileNotFoundError:  # Removed by its holder while we waited.
      pass
    except BaseException:
      os.close(fd)
      raise
    os.close(fd)


def _unlock(path: str, fd: int) -> None:
  os.unlink(path)
  os.close(fd)
