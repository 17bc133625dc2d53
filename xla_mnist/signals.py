"""A clean stop on SIGINT or SIGTERM, at the next call boundary.

The state is saved, then `Stopped` ends the run with exit code 128 + the
signal's number, as a shell reports a process that a signal ended: the work
is kept but not finished, and a scheduler must see that.
"""

from __future__ import annotations

import signal
import threading
import types
from collections.abc import Callable

from xla_mnist import loop
from xla_mnist.errors import Stopped

# What `signal.signal` returns: a function, SIG_DFL/SIG_IGN, or None.
_Handler = Callable[[int, types.FrameType | None], object] | int | None


class StopRequest:
  """Turns the first SIGINT or SIGTERM into a request to stop cleanly.

  `StopOnSignal` polls it at each call boundary. The handlers are removed at
  the first signal, so a later one acts as usual (Ctrl-C raises
  KeyboardInterrupt). CPython runs handlers between bytecodes, in the main
  thread only: signals that arrive during a compiled call are seen, merged
  into one, when it returns; outside the main thread this does nothing and
  `requested` stays None.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self._signum = 0
    self._previous: dict[int, _Handler] = {}

  def __enter__(self) -> StopRequest:
    if threading.current_thread() is threading.main_thread():
      for signum in self.SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(
    self,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    traceback: types.TracebackType | None,
  ) -> None:
    self._uninstall()

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame  # Unused.
    self._signum = signum
    self._uninstall()

  def _uninstall(self) -> None:
    for signum, handler in self._previous.items():
      # None: the old handler was not set from Python and cannot be put back.
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    self._previous = {}

  @property
  def requested(self) -> str | None:
    """The name of the signal that asked to stop, e.g. 'SIGTERM'."""
    return signal.Signals(self._signum).name if self._signum else None

  @property
  def signum(self) -> int:
    """The number of the signal that asked to stop; 0 if none did."""
    return self._signum


class StopOnSignal(loop.Action):
  """Saves through `save`, then raises `Stopped`, once a signal came."""

  needs_losses = True  # The finite-loss check runs before the save.

  def __init__(self, request: StopRequest, save: loop.Action, resume_from: str):
    self.request, self.save, self.resume_from = request, save, resume_from

  def due(self, first: int, last: int, end: int) -> bool:
    del first, last, end  # Unused: due whenever a signal came.
    return self.request.signum != 0

  def __call__(self, boundary: loop.Boundary) -> None:
    self.save(boundary)
    raise Stopped(
      f'stopped by {self.request.requested} after step {boundary.last}: run'
      f' the same command to resume from the checkpoint in {self.resume_from}',
      self.request.signum,
    )
