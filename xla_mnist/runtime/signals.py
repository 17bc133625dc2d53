"""A clean stop on a stop signal (SIGINT, SIGTERM, ...), at a call boundary.

`StopRequest` keeps the signal; the loop stops at its next call boundary,
after a save, and the trainer raises `Stopped` (exit code 128 + the signal's
number: the work is kept but not finished, and a scheduler must see that).
Workers that train together stop together on the largest of their signals,
gathered every `loop.AGREE_EVERY` steps (docs/distributed.md, which also
says why TF's `PreemptionCheckpointHandler` is not used).
"""

from __future__ import annotations

import signal
import threading
import types
from collections.abc import Callable

from xla_mnist.runtime import errors, streams
from xla_mnist.runtime.errors import Stopped, UserError

# What `signal.signal` returns: a function, SIG_DFL/SIG_IGN, or None.
_Handler = Callable[[int, types.FrameType | None], object] | int | None


class StopRequest:
  """Turns the first stop signal into a request to stop cleanly.

  The handlers are removed at the first signal, so that a second acts as
  usual; an ignored signal (nohup's SIGHUP) stays ignored. Until training
  begins (`begin`) a signal goes on to the CLI's `errors.interrupt`, if that
  was the handler: nothing is trained yet, so the run ends at once; workers
  that train together (not `alone`) keep it to stop together. Outside the
  main thread, where CPython runs no handler, this does nothing.
  """

  SIGNALS = errors.STOP_SIGNALS

  def __init__(self, *, alone: bool = True):
    self._signum = 0
    self._previous: dict[int, _Handler] = {}
    self._training = not alone

  def __enter__(self) -> StopRequest:
    if threading.current_thread() is threading.main_thread():
      for signum in self.SIGNALS:
        if signal.getsignal(signum) != signal.SIG_IGN:
          self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info: object) -> None:
    self._uninstall()

  def begin(self) -> None:
    """Training has begun: from now on a signal waits for a save."""
    self._training = True

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    if not self._training and self._previous[signum] is errors.interrupt:
      errors.interrupt(signum, frame)
    self._signum = signum
    self._uninstall()

  def _uninstall(self) -> None:
    for signum, handler in self._previous.items():
      # None: the old handler was not set from Python and cannot be put back.
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    self._previous = {}

  @property
  def signum(self) -> int:
    """The signal that asked to stop, 0 if none; a failed output stream
    asks as SIGPIPE does (`streams`)."""
    return self._signum or streams.stop_signum()


def stopped(
  signum: int, last_step: int, own: int, resume_from: str
) -> Stopped | UserError:
  """The clean stop of a loop that signal `signum` ended after `last_step`;
  `own` is this process's signal (0 when another worker's stopped it)."""
  if signum == own and (fault := streams.fault()):
    error = UserError(
      f'{fault}: stopped after step {last_step} with a checkpoint:'
      f' {streams.FIX}, then run the same command to resume from the'
      f' checkpoint in {resume_from}'
    )
    error.exit_code = streams.exit_code()
    return error
  where = '' if signum == own else ' to another worker'
  return Stopped(
    f'stopped by {signal.Signals(signum).name}{where} after step'
    f' {last_step}: run the same command to resume from the checkpoint'
    f' in {resume_from}',
    signum,
  )
