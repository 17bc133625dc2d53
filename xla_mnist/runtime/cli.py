"""How the command lines end: in one line and an exit code, whatever ends them.

`run` turns what ends a command early (a `UserError`, a stop signal, a closed
stdout) into one line on stderr, never a traceback (codes: docs/resume.md).

A command imports this module first and calls `catch_stop_signals` before
its slow imports; importing it installs nothing. Until `unwind_on_signals`,
a signal ends the process at once with its line, not unwinding through a
half-imported TensorFlow; after it, a signal raises `errors.Interrupted`, so
that `finally` blocks remove temporary files and locks; while there is
training to save, `signals.StopRequest` takes the signals over.

Each command defines its flags in the `flags_parser` it gives `run`, none at
import: absl's flags are process-wide (train's --workdir and compare's would
clash where both are imported), and --config reads its overrides from argv
as it is defined. Imports only the standard library: it runs first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, NoReturn

from xla_mnist.runtime import console, errors, streams

# The command lines: their modules and console scripts.
COMMANDS = {
  'xla_mnist.train': 'xla-mnist-train',
  'xla_mnist.compare': 'xla-mnist-compare',
  'xla_mnist.aot': 'xla-mnist-aot',
}

_stderr = -1  # A copy of descriptor 2 that TF's import cannot redirect.


def catch_stop_signals() -> None:
  """Makes every stop signal end this command line at once, in one line: a
  command's first call. Nothing in a process that is not one of `COMMANDS`
  (a notebook importing an entry)."""
  main = sys.modules.get('__main__')
  module = getattr(getattr(main, '__spec__', None), 'name', None)  # python -m
  script = os.path.basename(getattr(main, '__file__', None) or '')
  if module in COMMANDS or (module is None and script in COMMANDS.values()):
    _start()


def _start() -> None:
  """Refuses a stdout or stderr closed at start (`>&-`), before any file
  the run opens takes its number; then makes every stop signal end the
  process at once, in one line. A signal the process was started ignoring
  stays ignored: nohup's SIGHUP, a background job's SIGINT."""
  global _stderr
  for fd, name in ((1, 'stdout'), (2, 'stderr')):
    try:
      os.fstat(fd)
    except OSError:
      line = f'error: {name} is closed: give the command a {name} (> run.log,'
      line += ' or > /dev/null to drop its lines)\n'
      with contextlib.suppress(OSError):  # A closed stderr: the code says it.
        os.write(2, line.encode())
      os._exit(streams.IO_ERROR_EXIT)
  if _stderr < 0:
    _stderr = os.dup(2)
  _install(_exit_at_once)


def unwind_on_signals() -> None:
  """From now on a stop signal raises `errors.Interrupted` where it lands."""
  _install(errors.interrupt)


def _install(handler: Callable[[int, types.FrameType | None], None]) -> None:
  if threading.current_thread() is not threading.main_thread():
    return  # Only the main thread may; Python runs handlers there only.
  for signum in errors.STOP_SIGNALS:
    if signal.getsignal(signum) != signal.SIG_IGN:
      signal.signal(signum, handler)


def _exit_at_once(signum: int, frame: types.FrameType | None) -> None:
  del frame  # Unused.
  with contextlib.suppress(Exception):  # A closed or busy stdout.
    sys.stdout.flush()
  error = errors.Interrupted(signum, 'stopped while starting, nothing saved')
  with contextlib.suppress(OSError):
    os.write(_stderr, f'error: {error}\n'.encode())
  os._exit(error.exit_code)


def fail(message: str, exit_code: int) -> NoReturn:
  """Ends the process with `error: <message>`, alone on stderr (if stderr
  can be written: the exit code says it all the same)."""
  with contextlib.suppress(OSError, ValueError, AttributeError):
    print(f'error: {streams.printable(message)}', file=sys.stderr, flush=True)
  sys.exit(exit_code)


def parse(argv: list[str], known_only: bool = False) -> list[str]:
  """absl's parse of the flags a command defined; a bad one ends the process
  in one line, exit code 2."""
  from absl import flags  # noqa: PLC0415 - after the handlers, see the top.

  try:
    return flags.FLAGS(argv, known_only=known_only)
  except flags.Error as e:
    fail(bad_flag(e), 2)


def bad_flag(error: Exception) -> str:
  """absl's flag error in one line."""
  return f'{errors.first_line(error)} (see --helpshort)'


def run(
  main: Callable[[Any], None], flags_parser: Callable[[list[str]], Any]
) -> None:
  """absl's `app.run`, ending in one line and an exit code (see the top),
  whose errors name flags (`errors.speaking_flags`) from the first line
  the command runs, its flags' parser included."""
  from absl import app  # noqa: PLC0415 - after the handlers, see the top.

  _start()  # For a command started another way too: it is idempotent.
  streams.guard()  # A failed write is noted, and stops the run with a save.
  console.show()  # The command's lines and the library's, on stdout.
  try:
    with errors.speaking_flags():
      try:
        app.run(main, flags_parser=flags_parser)
      finally:
        sys.stdout.flush()  # A failed write is noted here, not at exit.
  except (errors.UserError, errors.Interrupted) as e:
    fail(str(e), e.exit_code)
  except errors.Stopped as e:  # A clean stop, saved: its line on stdout.
    console.say(str(e))
    sys.exit(e.exit_code)
  except SystemExit as e:
    if e.code in (0, None) and (fault := streams.fault()):
      # Past the loop, or a run with nothing to train: its outputs stand.
      fail(
        f'{fault}: the run finished, its outputs are saved, and what it'
        f' printed after that was lost: {streams.FIX}',
        streams.exit_code(),
      )
    raise
