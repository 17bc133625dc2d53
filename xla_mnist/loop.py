"""The training loop: calls of up to K steps, and the rules of every boundary:
the training clock, the check that every loss waited for is finite before
any action runs (so none records or saves a diverged state), the stop on a
signal. The rest (logging, checkpoints) are `Action`s, as orbit's; a cadence
asks `crossed`, since a call of K steps may jump over a multiple of N."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UserError

AGREE_EVERY = 100  # Steps between workers' stop agreements (cost: signals.py).


def crossed(every: int, first: int, last: int) -> bool:
  """Whether steps `first..last` (inclusive) hold a multiple of `every` > 0."""
  return every > 0 and last // every > (first - 1) // every


def started(items: Iterable) -> Iterator:
  """`items` with its first element made: set-up (the first epoch's order,
  tf.data's pipeline start), not training, before the loop's clock starts."""
  iterator = iter(items)
  return itertools.chain([next(iterator)], iterator)


@dataclasses.dataclass(frozen=True)
class Program:
  """`run(count)` trains `count` <= `steps_per_loop` steps in one call, and
  returns their losses; `warm_up`, where the program has one, compiles."""

  run: Callable[[int], object]
  steps_per_loop: int
  warm_up: Callable[[], None] | None = None


class Clock:
  """The training clock: wall time less the `paused` spans."""

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
  """The end of a call of steps `first..last`; `losses` (steps `synced_from..`)
  if a due action asked for them; `final`: the end, or a stop on a signal."""

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


# Wraps a call of steps first..last, given the clock's `paused`; yields True
# when the call must finish inside it (a profiler's step marker spans it).
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
    """The time figures by their result names; None where not measured."""
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
  """Runs `program` with `actions` between calls; `begin()` once compiling
  is over. `signal()` names a signal to stop on (0: none), read at every
  boundary, or with `agree` (a collective: the largest any worker passed)
  every `agree_every` steps and at the end, so that workers stop together.
  A stop makes the boundary final: the actions run (a save)."""

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
    compile_seconds = 0.0
    if self.program.warm_up:
      began = time.perf_counter()
      self.program.warm_up()
      compile_seconds = time.perf_counter() - began
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
        boundary, losses=losses, synced_from=synced_from, time=self.clock.now()
      )
    with self.clock.paused():
      for action in due:
        action.fn(boundary)

  def _sync(self) -> tuple[int, np.ndarray | None]:
    """Waits for the pending calls; Diverged at a loss that is not finite."""
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


def log_progress(
  every: int, report: Callable[[int, int, float, float], None]
) -> Action:
  """`report(step, end, loss, rate)` every `every` steps and at the end;
  the rate is over the steps since the previous line, on the training clock."""
  previous: tuple[int, float] | None = None  # The last line's step, time.

  def log(b: Boundary) -> None:
    nonlocal previous
    step0, time0 = previous or (b.timed_from, b.timed_start)
    rate = (b.last - step0) / max(b.time - time0, 1e-9)
    previous = (b.last, b.time)
    for step, loss in b.synced_steps():
      if step % every == 0 or step == b.last and b.final:
        report(step, b.end, loss, rate)

  return Action(log, every, losses=True)
