"""The standard output streams: a write that fails is noted, never a
traceback, and the run stops at its next call boundary after a save.

A stream that cannot be written (a pipe whose reader went away, a full
device, a closed descriptor) is noted once (`lost`) and pointed at
/dev/null; the loop stops as on a signal (`stop_signum`), saves, and the
command ends in one line on stderr with `exit_code`: 141 for a closed pipe
(as a shell reports SIGPIPE), 74 (EX_IOERR) for any other fault.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import BinaryIO, TextIO

IO_ERROR_EXIT = 74
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE
FIX = (
  'send the output to a file (> run.log) with room, or to a reader that'
  ' reads it all'
)

_fault: tuple[str, OSError | None] | None = None  # (stream, error)


def printable(text: str) -> str:
  """`text` as any stream can take it: the bytes of a name that are not
  UTF-8 (surrogates; Linux allows them) as `\\xNN`, as Python shows bytes,
  where a strict stdout would fail."""
  try:
    text.encode()
  except UnicodeEncodeError:
    try:
      raw = text.encode(errors='surrogateescape')
    except UnicodeEncodeError:  # A surrogate no name's byte makes.
      raw = text.encode(errors='backslashreplace')
    return raw.decode(errors='backslashreplace')
  return text


def lost(name: str, error: BaseException | None) -> None:
  """Notes that stream `name` ('stdout' or 'stderr') cannot be written (the
  first fault is kept), and points its descriptor at /dev/null, so that
  later writes, Python's and TF's, go nowhere quietly."""
  global _fault
  if _fault is None:
    _fault = (name, error if isinstance(error, OSError) else None)
  with contextlib.suppress(OSError):
    _point(1 if name == 'stdout' else 2, None)


@contextlib.contextmanager
def quiet_stderr(into: BinaryIO | None = None) -> Iterator[None]:
  """Sends descriptor 2, where C++ libraries log, to file `into` (for the
  caller to show) or to /dev/null, for a while."""
  sys.stderr.flush()
  saved = os.dup(2)
  _point(2, into)
  try:
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def _point(fd: int, into: BinaryIO | None) -> None:
  """Points descriptor `fd` at file `into`, or at /dev/null."""
  null = into is None
  target = os.open(os.devnull, os.O_WRONLY) if null else into.fileno()
  os.dup2(target, fd)
  if null:
    os.close(target)


def _broken_pipe() -> bool:
  return _fault is not None and getattr(_fault[1], 'errno', 0) == errno.EPIPE


def fault() -> str | None:
  """What failed, as a message's start; None while every stream works."""
  if _fault is None:
    return None
  name, error = _fault
  if _broken_pipe():
    return f'{name} was closed (broken pipe)'
  if error is None or error.errno == errno.EBADF:
    return f'{name} is closed'
  return f'{name} cannot be written ({error.strerror})'


def exit_code() -> int:
  """141 for a closed pipe, 74 for any other fault of a stream."""
  return BROKEN_PIPE_EXIT if _broken_pipe() else IO_ERROR_EXIT


def stop_signum() -> int:
  """SIGPIPE once a stream failed, to stop the loop as a signal does; 0."""
  return int(signal.SIGPIPE) if _fault else 0


class Guarded:
  """A text stream whose failed writes are `lost`, not raised."""

  def __init__(self, name: str, stream: TextIO):
    self._name = name
    self._stream = stream

  def write(self, text: str) -> int:
    self._try(self._stream.write, text)
    return len(text)

  def flush(self) -> None:
    self._try(self._stream.flush)

  def _try(self, call: Callable[..., object], *args: str) -> None:
    if _fault is None or _fault[0] != self._name:
      try:
        call(*args)
      except (OSError, ValueError) as e:  # ValueError: a closed file.
        lost(self._name, e)

  def __getattr__(self, attribute: str) -> object:
    return getattr(self._stream, attribute)


def guard() -> None:
  """Wraps `sys.stdout` and `sys.stderr` in `Guarded` (once)."""
  for name in ('stdout', 'stderr'):
    stream = getattr(sys, name)
    if stream is not None and not isinstance(stream, Guarded):
      setattr(sys, name, Guarded(name, stream))
