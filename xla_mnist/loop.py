"""The training loop: calls of up to K steps, with actions at their boundaries.

The loop knows steps and time, nothing else. Logging, the finite-loss check,
checkpointing, profiling and the stop on a signal are `Action`s: each says
when it is due, and the loop waits for the pending losses only when a due
action needs them, so that calls queue up on the device in between. Every
cadence is one question, `crossed`: a call of K steps may jump over a
multiple of N, and must still count as reaching it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from xla_mnist.errors import UserError


def crossed(every: int, first: int, last: int) -> bool:
  """Whether steps `first..last` (1-based, inclusive) hold a multiple of
  `every`; never for `every` <= 0."""
  return every > 0 and last // every > (first - 1) // every


@dataclasses.dataclass(frozen=True)
class Program:
  """What the loop runs: `run(count)` trains `count` <= `steps_per_call`
  steps in one call and returns their losses (a tensor of `count`, or one
  scalar for a single step). `warm_up` compiles without training, where the
  program can; otherwise its first call compiles."""

  run: Callable[[int], object]
  steps_per_call: int
  warm_up: Callable[[], None] | None = None


class Clock:
  """Wall time less the `paused` spans: the training clock.

  Checkpoint saves and the profiler's start and stop happen between calls
  but are not training; actions wrap them in `paused()`.
  """

  def __init__(self) -> None:
    self.paused_seconds = 0.0

  def now(self) -> float:
    return time.perf_counter() - self.paused_seconds

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    start = time.perf_counter()
    try:
      yield
    finally:
      self.paused_seconds += time.perf_counter() - start


@dataclasses.dataclass(frozen=True)
class Boundary:
  """The end of a call that ran steps `first..last` of a run ending at `end`.

  `losses` holds the losses of steps `synced_from..last`, waited for at this
  boundary because a due action needs them; None when no action did.
  """

  first: int
  last: int
  end: int
  losses: np.ndarray | None = None
  synced_from: int = 0
  time: float = 0.0  # The training clock, once the losses were waited for.

  def synced_steps(self) -> Iterator[tuple[int, float]]:
    """(step, loss) for each synced step."""
    if self.losses is None:
      return iter(())
    steps = range(self.synced_from, self.last + 1)
    return zip(steps, self.losses.tolist(), strict=True)


class Action:
  """Work at call boundaries. Override what the action needs."""

  needs_losses = False  # Wait for the losses when due.

  def begin(self, step: int) -> None:
    """Training starts after `step` (compiling is over)."""

  def due(self, first: int, last: int, end: int) -> bool:
    del first, last, end  # Unused: due at every boundary.
    return True

  def around(self, first: int, last: int) -> contextlib.AbstractContextManager:
    """A context around the call of `first..last`; it yields True when the
    call must finish inside it (a profiler marker must span the work)."""
    del first, last  # Unused.
    return contextlib.nullcontext(False)

  def __call__(self, boundary: Boundary) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class LoopStats:
  compile_seconds: float  # The warm-up, or the first call (one step in it).
  train_seconds: float  # The calls after that, on the training clock.
  paused_seconds: float  # Saves and profiler work between calls.
  timed_steps: int  # The steps `train_seconds` covers.
  last_loss: float


class Loop:
  """Runs `program` from step `start` to `end`, with `actions` between calls.

  Compile time is the warm-up, or the first call and its wait when the
  program has none; train time is the rest, on `clock`.
  """

  def __init__(
    self,
    program: Program,
    actions: Sequence[Action] = (),
    clock: Clock | None = None,
  ):
    self.program = program
    self.actions = actions
    self.clock = clock or Clock()
    self._pending: list[tuple[int, object]] = []  # (first step, losses)
    self._last_loss = float('nan')

  def run(self, start: int, end: int) -> LoopStats:
    program, clock = self.program, self.clock
    compile_seconds = 0.0
    if program.warm_up:
      began = time.perf_counter()
      program.warm_up()
      compile_seconds = time.perf_counter() - began
    train_start, timed_from, step = clock.now(), start, start
    self._begin(start)
    while step < end:
      first, last = step + 1, min(step + program.steps_per_call, end)
      call_start = clock.now()
      with contextlib.ExitStack() as stack:
        wait = [
          stack.enter_context(a.around(first, last)) for a in self.actions
        ]
        losses = program.run(last - first + 1)
        if any(wait):
          losses = np.asarray(losses)
      self._pending.append((first, losses))
      step = last
      if first == start + 1 and not program.warm_up:
        np.asarray(losses)  # This call compiled: wait, it is not training.
        train_start = clock.now()
        compile_seconds = train_start - call_start
        timed_from = last
        self._begin(last)
      due = [a for a in self.actions if a.due(first, last, end)]
      boundary = Boundary(first, last, end)
      if any(a.needs_losses for a in due):
        synced_from, values = self._sync()
        boundary = dataclasses.replace(
          boundary, losses=values, synced_from=synced_from, time=clock.now()
        )
      for action in due:
        action(boundary)
    self._sync()
    return LoopStats(
      compile_seconds=compile_seconds,
      train_seconds=clock.now() - train_start,
      paused_seconds=clock.paused_seconds,
      timed_steps=step - timed_from,
      last_loss=self._last_loss,
    )

  def _begin(self, step: int) -> None:
    for action in self.actions:
      action.begin(step)

  def _sync(self) -> tuple[int, np.ndarray | None]:
    """Waits for the pending calls; returns (their first step, losses)."""
    if not self._pending:
      return 0, None
    first = self._pending[0][0]
    values = np.concatenate([np.reshape(v, -1) for _, v in self._pending])
    self._pending.clear()
    self._last_loss = float(values[-1])
    return first, values


class CheckFinite(Action):
  """Stops a diverged run with the fix, before anything saves its weights.

  Checks every loss another action had waited for; put it first, so that a
  checkpoint due at the same boundary never holds diverged weights.
  """

  def __init__(self, learning_rate: float):
    self.learning_rate = learning_rate

  def __call__(self, boundary: Boundary) -> None:
    for step, loss in boundary.synced_steps():
      if not np.isfinite(loss):
        raise UserError(
          f'loss is {loss} at step {step}: lower config.learning_rate'
          f' (now {self.learning_rate})'
        )


class LogProgress(Action):
  """A progress line and scalars every `every` steps, and at the end.

  The rate covers the steps since the previous line, on the training clock.
  `scalars(step, values)` records them (TensorBoard, in the trainer).
  """

  needs_losses = True

  def __init__(
    self,
    every: int,
    clock: Clock,
    scalars: Callable[[int, dict[str, float]], None],
  ):
    self.every, self.clock, self.scalars = every, clock, scalars
    self._window = (0, 0.0)

  def begin(self, step: int) -> None:
    self._window = (step, self.clock.now())

  def due(self, first: int, last: int, end: int) -> bool:
    return crossed(self.every, first, last) or last == end

  def __call__(self, boundary: Boundary) -> None:
    step0, time0 = self._window
    rate = (boundary.last - step0) / max(boundary.time - time0, 1e-9)
    self._window = (boundary.last, boundary.time)
    for step, loss in boundary.synced_steps():
      if step % self.every == 0 or step == boundary.end:
        print(
          f'step {step:>6}/{boundary.end}  loss {loss:.4f}  {rate:,.0f} steps/s'
        )
        self.scalars(step, {'train/loss': loss, 'perf/steps_per_second': rate})
