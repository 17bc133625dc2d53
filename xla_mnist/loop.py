"""The training loop: calls of up to K steps, and the rules of every boundary.

The loop owns what every boundary needs, in a fixed order: the training
clock and the compile's accounting; the check that every loss it waits for
is finite, before anything else runs, so that no action ever records or
saves a diverged state; and the stop on a signal, agreed between workers at
a fixed cadence. What is optional (logging, checkpoints) is an `Action`: a
function of the boundary with a cadence, as orbit's actions are callables on
the loop's output. Every cadence is one question, `crossed`: a call of K
steps may jump over a multiple of N, and must still count as reaching it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UserError

# Steps between the workers' agreements on whether to stop (signals.py says
# what one costs).
AGREE_EVERY = 100


def crossed(every: int, first: int, last: int) -> bool:
  """Whether steps `first..last` (1-based, inclusive) hold a multiple of
  `every`; never for `every` <= 0."""
  return every > 0 and last // every > (first - 1) // every


@dataclasses.dataclass(frozen=True)
class Program:
  """What the loop runs: `run(count)` trains `count` <= `steps_per_loop`
  steps in one call and returns their losses (a tensor of `count`, or one
  scalar for a single step). `warm_up` compiles without training, where the
  program can; otherwise its first call compiles."""

  run: Callable[[int], object]
  steps_per_loop: int
  warm_up: Callable[[], None] | None = None


class Clock:
  """Wall time less the `paused` spans: the training clock.

  Actions and the profiler's start and stop happen between calls but are not
  training: the loop pauses the clock around them.
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

  `losses` holds the finite losses of steps `synced_from..last`, waited for
  because a due action asked for them; None when none did. `final` marks the
  last boundary: the end, or a stop on a signal.
  """

  first: int
  last: int
  end: int
  losses: np.ndarray | None = None
  synced_from: int = 0
  time: float = 0.0  # The training clock, once the losses were waited for.
  timed_from: int = 0  # The step after which the training clock started.
  timed_start: float = 0.0  # The training clock then.
  final: bool = False

  def synced_steps(self) -> Iterator[tuple[int, float]]:
    """(step, loss) for each synced step."""
    if self.losses is None:
      return iter(())
    steps = range(self.synced_from, self.last + 1)
    return zip(steps, self.losses.tolist(), strict=True)


@dataclasses.dataclass(frozen=True)
class Action:
  """`fn(boundary)` at each boundary whose call crossed a multiple of
  `every`, and at the final one (`every` = 0: there only)."""

  fn: Callable[[Boundary], None]
  every: int = 0
  losses: bool = False  # The boundary must carry the losses.
  until: int = 0  # > 0: due only at calls that begin by this step.

  def due(self, first: int, last: int, final: bool) -> bool:
    early = not self.until or first <= self.until
    return final or (early and crossed(self.every, first, last))


# Wraps one call of steps first..last; yields True when the call must finish
# inside it (a profiler's step marker must span the work). Its third argument
# is the clock's `paused`, for work around the call that is not training.
CallWrapper = Callable[
  [int, int, Callable[[], contextlib.AbstractContextManager]],
  contextlib.AbstractContextManager[bool],
]


@dataclasses.dataclass(frozen=True)
class LoopStats:
  compile_seconds: float  # The warm-up, or the first call (one step in it).
  train_seconds: float  # The calls after that, on the training clock.
  paused_seconds: float  # Actions and profiler work between calls.
  timed_steps: int  # The steps `train_seconds` covers.
  last_step: int  # The end, or the step a signal stopped the run after.
  last_loss: float
  stopped_by: int = 0  # The signal every worker stopped on; 0 if none.

  def timing(self, measured: bool = True) -> dict[str, float | None]:
    """The time figures by their result names; None for what was not
    measured: all of them, or the rate when every step compiled."""
    timed = measured and self.timed_steps > 0
    return {
      'compile_seconds': self.compile_seconds if measured else None,
      'train_seconds': self.train_seconds if timed else None,
      'paused_seconds': self.paused_seconds if measured else None,
      'steps_per_second': (
        self.timed_steps / max(self.train_seconds, 1e-9) if timed else None
      ),
    }


class Diverged(UserError):
  """A loss that is not finite: the learning rate is too high."""


class Loop:
  """Runs `program` from step `start` to `end`, with `actions` between calls.

  `begin()` is called once, when compiling is over and training begins.
  `signal()` says which signal asked to stop (0: none). Alone, it is read at
  every boundary; with `agree` (a collective that returns the largest value
  any worker passed), it is agreed on every `agree_every` steps and at the
  end, at the same steps on every worker, so that they stop together. On a
  stop, the boundary is final: the actions run (a save), and the stats say
  which signal stopped the run.
  """

  def __init__(
    self,
    program: Program,
    actions: Sequence[Action] = (),
    *,
    learning_rate: float,
    wrappers: Sequence[CallWrapper] = (),
    begin: Callable[[], None] = lambda: None,
    signal: Callable[[], int] = lambda: 0,
    agree: Callable[[int], int] | None = None,
    agree_every: int = AGREE_EVERY,
  ):
    self.program = program
    self.actions = tuple(actions)
    self.clock = Clock()
    self._learning_rate = learning_rate
    self._wrappers = tuple(wrappers)
    self._begin = begin
    self._signal, self._agree, self._agree_every = signal, agree, agree_every
    self._pending: list[tuple[int, object]] = []  # (first step, losses)
    self._last_loss = float('nan')

  def run(self, start: int, end: int) -> LoopStats:
    """Trains steps `start + 1..end`; raises Diverged on a non-finite loss."""
    clock = self.clock
    compile_seconds = self._warm_up()
    if self.program.warm_up:
      self._begin()
    timed_from, timed_start, step, signum = start, clock.now(), start, 0
    while step < end and not signum:
      first, last = step + 1, min(step + self.program.steps_per_loop, end)
      call_start = clock.now()
      self._call(first, last)
      step = last
      if first == start + 1 and not self.program.warm_up:
        np.asarray(self._pending[-1][1])  # It compiled: wait, untimed.
        timed_from, timed_start = last, clock.now()
        compile_seconds = timed_start - call_start
        self._begin()
      signum = self._stop_signal(first, last, end)
      boundary = Boundary(
        first, last, end, timed_from=timed_from, timed_start=timed_start,
        final=last == end or bool(signum),
      )  # fmt: skip
      self._act(boundary)
    self._sync()
    return LoopStats(
      compile_seconds=compile_seconds,
      train_seconds=clock.now() - timed_start,
      paused_seconds=clock.paused_seconds,
      timed_steps=step - timed_from,
      last_step=step,
      last_loss=self._last_loss,
      stopped_by=signum,
    )

  def _warm_up(self) -> float:
    if not self.program.warm_up:
      return 0.0
    began = time.perf_counter()
    self.program.warm_up()
    return time.perf_counter() - began

  def _call(self, first: int, last: int) -> None:
    with contextlib.ExitStack() as stack:
      wait = [
        stack.enter_context(w(first, last, self.clock.paused))
        for w in self._wrappers
      ]
      losses = self.program.run(last - first + 1)
      if any(wait):
        losses = np.asarray(losses)
    self._pending.append((first, losses))

  def _stop_signal(self, first: int, last: int, end: int) -> int:
    """The signal to stop on after this call; 0 to go on."""
    if self._agree is None:
      return self._signal()
    if crossed(self._agree_every, first, last) or last == end:
      # A collective: every worker reaches it at the same steps.
      return self._agree(self._signal())
    return 0

  def _act(self, boundary: Boundary) -> None:
    due = [
      a
      for a in self.actions
      if a.due(boundary.first, boundary.last, boundary.final)
    ]
    if any(a.losses for a in due):
      synced_from, losses = self._sync()
      boundary = dataclasses.replace(
        boundary,
        losses=losses,
        synced_from=synced_from,
        time=self.clock.now(),
      )
    with self.clock.paused():
      for action in due:
        action.fn(boundary)

  def _sync(self) -> tuple[int, np.ndarray | None]:
    """Waits for the pending calls; returns (their first step, losses).

    Raises Diverged at the first loss that is not finite.
    """
    if not self._pending:
      return 0, None
    first = self._pending[0][0]
    values = np.concatenate([np.reshape(v, -1) for _, v in self._pending])
    self._pending.clear()
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
      raise Diverged(
        f'loss is {values[bad[0]]} at step {first + bad[0]}: lower'
        f' {errors.field("learning_rate")} (now {self._learning_rate})'
      )
    self._last_loss = float(values[-1])
    return first, values


class LogProgress:
  """A progress line and scalars every `every` steps, and at the end.

  The rate covers the steps since the previous line, on the training clock.
  `report(step, loss, rate)` shows them (the run's `Reporter`).
  """

  def __init__(
    self, every: int, report: Callable[[int, int, float, float], None]
  ):
    self.every, self._report = every, report
    self._window: tuple[int, float] | None = None

  def action(self) -> Action:
    return Action(self, self.every, losses=True)

  def __call__(self, boundary: Boundary) -> None:
    step0, time0 = self._window or (boundary.timed_from, boundary.timed_start)
    rate = (boundary.last - step0) / max(boundary.time - time0, 1e-9)
    self._window = (boundary.last, boundary.time)
    for step, loss in boundary.synced_steps():
      if step % self.every == 0 or step == boundary.last and boundary.final:
        self._report(step, boundary.end, loss, rate)
