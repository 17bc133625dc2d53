"""A clean stop on a stop signal (SIGINT, SIGTERM, ...), at a call boundary.

`StopRequest` keeps the signal; the loop (`loop.Loop`) stops at its next
call boundary, after a save, and the trainer raises `Stopped`, which ends
the run with exit code 128 + the signal's number, as a shell reports a
process that a signal ended: the work is kept but not finished, and a
scheduler must see that. Which signals, and why: `errors.STOP_SIGNALS`.

Workers that train together (`multi_worker`) must stop together: a scheduler
preempts whichever it likes, and a worker that stopped alone would leave the
others waiting on its all-reduce. So every `loop.AGREE_EVERY` steps, and at
the last, each worker passes its signal's number (0 for none) to an
all-gather, and all of them stop on the largest: at the same step, with the
same exit code, after a save that is collective (the chief's lands in the
shared workdir). The gather costs about as much as a training step of this
model: at every step it would halve the speed; every 100 steps it costs
little and still answers a signal within 100 steps (measured in
docs/distributed.md).

TF's `PreemptionCheckpointHandler` does the same through the coordination
service's key-value store, with no collective per step: the signalled worker
publishes the step to save at and waits for every worker's acknowledgement.
It is not used: it watches SIGTERM only, restores at its construction
(bypassing `checkpointing`'s recipe check), adds its own variable to the
checkpoint, and exits with code 42; its thread and key protocol would be more
code to fit than the one gather here.
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

  The loop polls `signum` at each call boundary. The handlers are removed at
  the first signal, so a later one acts as usual (Ctrl-C raises
  KeyboardInterrupt, the CLI's `errors.interrupt` ends the run at once). A
  signal the process ignores (nohup's SIGHUP) stays ignored. Until training
  begins (`begin`), a signal is passed on to the CLI's handler, if that was
  the handler before: nothing was trained yet, so the run ends at once
  rather than after its data preparation, compile and first call. Workers
  that train together (not `alone`) keep it for their first agreement
  instead, so that they stop together. CPython
  runs handlers between bytecodes, in the main thread only: signals that
  arrive during a compiled call are seen, merged into one, when it returns;
  outside the main thread this does nothing and `requested` stays None.
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

  def __exit__(
    self,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    traceback: types.TracebackType | None,
  ) -> None:
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
  def requested(self) -> str | None:
    """The name of the signal that asked to stop, e.g. 'SIGTERM'."""
    return signal.Signals(self._signum).name if self._signum else None

  @property
  def signum(self) -> int:
    """The number of the signal that asked to stop; 0 if none did.

    An output stream that failed asks as SIGPIPE does (`streams`).
    """
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
