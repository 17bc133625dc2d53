"""Errors that end a run in one line instead of a traceback.

`cli.run` prints `error: <message>` and exits with the error's `exit_code`
(docs/resume.md, "Exit codes"). A message names an argument or field
through `arg` and `field`, never by spelling it: `pass fresh=True` to a
library caller, `pass --fresh` on a command line, which says so first
(`speaking_flags`).
"""

from __future__ import annotations

import contextlib
import re
import signal
import types
from collections.abc import Iterator

# The signals that stop a run, who sends them, and why not SIGQUIT nor
# SIGPIPE: docs/resume.md, "Signals".
STOP_SIGNALS = (
  signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
  signal.SIGXCPU, signal.SIGUSR1, signal.SIGUSR2,
)  # fmt: skip

# The tag TF puts before an op's message: '{{function_node __wrapped__...}}'.
_TF_TAG = re.compile(r'^\{\{function_node [^}]*\}\}')


def first_line(error: BaseException, *, named: bool = False) -> str:
  """The first line of `error`'s message, without TF's tag; `named` puts
  the type's name first, alone when the message is empty."""
  text = _TF_TAG.sub('', str(error).strip()).strip()
  line = text.splitlines()[0] if text else ''
  name = type(error).__name__
  if not line:
    return name
  return f'{name}: {line}' if named else line


_flags = False  # Whether messages name flags: a command line's.


@contextlib.contextmanager
def speaking_flags() -> Iterator[None]:
  """Within it, `arg` and `field` name the command line's flags."""
  global _flags
  before, _flags = _flags, True
  try:
    yield
  finally:
    _flags = before


def arg(name: str, value: object = None) -> str:
  """Argument `name`, given `value`, as the user spells it: `name=value`
  to a library call, `--name=value` on a command line (where `True` is the
  bare `--name`); no value, the name alone."""
  if _flags:
    name = f'--{name}'
    if value is True:
      return name
  return name if value is None else f'{name}={value}'


def field(name: str, value: object = None) -> str:
  """Config field `name`: `config.name`, `--config.name` on a command line."""
  return arg(f'config.{name}', value)


class UserError(Exception):
  """A failure the user can fix; its message names the problem and the fix."""

  exit_code = 1


class UsageError(UserError):
  """A bad flag or config value."""

  exit_code = 2


class DataError(UserError):
  """Missing, corrupt or unreachable data."""


class Stopped(Exception):  # noqa: N818 - not an error: a clean, saved stop.
  """The run ends early with its state saved: by a signal (exit code 128 +
  its number, see `signals`), or with nothing to do (0)."""

  def __init__(self, message: str, signum: int = 0):
    super().__init__(message)
    self.exit_code = 128 + signum if signum else 0


class Interrupted(BaseException):  # noqa: N818 - as KeyboardInterrupt.
  """A stop signal ends the run at once, saving nothing more; exit code 128
  + its number. A BaseException, so that `except Exception` cleanups let it
  through while `finally` blocks remove temporary files and locks."""

  def __init__(self, signum: int, detail: str = 'nothing was saved'):
    super().__init__(f'interrupted by {signal.Signals(signum).name}: {detail}')
    self.signum = signum
    self.exit_code = 128 + signum


def interrupt(signum: int, frame: types.FrameType | None) -> None:
  """The CLI's signal handler: raises `Interrupted` where the program is."""
  del frame  # Unused.
  raise Interrupted(signum)
