"""The comparison: one recipe trained in every jit mode, timed and profiled,
the figures side by side, and why one mode's step is faster than another's.

`compare` is the function a notebook calls and the command maps its flags
onto. Each run is its own `python -m xla_mnist.train` process, because
auto-clustering is process-wide and a whole process is what is timed: `off`,
`on` and `auto` call the compiled step once per batch, `fused` runs the XLA
loop of `steps_per_loop` steps per call. `train_flags` go to every run (the
runs compile with no XLA cache unless they name one). Each mode trains:

- timed, without the profiler, which slows what it traces, `repeats` times
  (the modes in turn, so that a slow spell of a shared machine falls on
  every mode): its run of median speed gives the figures (`why.Timed`);
- profiled: one fused call unprofiled after the compile, then a window of
  `--config.profile_steps` steps (default: two fused calls), read into its
  `breakdown.json` and explained with the timed run (`why.explain`).

`sweep` times every mode again at other batch sizes; `models` compares
every mode again (timed and profiled) for each model, only `config.model`
changed (`by_model`). Each run writes its usual outputs to
`<workdir>/<mode>`, `<workdir>/profiled/<mode>`,
`<workdir>/sweep/batch_size-<N>/<mode>` and `<workdir>/model/<model>/...`
(the main runs' layout); the comparison, a `Comparison`,
goes to `<workdir>/compare.{md,json,png}` (`Comparison.from_json` reads it
back) and to TensorBoard's Text tab; `page` writes it as a docs page too.

This module reads no config: the recipe's parse and check are the caller's
`check` (the command's `checked`, over `train.config_of`), so that the
inspection layer imports nothing of the recipe. Imports no TensorFlow
before the runs: compare starts fast and fails fast.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence

from xla_mnist.inspection import breakdown, by_model, why
from xla_mnist.runtime import console, env, errors, layout
from xla_mnist.runtime.errors import Interrupted, UsageError, UserError
from xla_mnist.workdir import files, markdown, outputs


@dataclasses.dataclass(frozen=True)
class Mode:
  name: str
  flags: tuple[str, ...]  # Given to the training run after the user's flags.


MODES = (
  Mode('off', ('--jit=off', '--config.steps_per_loop=1')),
  Mode('on', ('--jit=on', '--config.steps_per_loop=1')),
  Mode('auto', ('--jit=auto', '--config.steps_per_loop=1')),
  Mode('fused', ('--jit=on',)),
)
FILES = ('compare.md', 'compare.json', 'compare.png')
# What compare writes into its workdir: anything else is not its own.
OWN = {
  *FILES,
  *(m.name for m in MODES),
  'profiled',
  'sweep',
  'model',
  layout.LOCK_FILE,
}
WINDOW = '--config.profile_steps'  # The profiled runs' window; 0 when timed.
# Unless the user's say otherwise, XLA really compiles: no load from a cache.
NO_CACHE = '--xla_cache_dir='
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


# A run's train flags -> its checked config; UserError when train would
# refuse them.
Check = Callable[[list[str]], Checked]


@dataclasses.dataclass(frozen=True)
class Sweep:
  points: list[why.SweepPoint]
  crossovers: list[str]  # `why.crossovers`, in words.


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
  # Every mode compared again per model, the main runs' model among them.
  models: list[by_model.ModelRuns] | None = None

  def to_json(self) -> str:
    report = {
      'title': self.title,
      'measured': self.measured,
      'flags': self.flags,
      'profiled_steps': self.profiled_steps,
      'results': _runs_json(self.results, self.figures),
      'sweep': self.sweep and dataclasses.asdict(self.sweep),
      'models': self.models
      and [
        {'model': m.model, 'results': _runs_json(m.results, m.figures)}
        for m in self.models
      ],
    }
    return json.dumps(report, indent=2) + '\n'

  @classmethod
  def from_json(cls, text: str) -> Comparison:
    report = json.loads(text)
    sweep = report['sweep'] and Sweep(
      [why.SweepPoint.from_dict(p) for p in report['sweep']['points']],
      report['sweep']['crossovers'],
    )
    models = report.get('models')  # None in a comparison of one model.
    results, figures = _runs(report['results'])
    return cls(
      title=report['title'],
      measured=report['measured'],
      flags=report['flags'],
      profiled_steps=report['profiled_steps'],
      results=results,
      figures=figures,
      sweep=sweep,
      models=models
      and [
        by_model.ModelRuns(m['model'], *_runs(m['results'])) for m in models
      ],
    )

  @classmethod
  def load(cls, workdir: str) -> Comparison:
    """The comparison an earlier compare wrote into `workdir`."""
    with open(os.path.join(workdir, layout.COMPARE_FILE)) as f:
      return cls.from_json(f.read())

  def text(self) -> str:
    """The table, whether the modes ended apart, the why, the sweep and
    the models."""
    runs = {name: t.run for name, t in self.results.items()}
    points = self.sweep and self.sweep.points
    text = (
      f'{table(self.results)}\n\n{why.markdown(runs, self.figures, points)}'
    )
    if self.models:
      main = _model(self.results[why.BASE].run)
      text += f'\n{by_model.markdown(self.models, main)}'
    return text


def _runs_json(
  results: Mapping[str, why.Timed], figures: Mapping[str, why.Figures]
) -> dict[str, dict]:
  """Each mode's timed run, its repeats and its breakdown, for JSON."""
  return {
    name: {
      **dataclasses.asdict(t.run),
      'repeats': dataclasses.asdict(t.repeats),
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
    run = {k: v for k, v in r.items() if k not in ('repeats', 'breakdown')}
    results[name] = why.Timed(
      outputs.Result(**run), why.Repeats(**r['repeats'])
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
  models: Sequence[str] | None = None,
  page: str | None = None,
  say: Callable[[str], object] = console.say,
) -> Comparison:
  """Trains and profiles every mode (and times the sweep's sizes, and
  compares again each of `models`, config.model values) with `train_flags`,
  writes the comparison into `workdir` (and `page`), and returns it. Every
  run's flags pass `check` before the first run starts; `say` takes the
  progress lines."""
  train_flags = list(train_flags)
  if type(repeats) is not int or repeats < 1:
    raise UsageError(
      f'{errors.arg("repeats", repeats)}: pass a whole number of timed runs'
      ' per mode, 1 or more'
    )
  if _given('--jit', train_flags):
    raise UsageError('compare runs every jit mode: drop --jit')
  sizes = sorted(set(sweep)) if sweep else None
  models = list(dict.fromkeys(models)) if models else None
  window = _window(train_flags)
  train_flags = _without(WINDOW, train_flags)
  window = _check_runs(train_flags, window, sizes, models, check)
  if page:
    _check_page(page)
  outputs.prepare_workdir(workdir)
  with files.workdir_lock(workdir):
    _check_own(workdir)
    results = _timed(train_flags, workdir, repeats, say)
    figures = _explained(train_flags, workdir, results, window, say)
    points = sizes and _swept(
      train_flags, workdir, results, sizes, repeats, say
    )
    first = results['off'].run
    main = _model(first)
    done = Comparison(
      title=(
        f'{first.dataset}, {main}, {first.steps} steps of {first.batch_size},'
        f' {first.device}'
      ),
      measured='',  # `_write` says when, with TF's version.
      flags=train_flags,
      profiled_steps=window,
      results=results,
      figures=figures,
      sweep=points and Sweep(points, why.crossovers(points)),
      models=models
      and _modelled(
        train_flags, workdir, (results, figures), models, repeats, window, say
      ),
    )
    return _write(workdir, page, done, say)


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
    'xla_mnist.train',
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
  result, _ = outputs.load_result(os.path.join(workdir, outputs.RESULT_FILE))
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


def table(results: Mapping[str, why.Timed]) -> str:
  """The runs as a Markdown table, and how they were timed; speed-up is
  steps/s over `off`'s, spread a mode's slowest run over its fastest."""
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
  return (
    f'{text}\n\nTimed figures: {runs} per mode by speed (all of its figures'
    " are that run's), the modes in turn; spread:"
    " how much faster a mode's fastest run was than its slowest."
  )


def _timed(
  train_flags: list[str],
  workdir: str,
  repeats: int,
  say: Callable[[str], object],
  extra: tuple[str, ...] = (),
) -> dict[str, why.Timed]:
  """Every mode's timed runs (no profiler) in `workdir/<mode>`, the modes in
  turn `repeats` times, so that a slow spell of a shared machine falls on
  every mode."""
  runs: dict[str, list[outputs.Result]] = {mode.name: [] for mode in MODES}
  for i in range(repeats):
    for mode in MODES:
      say(f'training {mode.name} in {workdir} ({i + 1}/{repeats}) ...')
      folder = os.path.join(workdir, mode.name)  # Each run replaces the last.
      runs[mode.name].append(
        train(mode, train_flags, folder, (*extra, f'{WINDOW}=0'))
      )
  return {name: why.Timed.of(done) for name, done in runs.items()}


def _explained(
  train_flags: list[str],
  workdir: str,
  results: dict[str, why.Timed],
  window: int,
  say: Callable[[str], object],
  extra: tuple[str, ...] = (),
) -> dict[str, why.Figures]:
  """Every mode's profiled run, read with its timed runs (`why.explain`)."""
  per_call = results['fused'].run.steps_per_loop
  extra = (
    *extra,
    f'{WINDOW}={window}',
    f'--config.num_steps={per_call + window}',
  )
  modes = {}
  for mode in MODES:
    say(f'profiling {mode.name} ...')
    folder = os.path.join(workdir, 'profiled', mode.name)
    profiled = train(mode, train_flags, folder, extra)
    stored = breakdown.Breakdown.load(profiled.profile['breakdown_path'])
    modes[mode.name] = why.explain(results[mode.name], profiled, stored)
  return why.with_break_even(modes)


def _swept(
  train_flags: list[str],
  workdir: str,
  results: dict[str, why.Timed],
  sizes: list[int],
  repeats: int,
  say: Callable[[str], object],
) -> list[why.SweepPoint]:
  """The sweep's points; the main runs' size reuses the main runs."""
  first = results['off'].run
  points = []
  for size in sizes:
    if size == first.batch_size:
      points.append(why.sweep_point(size, first.steps, results))
      continue
    steps = why.sweep_steps(
      size, first.steps, first.batch_size, results['fused'].run.steps_per_loop
    )
    extra = (f'--config.batch_size={size}', f'--config.num_steps={steps}')
    folder = os.path.join(workdir, 'sweep', f'batch_size-{size}')
    timed = _timed(train_flags, folder, repeats, say, extra)
    points.append(why.sweep_point(size, steps, timed))
  return points


def _modelled(
  train_flags: list[str],
  workdir: str,
  main: tuple[dict[str, why.Timed], dict[str, why.Figures]],
  models: list[str],
  repeats: int,
  window: int,
  say: Callable[[str], object],
) -> list[by_model.ModelRuns]:
  """Every mode timed and profiled again per model, in
  `<workdir>/model/<model>`; the main runs' model reuses the main runs."""
  fused = main[0]['fused'].run
  done = []
  for name in models:
    if name == _model(fused):
      done.append(by_model.ModelRuns(name, *main))
      continue
    folder = os.path.join(workdir, why.MODEL, name)
    extra = _model_flags(name, fused.steps, fused.steps_per_loop)
    results = _timed(train_flags, folder, repeats, say, extra)
    figures = _explained(train_flags, folder, results, window, say, extra)
    done.append(by_model.ModelRuns(name, results, figures))
  return done


def _model_flags(name: str, steps: int, per_call: int) -> tuple[str, ...]:
  """Another model's timed runs: two fused calls of the main runs' K (the
  first compiles, untimed), at most the main runs' steps. A bigger model's
  step may cost a thousand times the softmax's; two calls time it."""
  return (
    f'--config.{why.MODEL}={name}',
    f'--config.num_steps={min(steps, 2 * per_call)}',
  )


def _model(result: outputs.Result) -> str:
  """The run's config.model (results before models existed: softmax)."""
  return result.config.get(why.MODEL, 'softmax')


def _check_runs(
  train_flags: list[str],
  window: int | None,
  sweep: list[int] | None,
  models: list[str] | None,
  check: Check,
) -> int:
  """Checks the config of every run compare will start, as train checks it,
  and that each leaves something to time; returns the profiled window."""
  timed = (f'{WINDOW}=0',)
  fused = [_config(m, train_flags, timed, m.name, check) for m in MODES][-1]
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
  main = [  # The main runs, timed and profiled; each model's are these too.
    ('', timed),
    (
      ' profiled',
      (f'{WINDOW}={window}', f'--config.num_steps={per_call + window}'),
    ),
  ]
  plans = list(main)
  for size in sweep or []:
    sized = why.sweep_steps(size, steps, fused.batch_size, per_call)
    extra = (f'--config.batch_size={size}', f'--config.num_steps={sized}')
    plans.append((f' swept at batch_size {size}', (*extra, f'{WINDOW}=0')))
  for name in models or []:
    _findable(name)
    model = _model_flags(name, steps, per_call)
    plans += [(f'{what} (model {name})', (*model, *e)) for what, e in main]
  for what, extra in plans:
    for mode in MODES:
      run = _config(mode, train_flags, extra, mode.name + what, check)
      _fits(run, bool(sweep))
  return window


def _findable(model: str) -> None:
  """UsageError when a factory's module cannot be found where the runs
  (`python -m` in this folder) will import it: found now, not after the
  main runs. Importing it is the run's: it needs TensorFlow."""
  module = model.partition(':')[0]
  if ':' not in model or not module:
    return  # A packaged model, or a form `check` refuses.
  top = module.split('.')[0]
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
  """The training split's examples, from its IDX header (or the dataset's
  known size); None when unknown, for the run to say why."""
  folder = run.idx_dir or layout.DEBIAN_DIRS.get(run.dataset, '')
  if not folder:
    return layout.TRAIN_EXAMPLES.get(run.dataset)
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


def _check_own(workdir: str) -> None:
  """UserError unless `workdir` holds only what compare writes: it replaces
  its files and TensorBoard events, and must delete no one else's."""
  names = os.listdir(workdir)
  ours = 'compare.json' in names or any(m.name in names for m in MODES)
  foreign = sorted(
    n
    for n in names
    if n not in OWN
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
    models = done.models and {m.model: m.figures for m in done.models}
    png = why.chart(done.figures, points, done.title, models)
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


def _value(name: str, train_flags: list[str]) -> str | None:
  """The last value given to flag `name` (`--name=V` or `--name V`)."""
  found = None
  for i, arg in enumerate(train_flags):
    if arg.startswith(f'{name}='):
      found = arg.split('=', 1)[1]
    elif arg == name and i + 1 < len(train_flags):
      found = train_flags[i + 1]
  return found


def _without(name: str, train_flags: list[str]) -> list[str]:
  """`train_flags` without flag `name` and its value."""
  kept, skip = [], False
  for arg in train_flags:
    if skip:
      skip = False
    elif arg == name:
      skip = True
    elif not arg.startswith(f'{name}='):
      kept.append(arg)
  return kept


def _given(flag: str, train_flags: list[str]) -> bool:
  name = flag.split('=', 1)[0]
  return any(arg.split('=', 1)[0] == name for arg in train_flags)


def _window(train_flags: list[str]) -> int | None:
  """The user's profiled window (--config.profile_steps), None if not given."""
  text = _value(WINDOW, train_flags)
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
