"""The standard output streams: a write that fails is noted once (`lost`),
never a traceback; the stream then goes to /dev/null, the loop stops as on a
signal (`stop_signum`) after a save, and the command ends in one line with
`exit_code` (docs/resume.md, "The output streams").
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Iterator
from typing import BinaryIO, TextIO

IO_ERROR_EXIT = 74
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE
FIX = (
  'send the output to a file (> run.log) with room, or to a reader that'
  ' reads it all'
)

_fault: tuple[str, str, int] | None = None  # (stream, what failed, exit code)


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
    code = getattr(error, 'errno', None)  # None: a closed file object.
    if code == errno.EPIPE:
      _fault = (name, f'{name} was closed (broken pipe)', BROKEN_PIPE_EXIT)
    elif code in (None, errno.EBADF):
      _fault = (name, f'{name} is closed', IO_ERROR_EXIT)
    else:
      said = f'{name} cannot be written ({error.strerror})'
      _fault = (name, said, IO_ERROR_EXIT)
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


def fault() -> str | None:
  """What failed, as a message's start; None while every stream works."""
  return _fault[1] if _fault else None


def exit_code() -> int:
  """141 for a closed pipe, 74 for any other fault of a stream."""
  return _fault[2] if _fault else IO_ERROR_EXIT


def stop_signum() -> int:
  """SIGPIPE once a stream failed, to stop the loop as a signal does; 0."""
  return int(signal.SIGPIPE) if _fault else 0


class Guarded:
  """A text stream whose failed writes are `lost`, not raised; a stream
  Python could not open (None) is lost at its first write."""

  def __init__(self, name: str, stream: TextIO):
    self._name = name
    self._stream = stream

  def write(self, text: str) -> int:
    self._try('write', text)
    return len(text)

  def flush(self) -> None:
    self._try('flush')

  def _try(self, method: str, *args: str) -> None:
    if _fault is None or _fault[0] != self._name:
      try:
        getattr(self._stream, method)(*args)
      # ValueError: a closed file; AttributeError: None, no stream at all.
      except (OSError, ValueError, AttributeError) as e:
        lost(self._name, e)

  def __getattr__(self, attribute: str) -> object:
    return getattr(self._stream, attribute)


def guard() -> None:
  """Wraps `sys.stdout` and `sys.stderr` in `Guarded` (once)."""
  for name in ('stdout', 'stderr'):
    stream = getattr(sys, name)
    if stream is not None and not isinstance(stream, Guarded):
      setattr(sys, name, Guarded(name, stream))
