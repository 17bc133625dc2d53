"""The loop over calls of K steps: cadences, actions, time, on a program of
plain Python, so that what is tested is the loop alone; and the stop on a
signal's hand-over with the CLI."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from xla_mnist import loop
from xla_mnist.runtime import errors, signals
from xla_mnist.runtime.errors import UserError


@pytest.mark.parametrize(
  'every, first, last, expected',
  [
    (100, 1, 100, True),  # Reached exactly.
    (100, 1, 99, False),
    (100, 95, 105, True),  # Jumped over by a call of 11 steps.
    (100, 101, 199, False),
    (7, 8, 13, False),
    (7, 8, 14, True),
    (1, 5, 5, True),  # Every step.
    (0, 1, 1000, False),  # 0: never.
    (500, 121, 220, False),  # A resume at 120: the next multiple is 500.
  ],
)
def test_crossed_asks_whether_a_call_holds_a_multiple(
  every, first, last, expected
):
  assert loop.crossed(every, first, last) is expected


class Counting:
  """A program whose step i has loss i: the loop's bookkeeping shows."""

  def __init__(self, k: int, warm_up: bool = True):
    self.step, self.calls = 0, []
    self.program = loop.Program(self.run, k, self.warm_up if warm_up else None)
    self.warmed = False

  def run(self, count: int) -> np.ndarray:
    self.calls.append(count)
    losses = np.arange(self.step + 1, self.step + count + 1, dtype=float)
    self.step += count
    return losses

  def warm_up(self) -> None:
    self.warmed = True


class Record:
  """An action that notes the boundaries at which it ran, and what it saw."""

  def __init__(self, every: int, losses: bool = True):
    self.every, self.losses = every, losses
    self.seen: list[tuple[int, int, list]] = []
    self.finals: list[bool] = []

  def action(self) -> loop.Action:
    return loop.Action(self, self.every, self.losses)

  def __call__(self, boundary: loop.Boundary) -> None:
    self.seen.append(
      (boundary.first, boundary.last, list(boundary.synced_steps()))
    )
    self.finals.append(boundary.final)


def run(program, *records, **kwargs) -> loop.LoopStats:
  start, end = kwargs.pop('start', 0), kwargs.pop('end', 100)
  actions = [r.action() for r in records]
  return loop.Loop(program, actions, learning_rate=0.5, **kwargs).run(
    start, end
  )


@pytest.mark.parametrize('k', [1, 7, 100])
@pytest.mark.parametrize('start', [0, 13, 500])
def test_actions_are_due_where_their_cadence_is_crossed(k, start):
  end = 1000
  counting = Counting(k)
  counting.step = start
  log, save = Record(100), Record(250, losses=False)
  stats = run(counting.program, log, save, start=start, end=end)
  assert sum(counting.calls) == end - start
  assert all(c <= k for c in counting.calls)
  lasts = list(np.cumsum([start, *counting.calls])[1:])
  # Due exactly at the first boundary at or past each multiple, and the end.
  for action, every in ((log, 100), (save, 250)):
    multiples = [m for m in range(every, end + 1, every) if m > start]
    expected = {next(b for b in lasts if b >= m) for m in multiples} | {end}
    assert [last for _, last, _ in action.seen] == sorted(expected)
    assert action.finals == [last == end for _, last, _ in action.seen]
  # Losses are waited for only when an action needs them; every step once.
  synced = [s for _, _, steps in log.seen for s, _ in steps]
  assert synced == list(range(start + 1, end + 1))
  assert all(loss == s for _, _, steps in log.seen for s, loss in steps)
  assert stats.last_loss == end and stats.last_step == end
  assert stats.timed_steps == end - start  # Warmed up: every step timed.
  assert stats.stopped_by == 0


def test_losses_wait_until_an_action_needs_them():
  save = Record(250, losses=False)
  stats = run(Counting(10).program, save, end=1000)
  assert all(steps == [] for _, _, steps in save.seen)
  assert stats.last_loss == 1000  # The loop waits for the rest at the end.


def test_without_a_warm_up_the_first_call_is_the_compile():
  counting = Counting(10, warm_up=False)
  log = Record(10)
  seen = []
  timed = loop.Action(lambda b: seen.append(b.timed_from), every=10)
  stats = loop.Loop(
    counting.program, [log.action(), timed], learning_rate=0.5
  ).run(0, 95)
  assert stats.timed_steps == 85  # The first call's 10 steps compiled.
  assert set(seen) == {10}  # Every boundary knows where timing began.
  # Waiting for the compiling call hides none of its losses from actions.
  synced = [s for _, _, steps in log.seen for s, _ in steps]
  assert synced == list(range(1, 96))
  assert stats.compile_seconds >= 0 and stats.train_seconds >= 0


def test_nothing_to_run_runs_nothing():
  counting = Counting(10)
  stats = run(counting.program, Record(10), start=50, end=50)
  assert counting.calls == [] and stats.timed_steps == 0
  assert np.isnan(stats.last_loss)


def test_paused_time_is_not_training_time():
  clock = loop.Clock()
  with clock.paused():
    pass
  before = clock.paused_seconds
  assert before >= 0
  start = clock.now()
  with clock.paused():
    for _ in range(10**5):
      pass
  assert clock.paused_seconds > before
  assert clock.now() - start < clock.paused_seconds - before + 0.05


def test_actions_run_on_paused_time():
  def slow(_: loop.Boundary) -> None:
    for _ in range(10**5):
      pass

  the_loop = loop.Loop(
    Counting(10).program, [loop.Action(slow, every=10)], learning_rate=0.5
  )
  stats = the_loop.run(0, 100)
  assert stats.paused_seconds > 0
  assert stats.paused_seconds == the_loop.clock.paused_seconds


class Diverging(Counting):
  def run(self, count: int) -> np.ndarray:
    losses = super().run(count)
    return np.where(losses >= 42, np.nan, losses)


def test_the_loop_stops_on_a_non_finite_loss_with_no_action_present():
  with pytest.raises(loop.Diverged) as error:
    loop.Loop(Diverging(10).program, learning_rate=50.0).run(0, 100)
  assert str(error.value) == (
    'loss is nan at step 42: lower config.learning_rate (now 50.0)'
  )
  assert error.value.exit_code == 1
  assert isinstance(error.value, UserError)


@pytest.mark.parametrize('order', ['save first', 'save last'])
def test_a_non_finite_loss_stops_the_run_before_any_action_at_that_boundary(
  order,
):
  saves = Record(50, losses=True)  # As the trainer's save asks.
  other = Record(50, losses=False)
  records = (saves, other) if order == 'save first' else (other, saves)
  with pytest.raises(loop.Diverged):
    run(Diverging(10).program, *records)
  assert saves.seen == [] and other.seen == []  # Never at step 50.


def test_progress_lines_at_the_log_cadence():
  shown = []
  log = loop.log_progress(30, lambda *args: shown.append(args))
  loop.Loop(Counting(25).program, [log], learning_rate=0.5).run(0, 100)
  assert [(step, end) for step, end, _, _ in shown] == [
    (30, 100),
    (60, 100),
    (90, 100),
    (100, 100),
  ]
  assert shown[0][2] == 30.0
  assert all(rate > 0 for *_, rate in shown)


def test_a_signal_stops_at_the_next_boundary_after_a_final_save():
  counting = Counting(10)
  save = Record(1000, losses=True)
  signals = iter([0, 0, 15])  # Asked to stop during the third call.
  stats = run(counting.program, save, end=100, signal=lambda: next(signals))
  assert stats.stopped_by == 15 and stats.last_step == 30
  assert sum(counting.calls) == 30
  assert [last for _, last, _ in save.seen] == [30]  # Saved where it stopped.
  assert save.finals == [True]


def test_workers_agree_at_a_fixed_cadence_only():
  asked = []

  def agree(signum: int) -> int:
    asked.append(signum)
    return 2 if len(asked) == 2 else 0  # Another worker was signalled.

  counting = Counting(7)
  stats = run(
    counting.program, Record(1000), end=400, signal=lambda: 0, agree=agree,
    agree_every=100,
  )  # fmt: skip
  # Asked at the calls that crossed 100 and 200, never in between.
  assert len(asked) == 2
  assert stats.stopped_by == 2 and stats.last_step == 203


# The stop request's hand-over with the CLI's signal handler, in this process.


@pytest.fixture
def cli_handlers():
  """The CLI's handler on every stop signal, as `cli.unwind_on_signals`."""
  before = {s: signal.getsignal(s) for s in errors.STOP_SIGNALS}
  for signum in errors.STOP_SIGNALS:
    signal.signal(signum, errors.interrupt)
  yield
  for signum, handler in before.items():
    signal.signal(signum, handler)


def test_before_training_begins_a_signal_ends_the_run_at_once(cli_handlers):
  with signals.StopRequest() as stop:
    with pytest.raises(errors.Interrupted) as interrupted:
      os.kill(os.getpid(), signal.SIGTERM)
  assert interrupted.value.exit_code == 128 + signal.SIGTERM
  assert stop.signum == 0
  assert signal.getsignal(signal.SIGTERM) is errors.interrupt


def test_once_training_began_a_signal_waits_for_a_save_and_a_second_does_not(
  cli_handlers,
):
  with signals.StopRequest() as stop:
    stop.begin()  # As the loop calls it once compiling is over.
    os.kill(os.getpid(), signal.SIGUSR1)  # Slurm's --signal=USR1@120.
    assert stop.signum == signal.SIGUSR1
    with pytest.raises(errors.Interrupted):
      os.kill(os.getpid(), signal.SIGUSR1)


def test_a_signal_the_process_ignores_stays_ignored(cli_handlers):
  signal.signal(signal.SIGHUP, signal.SIG_IGN)  # As nohup starts a run.
  with signals.StopRequest() as stop:
    stop.begin()  # As the loop calls it once compiling is over.
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGHUP)
    assert stop.signum == 0


def test_workers_keep_a_signal_before_training_for_their_agreement(
  cli_handlers,
):
  with signals.StopRequest(alone=False) as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signum == signal.SIGTERM  # Kept: the workers stop together.


def test_the_loop_begins_once_after_its_compile():
  begun = []
  for warm_up in (True, False):
    counting = Counting(10, warm_up=warm_up)
    loop.Loop(
      counting.program, learning_rate=0.5, begin=lambda: begun.append(1)
    ).run(0, 50)
  assert begun == [1, 1]


def test_an_action_until_a_step_waits_for_no_call_after_it():
  head = Record(1)
  head_action = loop.Action(head, every=1, losses=True, until=10)
  counting = Counting(4)
  loop.Loop(counting.program, [head_action], learning_rate=0.5).run(0, 40)
  # Calls 1-4, 5-8, 9-12 begin by step 10; then only the last boundary.
  assert [last for _, last, _ in head.seen] == [4, 8, 12, 40]
