"""The comparison: one recipe trained in every jit mode, timed and profiled,
the figures side by side, and why one mode's step is faster than another's.

`compare` is the function a notebook calls and the command maps its flags
onto. Each run is its own `python -m xla_mnist.train` process, because
auto-clustering is process-wide and a whole process is what is timed: `off`,
`on` and `auto` call the compiled step once per batch, `fused` runs the XLA
loop of `steps_per_loop` steps per call. `train_flags` go to every run (the
runs compile with no XLA cache unless they name one). Each model's modes
train, in this order:

- probed (with a `time_budget`): one fused call of MIN_PER_CALL steps,
  which sizes the fused mode's calls so that two fit the budget (at most
  the config's K, at least MIN_PER_CALL: fewer would be no XLA loop);
- profiled: one fused call unprofiled after the compile, then a window of
  `--config.profile_steps` steps (default: two fused calls), read into its
  `breakdown.json` and explained with the timed run (`why.explain`);
- timed, without the profiler, which slows what it traces, `repeats` times
  (the modes in turn, so that a slow spell of a shared machine falls on
  every mode): its run of median speed gives the figures (`why.Timed`).
  Each timed run holds the steps that fit `time_budget` seconds at its
  profiled run's speed (whole calls, two at least), at most the config's.

Why a budget, and why this way. A fixed count of steps costs whatever a
step costs: the CNN's fused loop (about 1 s a step on XLA:CPU) made one
comparison take a quarter of an hour. Google Benchmark and pytest-benchmark
time a case for a time budget instead; compare does the same with what it
can see from outside a run, the speed of an earlier run of the same mode,
because a run's training loop has no clock to stop on. The profiled run
comes first since it measures that speed anyway (slower than timed, under
the profiler, so the timed runs stay within the budget); only the fused
mode's calls must be sized before any run of it, hence its probe of one
short call, whose folder the timed runs replace. A mode the budget cut says
so: its `cut_from` in compare.json, a sentence under the page's tables; its
loss is not compared with the others' (`why.outcomes`). Runs stay a process
each, though each pays TF's start-up: in a process shared with earlier runs,
a run's peak memory holds what they left resident (a reset of the peak
clears the peak, not that) and off's first call, its compile figure, finds
their set-up ready (measured: docs/speed.md, "Start-up").

`sweep` times every mode again at other batch sizes; `by` compares every
mode again (timed and profiled) for each value of each field it names
(`model`, `optimizer`, `learning_rate`...), only that field changed, each
value with its verdict (`by_field`). Each run writes its usual outputs to
`<workdir>/<mode>`, `<workdir>/profiled/<mode>`,
`<workdir>/sweep/batch_size-<N>/<mode>` and `<workdir>/<field>/<value>/...`
(the main runs' layout); the comparison, a `Comparison`,
goes to `<workdir>/compare.{md,json,png}` (`Comparison.from_json` reads it
back) and to TensorBoard's Text tab; `page` writes it as a docs page too.

`fit` trains the main runs' recipe by Keras's own `model.fit` too
(`keras_fit`, a process each as well) at the loop's settings, off, on and
fused as `jit_compile` False, True, and True with `steps_per_execution` the
fused runs' K, probed by them: measured as the modes are, into
`<workdir>/fit/...`, its `Fit` beside the modes.

This module reads no config: the recipe's parse and check are the caller's
`check` (the command's `checked`, over `parse.config_of`), so that the
inspection layer imports nothing of the recipe. Imports no TensorFlow
before the runs: compare starts fast and fails fast.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.machinery
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence

from xla_mnist import parse
from xla_mnist.inspection import breakdown, by_field, keras_fit, why
from xla_mnist.runtime import console, env, errors, layout
from xla_mnist.runtime.errors import Interrupted, UsageError, UserError
from xla_mnist.workdir import files, markdown, outputs, recorded


@dataclasses.dataclass(frozen=True)
class Mode:
  name: str
  flags: tuple[str, ...]  # Given to the training run after the user's flags.
  module: str = 'xla_mnist.train'  # The run's `python -m`.


FUSED = Mode('fused', ('--jit=on',))  # The one mode of K steps a call.
MODES = (
  Mode('off', ('--jit=off', '--config.steps_per_loop=1')),
  Mode('on', ('--jit=on', '--config.steps_per_loop=1')),
  Mode('auto', ('--jit=auto', '--config.steps_per_loop=1')),
  FUSED,
)
# Seconds of steps a timed run holds at most: the softmax's runs (1,000
# steps, under a second each) keep all their steps on a loaded machine too,
# where a profiled auto run measured 3.6 ms a step (2 s cut it to 560); a
# mode a hundred times slower runs seconds, not minutes.
TIME_BUDGET = 4.0
MIN_CALLS = 2  # A timed run's fewest calls: one timed, in a per-step mode.
# The fused mode's fewest steps a call: a call of one step is the per-step
# program (`program.make`), no XLA loop; its probe runs one call of these.
MIN_PER_CALL = 2
# Keras's `fit` at the loop's settings but auto's (`keras_fit`): off is
# jit_compile=False, on True, fused True with steps_per_execution=K.
FIT_MODES = tuple(
  Mode(m.name, m.flags, keras_fit.__name__) for m in MODES if m.name != 'auto'
)
FIT = 'fit'  # Their folder, and compare.json's key.
FILES = ('compare.md', 'compare.json', 'compare.png')
# What compare writes into its workdir: anything else is not its own.
OWN = {
  *FILES,
  *(m.name for m in MODES),
  'profiled',
  'sweep',
  FIT,
  layout.LOCK_FILE,
}
WINDOW = '--config.profile_steps'  # The profiled runs' window; 0 when timed.
# Unless the user's say otherwise, XLA really compiles: no load from a cache.
NO_CACHE = '--xla_cache_dir='
# The fused probe's run: one call of MIN_PER_CALL steps, timed (`_measured`).
PROBE = (f'{WINDOW}=0', f'--config.num_steps={MIN_PER_CALL}')
# The run's figures that tell the modes apart, as `outputs.FIGURES` words them.
TABLED = ('compile_seconds', 'train_seconds', 'steps_per_second', 'final_loss')


@dataclasses.dataclass(frozen=True)
class Checked:
  """What compare needs of one run's config, checked as train checks it."""

  num_steps: int
  batch_size: int
  steps_per_loop: int  # K as the run takes it: the config's 0 resolved.
  asked_steps_per_loop: int  # K before the run's steps cap it.
  dataset: str
  idx_dir: str
  image_dir: str
  model: str


# A run's train flags -> its checked config; UserError when train would
# refuse them.
Check = Callable[[list[str]], Checked]


@dataclasses.dataclass(frozen=True)
class Sweep:
  points: list[why.SweepPoint]
  crossovers: list[str]  # `why.crossovers`, in words.


@dataclasses.dataclass(frozen=True)
class Fit:
  """Keras's `fit` at the loop's settings (`FIT_MODES`), timed and profiled
  as the loop's modes are, and what its default `jit_compile` picks."""

  results: dict[str, why.Timed]
  figures: dict[str, why.Figures]
  auto: keras_fit.AutoPick


@dataclasses.dataclass(frozen=True)
class Comparison:
  """What compare measured: `compare.json`, written from it and read back."""

  title: str
  measured: str  # `why.header`: the machine, versions and date.
  flags: list[str]  # The train flags every run got.
  profiled_steps: int
  results: dict[str, why.Timed]  # Per mode, in MODES' order.
  figures: dict[str, why.Figures]  # compare.json: each result's `breakdown`.
  sweep: Sweep | None
  # Every mode compared again per value of each swept field.
  by: list[by_field.Swept] | None = None
  time_budget: float = 0.0  # Seconds a timed run holds at most; 0: none.
  fit: Fit | None = None  # None: not asked (or before fit was compared).

  def to_json(self) -> str:
    report = {
      'title': self.title,
      'measured': self.measured,
      'flags': self.flags,
      'profiled_steps': self.profiled_steps,
      'time_budget': self.time_budget,
      'results': _runs_json(self.results, self.figures),
      'sweep': self.sweep and dataclasses.asdict(self.sweep),
      'by': self.by
      and [
        {
          'field': swept.field,
          'values': [
            {
              'value': v.value,
              'verdict': by_field.finding(v),
              'results': _runs_json(v.results, v.figures),
            }
            for v in swept.runs
          ],
        }
        for swept in self.by
      ],
      FIT: self.fit
      and {
        'auto': dataclasses.asdict(self.fit.auto),
        'verdict': why.fit_verdict(
          self.fit.figures, self.figures, self.fit.auto.picks
        ),
        'results': _runs_json(self.fit.results, self.fit.figures),
      },
    }
    return json.dumps(report, indent=2) + '\n'

  @classmethod
  def from_json(cls, text: str) -> Comparison:
    report = json.loads(text)
    sweep = report['sweep'] and Sweep(
      [why.SweepPoint.from_dict(p) for p in report['sweep']['points']],
      report['sweep']['crossovers'],
    )
    results, figures = _runs(report['results'])
    return cls(
      title=report['title'],
      measured=report['measured'],
      flags=report['flags'],
      profiled_steps=report['profiled_steps'],
      results=results,
      figures=figures,
      sweep=sweep,
      by=_by_fields(report),
      fit=(fit := report.get(FIT))
      and Fit(*_runs(fit['results']), keras_fit.AutoPick(**fit['auto'])),
      time_budget=report.get('time_budget', 0.0),  # None before budgets.
    )

  @classmethod
  def load(cls, workdir: str) -> Comparison:
    """The comparison an earlier compare wrote into `workdir`."""
    with open(os.path.join(workdir, layout.COMPARE_FILE)) as f:
      return cls.from_json(f.read())

  def text(self) -> str:
    """The table, whether the modes ended apart, the why, the sweep and
    each swept field's values."""
    runs = {name: t.run for name, t in self.results.items()}
    points = self.sweep and self.sweep.points
    text = (
      f'{table(self.results, self.time_budget)}\n\n'
      f'{why.markdown(runs, self.figures, points, why.cut_modes(self.results))}'
    )
    first = self.results[why.BASE].run
    if self.fit:
      text += '\n' + why.fit_markdown(
        self.fit.results,
        self.fit.figures,
        self.figures,
        self.fit.auto.picks,
        self.fit.auto.said(),
      )
    for swept in self.by or []:
      main = _value(first, swept.field)
      text += f'\n{by_field.markdown(swept, main, self.time_budget)}'
    return text


def _by_fields(report: Mapping) -> list[by_field.Swept] | None:
  """compare.json's swept fields read back (an older one's `models` too)."""
  if report.get('models'):  # Before any field but the model was swept.
    values = [{**m, 'value': m['model']} for m in report['models']]
    report = {'by': [{'field': why.MODEL, 'values': values}]}
  return report.get('by') and [
    by_field.Swept(
      swept['field'],
      [
        by_field.ValueRuns(v['value'], *_runs(v['results']))
        for v in swept['values']
      ],
    )
    for swept in report['by']
  ]


def _runs_json(
  results: Mapping[str, why.Timed], figures: Mapping[str, why.Figures]
) -> dict[str, dict]:
  """Each mode's timed run, its repeats and its breakdown, for JSON."""
  return {
    name: {
      **dataclasses.asdict(t.run),
      'repeats': dataclasses.asdict(t.repeats),
      'cut_from': t.cut_from and dataclasses.asdict(t.cut_from),
      'breakdown': dataclasses.asdict(figures[name]),
    }
    for name, t in results.items()
  }


def _runs(
  report: Mapping[str, dict],
) -> tuple[dict[str, why.Timed], dict[str, why.Figures]]:
  """`_runs_json`'s output read back."""
  results, figures = {}, {}
  for name, r in report.items():
    own = ('repeats', 'cut_from', 'breakdown')
    run = {k: v for k, v in r.items() if k not in own}
    cut = r.get('cut_from')  # None, or absent before budgets.
    results[name] = why.Timed(
      outputs.Result(**run),
      why.Repeats(**r['repeats']),
      cut and why.Asked(**cut),
    )
    figures[name] = why.Figures.from_dict(r['breakdown'])
  return results, figures


class RunFailed(UserError):
  """A training run failed; compare exits with the run's exit code."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


def compare(
  train_flags: Sequence[str],
  workdir: str,
  *,
  check: Check,
  repeats: int = 3,
  sweep: Sequence[int] | None = None,
  by: Mapping[str, Sequence[why.Value]] | None = None,
  page: str | None = None,
  say: Callable[[str], object] = console.say,
  time_budget: float = TIME_BUDGET,
  fit: bool = True,
) -> Comparison:
  """Trains and profiles every mode (and times the sweep's sizes, and
  compares again each value of each field of `by`, {field: values}, as
  `--config.FIELD=VALUE` takes it) with `train_flags`,
  writes the comparison into `workdir` (and `page`), and returns it. Every
  run's flags pass `check` before the first run starts; `say` takes the
  progress lines; a timed run holds about `time_budget` seconds of steps at
  most (0: the config's steps, whatever they cost). `fit`: Keras's own
  `fit` too, at the loop's settings (`FIT_MODES`), for the main runs."""
  train_flags = list(train_flags)
  if type(repeats) is not int or repeats < 1:
    raise UsageError(
      f'{errors.arg("repeats", repeats)}: pass a whole number of timed runs'
      ' per mode, 1 or more'
    )
  if (
    type(time_budget) not in (int, float)
    or not math.isfinite(time_budget)
    or time_budget < 0
  ):
    raise UsageError(
      f'{errors.arg("time_budget", time_budget)}: pass the seconds of steps'
      " a timed run may hold, or 0 for the config's steps"
    )
  if _given('--jit', train_flags):
    raise UsageError('compare runs every jit mode: drop --jit')
  sizes = sorted(set(sweep)) if sweep else None
  by = {f: list(dict.fromkeys(v)) for f, v in (by or {}).items() if v}
  window = _window(train_flags)
  train_flags = parse.without(WINDOW, train_flags)
  asked = _check_runs(train_flags, window, sizes, by, check, time_budget)
  if page:
    _check_page(page)
  outputs.prepare_workdir(workdir)
  with files.workdir_lock(workdir):
    _check_own(workdir, by)
    plan = Plan(train_flags, repeats, window, time_budget, say)
    results, figures, profiled = _measured(plan, workdir, asked)
    points = sizes and _swept(plan, workdir, results, asked, sizes)
    first = results['off'].run
    main = _value(first, why.MODEL)
    done = Comparison(
      title=(
        f'{first.dataset}, {main}, {asked.steps} steps of'
        f' {first.batch_size}, {first.device}'
      ),
      measured='',  # `_write` says when, with TF's version.
      flags=train_flags,
      profiled_steps=profiled,
      results=results,
      figures=figures,
      sweep=points and Sweep(points, why.crossovers(points)),
      by=[
        _by_value(plan, workdir, (results, figures), asked, field, values)
        for field, values in by.items()
      ]
      or None,
      time_budget=time_budget,
      fit=fit and _fitted(plan, workdir, results, asked),
    )
    return _write(workdir, page, done, say)


@dataclasses.dataclass(frozen=True)
class Plan:
  """How every model's runs are made: compare's arguments that they share."""

  train_flags: list[str]
  repeats: int
  window: int | None  # The user's profiled window; None: two fused calls.
  time_budget: float
  say: Callable[[str], object]


def per_call_within(budget: float, step_seconds: float, asked: int) -> int:
  """The fused mode's steps a call: MIN_CALLS calls within `budget` at
  `step_seconds` a step, MIN_PER_CALL steps at least and `asked` at most
  (no budget: `asked`)."""
  if not budget:
    return asked
  fit = int(budget / step_seconds) // MIN_CALLS
  return min(asked, max(MIN_PER_CALL, fit))


def steps_within(
  budget: float, step_seconds: float, per_call: int, asked: int
) -> int:
  """A timed run's steps: whole calls of `per_call` within `budget` at
  `step_seconds` a step, MIN_CALLS calls at least, `asked` at most (no
  budget: `asked`)."""
  if not budget:
    return asked
  calls = max(MIN_CALLS, int(budget / step_seconds) // per_call)
  return min(asked, calls * per_call)


def train(
  mode: Mode, train_flags: list[str], workdir: str, extra: tuple[str, ...]
) -> outputs.Result:
  """Runs `mode` in its own process; returns its result.

  `extra` follows the user's flags, so that it overrides them. The run is in
  a session of its own, so that a terminal's Ctrl-C reaches it once, through
  this process: each stop signal that reaches compare is passed on, and
  compare waits for the run to save and stop (a second signal stops it at
  once), then stops with the signal's exit code.
  """
  command = [
    sys.executable,
    '-m',
    mode.module,
    *_run_flags(mode, train_flags, extra),
    f'--workdir={workdir}',
  ]
  proc, stdout, stderr = _run(command, mode.name)
  lines = [line for line in stderr.splitlines() if line.strip()]
  if proc.returncode:
    raise RunFailed(
      f'the {mode.name} run failed (exit {proc.returncode}):'
      f' {lines[-1].strip() if lines else "no error output"}',
      exit_code=max(proc.returncode, 1),  # A signal's negative code is 1.
    )
  result, _ = recorded.load_result(os.path.join(workdir, outputs.RESULT_FILE))
  if WINDOW + '=0' not in extra and not result.profile:
    # The profiler failed, and training went on: its line says why.
    said = [line for line in stdout.splitlines() if 'profil' in line]
    raise UserError(
      f'the profiled {mode.name} run has no breakdown'
      f' ({said[-1].strip() if said else "no capture"}): run compare again'
    )
  return result


def _run_flags(
  mode: Mode, train_flags: list[str], extra: tuple[str, ...]
) -> list[str]:
  """The flags of `mode`'s run but its workdir, as `train` gives them."""
  return [
    *train_flags,  # --config=FILE must precede --config.x=... overrides.
    *extra,
    *(() if _given(NO_CACHE, train_flags) else (NO_CACHE,)),
    *mode.flags,
    '--fresh',  # Time a whole run, not what is left after a checkpoint.
  ]


def table(results: Mapping[str, why.Timed], time_budget: float = 0.0) -> str:
  """The runs as a Markdown table, and how they were timed (within
  `time_budget`); speed-up is steps/s over `off`'s, spread a mode's slowest
  run over its fastest."""
  figures = [outputs.FIGURES[name] for name in (*TABLED, 'test_accuracy')]
  base = results['off'].run.steps_per_second
  rows = []
  for mode, t in results.items():
    r, rate = t.run, t.run.steps_per_second
    rows.append(
      (
        mode,
        r.jit,
        r.steps_per_loop,
        outputs.measured(rate and 1e3 / rate, '.3f'),
        outputs.measured(rate and base and rate / base, '.2f', 'x'),
        f'{t.spread:.0%}' if len(t.repeats.steps_per_second) > 1 else '-',
        *(f.text(r) for f in figures),
        r.traces,
      )
    )
  text = markdown.table(
    (
      'mode',
      'jit',
      'steps/call',
      'ms/step',
      'vs off',
      'spread',
      *(f.label for f in figures),
      'traces',
    ),
    'll' + 'r' * (len(figures) + 5),
    rows,
  )
  n = len(results['off'].repeats.steps_per_second)
  runs = 'one timed run' if n == 1 else f'the median of {n} timed runs'
  budget = why.budget_note(results, time_budget)
  return (
    f'{text}\n\nTimed figures: {runs} per mode by speed (all of its figures'
    " are that run's), the modes in turn; spread:"
    " how much faster a mode's fastest run was than its slowest."
    + (f' {budget}' if budget else '')
  )


def _timed(
  plan: Plan,
  workdir: str,
  steps: Mapping[str, int],
  asked: why.Asked,
  extra: tuple[str, ...] = (),
  modes: tuple[Mode, ...] = MODES,
) -> dict[str, why.Timed]:
  """Every mode's timed runs (no profiler) of `steps[mode]` steps in
  `workdir/<mode>`, the modes in turn `plan.repeats` times, so that a slow
  spell of a shared machine falls on every mode; `asked`: the config's."""
  runs: dict[str, list[outputs.Result]] = {mode.name: [] for mode in modes}
  for i in range(plan.repeats):
    for mode in modes:
      plan.say(
        f'training {mode.name} in {workdir} ({i + 1}/{plan.repeats}) ...'
      )
      folder = os.path.join(workdir, mode.name)  # Each run replaces the last.
      sized = (f'--config.num_steps={steps[mode.name]}', f'{WINDOW}=0')
      runs[mode.name].append(
        train(mode, plan.train_flags, folder, (*extra, *sized))
      )
  return {
    mode.name: why.Timed.of(runs[mode.name], _asked(mode, asked))
    for mode in modes
  }


def _asked(mode: Mode, asked: why.Asked) -> why.Asked:
  """What the config asked of `mode`'s runs: one step a call but fused."""
  return (
    asked
    if mode.name == FUSED.name
    else dataclasses.replace(asked, steps_per_loop=1)
  )


def _measured(
  plan: Plan,
  workdir: str,
  asked: why.Asked,
  extra: tuple[str, ...] = (),
  modes: tuple[Mode, ...] = MODES,
) -> tuple[dict[str, why.Timed], dict[str, why.Figures], int]:
  """One model's `modes`, probed, profiled, then timed within the budget
  (see the top); returns the timed runs, their figures and the profiled
  window. Modes without the loop's fused one (fit's) are not probed: they
  take the K that `extra` gives."""
  per_call = asked.steps_per_loop
  probe = plan.time_budget and per_call > MIN_PER_CALL and FUSED in modes
  if probe:  # Else nothing to cut.
    plan.say(f'timing a fused call in {workdir} ...')
    folder = os.path.join(workdir, FUSED.name)  # The timed runs replace it.
    probe = train(FUSED, plan.train_flags, folder, (*extra, *PROBE))
    step = 1 / probe.steps_per_second
    per_call = per_call_within(plan.time_budget, step, per_call)
  extra = (*extra, *_per_call_flag(per_call, asked))
  window = plan.window or 2 * per_call
  profiled_flags = (
    *extra,
    f'{WINDOW}={window}',
    f'--config.num_steps={per_call + window}',
  )
  profiled = {}
  for mode in modes:
    plan.say(f'profiling {mode.name} ...')
    folder = os.path.join(workdir, 'profiled', mode.name)
    profiled[mode.name] = train(mode, plan.train_flags, folder, profiled_flags)
  steps = {
    name: steps_within(
      plan.time_budget, 1 / r.steps_per_second, r.steps_per_loop, asked.steps
    )
    for name, r in profiled.items()
  }
  results = _timed(plan, workdir, steps, asked, extra, modes)
  figures = {
    name: why.explain(
      results[name], r, breakdown.Breakdown.load(r.profile['breakdown_path'])
    )
    for name, r in profiled.items()
  }
  return results, why.with_break_even(figures), window


def _fitted(
  plan: Plan, workdir: str, results: dict[str, why.Timed], asked: why.Asked
) -> Fit:
  """Keras's `fit` at the loop's settings, in `<workdir>/fit`, as the main
  runs were measured: the same flags, steps, budget and fused K."""
  per_call = results[FUSED.name].run.steps_per_loop
  folder = os.path.join(workdir, FIT)
  extra = _per_call_flag(per_call, asked)
  sized = dataclasses.replace(asked, steps_per_loop=per_call)
  timed, figures, _ = _measured(plan, folder, sized, extra, FIT_MODES)
  auto = keras_fit.AutoPick.load(timed[why.BASE].run.workdir)
  return Fit(timed, figures, auto)


def _per_call_flag(per_call: int, asked: why.Asked) -> tuple[str, ...]:
  """The fused mode's steps a call, when the budget cut them."""
  if per_call == asked.steps_per_loop:
    return ()
  return (f'--config.steps_per_loop={per_call}',)


def _swept(
  plan: Plan,
  workdir: str,
  results: dict[str, why.Timed],
  asked: why.Asked,
  sizes: list[int],
) -> list[why.SweepPoint]:
  """The sweep's points; the main runs' size reuses the main runs. Each
  mode's step at another size is estimated from its main runs, scaled by
  batch size above theirs (a step costs no more per example at larger
  batches), to size its runs within the budget."""
  first = results['off'].run
  per_call = results['fused'].run.steps_per_loop
  points = []
  for size in sizes:
    if size == first.batch_size:
      points.append(why.sweep_point(size, asked.steps, results))
      continue
    sized = why.Asked(
      why.sweep_steps(
        size, asked.steps, first.batch_size, asked.steps_per_loop
      ),
      asked.steps_per_loop,
    )
    scale = max(1.0, size / first.batch_size)
    steps = {
      name: steps_within(
        plan.time_budget,
        scale / t.run.steps_per_second,
        t.run.steps_per_loop,
        sized.steps,
      )
      for name, t in results.items()
    }
    extra = (f'--config.batch_size={size}', *_per_call_flag(per_call, asked))
    folder = os.path.join(workdir, 'sweep', f'batch_size-{size}')
    timed = _timed(plan, folder, steps, sized, extra)
    points.append(why.sweep_point(size, sized.steps, timed))
  return points


def _by_value(
  plan: Plan,
  workdir: str,
  main: tuple[dict[str, why.Timed], dict[str, why.Figures]],
  asked: why.Asked,
  field: str,
  values: list[why.Value],
) -> by_field.Swept:
  """Every mode measured again per value of `field`, in
  `<workdir>/<field>/<value>`, as the main runs were; the main runs' value
  reuses the main runs."""
  done = []
  for value in values:
    if value == _value(main[0]['fused'].run, field):
      done.append(by_field.ValueRuns(value, *main))
      continue
    folder = os.path.join(workdir, field, _folder(value))
    extra = (_field_flag(field, value),)
    results, figures, _ = _measured(plan, folder, _value_asked(asked), extra)
    done.append(by_field.ValueRuns(value, results, figures))
  return by_field.Swept(field, done)


def _field_flag(field: str, value: why.Value) -> str:
  """The override that sets `field` to `value` in a run."""
  text = str(value).lower() if type(value) is bool else str(value)
  return f'--config.{field}={text}'


def _folder(value: why.Value) -> str:
  """A value's folder name: its text, with what a path would read as a
  folder of its own (a separator, a leading dot) made '_'."""
  return re.sub(r'[^\w.:+=-]|^\.', '_', str(value))


def _value_asked(asked: why.Asked) -> why.Asked:
  """Another value's timed runs: two fused calls of the main runs' K, at
  most the main runs' steps. A bigger model's step may cost a thousand times
  the softmax's; two calls time it."""
  return dataclasses.replace(
    asked, steps=min(asked.steps, MIN_CALLS * asked.steps_per_loop)
  )


def _value(result: outputs.Result, field: str) -> why.Value | None:
  """The run's config value of `field` (`optimizer_args.momentum` reads a
  group's); None where its config has none."""
  value = result.config
  for part in field.split('.'):
    value = value.get(part) if isinstance(value, Mapping) else None
  return value


def _check_runs(
  train_flags: list[str],
  window: int | None,
  sweep: list[int] | None,
  by: Mapping[str, list[why.Value]],
  check: Check,
  time_budget: float,
) -> why.Asked:
  """Checks the config of every run compare will start, as train checks it
  (as asked: the budget only makes runs shorter), and that each leaves
  something to time; returns the steps and fused K the config asks. Every
  swept value is checked before the error: one names each bad one."""
  timed = (f'{WINDOW}=0',)
  fused = [_config(m, train_flags, timed, m.name, check) for m in MODES][-1]
  _findable(fused.model)
  per_call, steps = fused.steps_per_loop, fused.num_steps
  if steps == per_call:  # One call, which compiles: nothing is timed.
    raise UsageError(
      f'{errors.field("num_steps", steps)} is one fused call, all of it'
      f' compiling: nothing left to time; pass {errors.field("num_steps")}'
      f' above {fused.asked_steps_per_loop}'
      + (
        f', or {errors.field("steps_per_loop")} below {steps}'
        if steps > 1
        else ''
      )
    )
  window = window or 2 * per_call
  main = [  # The main runs, timed and profiled; each value's are these too.
    ('', timed),
    (
      ' profiled',
      (f'{WINDOW}={window}', f'--config.num_steps={per_call + window}'),
    ),
  ]
  plans = list(main)
  if time_budget and per_call > MIN_PER_CALL:  # The probe is fused's alone.
    _config(FUSED, train_flags, PROBE, 'fused probe', check)
  for size in sweep or []:
    sized = why.sweep_steps(size, steps, fused.batch_size, per_call)
    extra = (f'--config.batch_size={size}', f'--config.num_steps={sized}')
    plans.append((f' swept at batch_size {size}', (*extra, f'{WINDOW}=0')))
  asked = why.Asked(steps, per_call)
  for what, extra in plans:
    for mode in MODES:
      run = _config(mode, train_flags, extra, mode.name + what, check)
      _fits(run, bool(sweep))
  shorter = f'--config.num_steps={_value_asked(asked).steps}'
  bad = []
  for field, values in by.items():
    for value in values:
      flag = _field_flag(field, value)
      try:
        if field == why.MODEL:
          _findable(value)
        for what, extra in main:
          valued = (flag, shorter, *extra)
          for mode in MODES:
            named = f'{mode.name}{what} ({field} {value})'
            _fits(_config(mode, train_flags, valued, named, check), swept=False)
      except UserError as e:
        bad.append(str(e))
  if bad:
    raise UsageError('; '.join(bad))
  return asked


def _findable(model: str) -> None:
  """UsageError when a factory's module cannot be found where the runs
  (`python -m` in this folder) will import it: found now, not after the
  main runs. Importing it is the run's: it needs TensorFlow."""
  module = model.partition(':')[0]
  if ':' not in model or not module:
    return  # A packaged model, or a form `check` refuses.
  top = module.split('.')[0]
  if top == '__main__':  # A notebook's function, say.
    raise UsageError(
      f'model {model} is a function of this program, which the runs, each a'
      ' process of its own, cannot import: put it in a module on PYTHONPATH'
      f' and name it module:{model.partition(":")[2]}'
    )
  extra = os.environ.get('PYTHONPATH', '').split(os.pathsep)
  path = [os.getcwd(), *filter(None, extra), *sys.path]  # As the runs' is.
  if importlib.machinery.PathFinder.find_spec(top, path) is None:
    raise UsageError(
      f'model {model}: no module {top} in this folder or on PYTHONPATH: put'
      ' its folder on PYTHONPATH, or run compare from it'
    )


def _config(
  mode: Mode,
  train_flags: list[str],
  extra: tuple[str, ...],
  what: str,
  check: Check,
) -> Checked:
  """The checked config of `mode`'s run; UsageError naming the run."""
  try:
    return check(_run_flags(mode, train_flags, extra))
  except UserError as e:
    raise UsageError(f'the {what} run would fail: {e}') from None


def _fits(run: Checked, swept: bool) -> None:
  """UsageError when the run's batch is larger than its training split."""
  size = _train_examples(run)
  if size is None or run.batch_size <= size:
    return
  fix = errors.arg('sweep') if swept else errors.field('batch_size')
  raise UsageError(
    f'batch size {run.batch_size} does not fit the training split of'
    f' {size} examples: pass {fix} with sizes from 1 to {size}'
  )


def _train_examples(run: Checked) -> int | None:
  """The training split's examples, from its IDX header; None when unknown
  (TFDS's datasets, a folder), for the run to say why."""
  folder = run.idx_dir or layout.DEBIAN_DIRS.get(run.dataset, '')
  if not folder or run.image_dir:
    return None
  name = layout.IDX_FILES['train'][0]
  for path in (os.path.join(folder, name), os.path.join(folder, name[:-3])):
    try:
      opener = gzip.open if path.endswith('.gz') else open
      with opener(path, 'rb') as f:
        header = f.read(8)
    except (OSError, EOFError):
      continue
    if len(header) == 8:
      return int.from_bytes(header[4:], 'big')
  return None


def _check_page(page: str) -> None:
  """The page and its chart can be written, and replace no file that
  compare did not write."""
  chart = os.path.splitext(page)[0] + '.png'
  for path, what in ((page, 'page'), (chart, "page's chart")):
    if os.path.isdir(path):
      raise UserError(
        f'{what} {path} is a folder: pass {errors.arg("page", "FILE")} with'
        ' a file path'
      )
  folder = os.path.dirname(page) or '.'
  try:
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as e:  # A parent that is a file: "Not a directory".
    raise UserError(
      f'page {page} cannot be written ({e.strerror}): pass'
      f' {errors.arg("page", "FILE")} in a writable folder'
    ) from None
  if os.path.exists(page) and not _generated(page):
    raise UserError(
      f'page {page} exists and is not a page compare generated: pass'
      f' {errors.arg("page", "FILE")} with a new file, or move it away'
    )


def _generated(page: str) -> bool:
  try:
    with open(page, 'rb') as f:
      head = f.read(1 << 16)
  except OSError:
    return False
  return why.GENERATED.encode() in head


def _check_own(workdir: str, by: Mapping[str, object]) -> None:
  """UserError unless `workdir` holds only what compare writes: it replaces
  its files and TensorBoard events, and must delete no one else's. The
  folders of swept fields are its own: those of `by`, and of an earlier
  compare's there."""
  names = os.listdir(workdir)
  ours = 'compare.json' in names or any(m.name in names for m in MODES)
  swept = {*by, why.MODEL, *_swept_before(workdir)}
  foreign = sorted(
    n
    for n in names
    if n not in OWN
    and not (n in swept and os.path.isdir(os.path.join(workdir, n)))
    and not (ours and n.startswith(layout.EVENTS_PREFIX))
    and not (ours and n.endswith('.tmp'))
  )
  if foreign:
    shown = ', '.join(foreign[:3]) + (', ...' if len(foreign) > 3 else '')
    raise UserError(
      f'workdir {workdir} holds files compare did not write ({shown}), which'
      ' it would replace: pass another'
      f" {errors.arg('workdir', 'DIR')}, new or an earlier compare's"
    )
  for name in FILES:
    if os.path.isdir(os.path.join(workdir, name)):
      raise UserError(
        f'{os.path.join(workdir, name)} is a folder: pass another'
        f' {errors.arg("workdir", "DIR")}'
      )


def _swept_before(workdir: str) -> list[str]:
  """The fields an earlier compare in `workdir` swept, from its JSON."""
  try:
    with open(os.path.join(workdir, layout.COMPARE_FILE)) as f:
      report = json.load(f)
    return [swept['field'] for swept in report.get('by') or []]
  except (OSError, ValueError, TypeError, KeyError):
    return []  # None, or not compare's: `_check_own` judges its names.


def _write(
  workdir: str, page: str | None, done: Comparison, say: Callable[[str], object]
) -> Comparison:
  """compare.json, compare.md, the chart, the Text tab (and the page);
  returns `done` with when and with what it was measured."""
  first = done.results['off'].run
  env.quiet_by_default()
  with env.importing_tensorflow():
    import tensorflow as tf  # noqa: PLC0415 - after the runs: a fast start.

    from xla_mnist.workdir import reporting  # noqa: PLC0415
  done = dataclasses.replace(
    done, measured=why.header(first, tf.version.GIT_VERSION)
  )
  text = done.text()
  files.write_atomically(
    os.path.join(workdir, layout.COMPARE_FILE), done.to_json()
  )
  with reporting.Reporter(workdir) as reporter:
    reporter.discard_earlier_runs()
    reporter.text(first.steps, 'why', f'{done.measured}\n\n{text}')
  png = None
  if importlib.util.find_spec('matplotlib'):
    points = done.sweep and done.sweep.points
    by = {
      swept.field: {f'{v.value}': v.figures for v in swept.runs}
      for swept in done.by or []
    }
    png = why.chart(done.figures, points, done.title, by)
    files.write_atomically(os.path.join(workdir, 'compare.png'), png)
  else:
    say("no compare.png: pip install 'xla_mnist[plot]' for the chart")
  files.write_atomically(
    os.path.join(workdir, 'compare.md'),
    why.document(done.title, done.measured, text, png and 'compare.png'),
  )
  if page:
    _write_page(page, done.title, done.measured, text, png)
  return done


def _write_page(
  page: str, title: str, about: str, text: str, png: bytes | None
) -> None:
  """The comparison as a docs page, its chart beside it (`<page>.png`)."""
  image = None
  if png:
    image_path = os.path.splitext(page)[0] + '.png'
    files.write_atomically(image_path, png)
    image = os.path.basename(image_path)
  about = f'{why.GENERATED}\n\n{about}'
  files.write_atomically(page, why.document(title, about, text, image))


def _given(flag: str, train_flags: list[str]) -> bool:
  name = flag.split('=', 1)[0]
  return any(arg.split('=', 1)[0] == name for arg in train_flags)


def _window(train_flags: list[str]) -> int | None:
  """The user's profiled window (--config.profile_steps), None if not given."""
  text = parse.value_of(WINDOW, train_flags)
  if text is None:
    return None
  try:
    steps = int(text)
  except ValueError:
    steps = 0
  if steps < 1:
    raise UsageError(
      f'{WINDOW}={text}: compare profiles every mode: pass a whole number of'
      ' steps > 0, or drop the flag for two fused calls'
    )
  return steps


def _run(command: list[str], name: str) -> tuple[subprocess.Popen, str, str]:
  """Runs `command` in a session of its own, passing on every stop signal
  compare gets and waiting for the run to save and stop."""
  proc = subprocess.Popen(
    command,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,
  )
  signum = 0
  while True:
    try:
      stdout, stderr = proc.communicate()
      break
    except Interrupted as e:
      signum = e.signum
      proc.send_signal(signum)
  if signum:
    raise Interrupted(
      signum,
      f'the {name} run stopped (exit {proc.returncode}); no comparison'
      ' written: run compare again',
    )
  return proc, stdout, stderr
