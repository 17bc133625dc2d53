r"""Trains one recipe in every jit mode, puts the figures side by side, and
says why one mode's step is faster than another's.

  python -m xla_mnist.compare --config=fashion_mnist \
      [--workdir=logs/compare-fashion_mnist] [--config.num_steps=2000] \
      [--sweep=batch_size=10,100,1000] [--repeats=3] [--page=docs/why.md]

Each mode is its own `python -m xla_mnist.train` process, because
auto-clustering is process-wide: `off`, `on` and `auto` call the compiled
step once per batch, `fused` runs the XLA loop of `steps_per_loop` steps per
call (the config's, 0 = the default). Flags other than compare's own go to
every run; the runs compile with no XLA cache unless --xla_cache_dir is
given. Each mode trains timed, then profiled:

- timed, without the profiler, which slows what it traces, --repeats times
  (the modes in turn, so that a slow spell of a shared machine falls on
  every mode): its run of median speed gives the figures (one run's, not
  medians taken one figure at a time), and the folder holds the last run;
- profiled: one fused call unprofiled after the compile, then a window of
  `--config.profile_steps` steps (default: two fused calls, so that the
  fused loop's window holds whole calls and the host work between them),
  read into `breakdown.json`: how the timed step divides into kernel and
  host time, launches, bytes, and the TF ops of every XLA fusion (`why`).

--sweep times every mode again at other batch sizes (no profile). Each run
writes its usual outputs to `<workdir>/<mode>`, `<workdir>/profiled/<mode>`
and `<workdir>/sweep/batch_size-<N>/<mode>`; the comparison goes to
`<workdir>/compare.{md,json,png}` and, as text, to TensorBoard's Text tab
for `<workdir>`; --page writes it as a docs page too, the chart beside it.
The chart needs matplotlib, the `plot` extra
(`pip install 'xla_mnist[plot]'`), and is left out without it.

Every run's config, the page and the workdir are checked before the first
run; compare holds its workdir's lock and refuses one that holds anything
it did not write (it replaces its files and TensorBoard events there).
"""

from __future__ import annotations

# First: catches stop signals before the imports below (see `cli`).
from xla_mnist.runtime import cli  # isort: skip

import dataclasses
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from absl import flags

from xla_mnist import config as config_lib
from xla_mnist import train as train_lib
from xla_mnist.inspection import why
from xla_mnist.runtime import env, errors, layout
from xla_mnist.runtime.errors import Interrupted, UsageError, UserError
from xla_mnist.workdir import files, markdown, outputs

_WORKDIR: flags.FlagHolder | None = None
_SWEEP: flags.FlagHolder | None = None
_PAGE: flags.FlagHolder | None = None
_REPEATS: flags.FlagHolder | None = None


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
OWN = {*FILES, *(m.name for m in MODES), 'profiled', 'sweep', layout.LOCK_FILE}
WINDOW = '--config.profile_steps'  # The profiled runs' window; 0 when timed.
# Unless the user's say otherwise, XLA really compiles: no load from a cache.
NO_CACHE = '--xla_cache_dir='


class RunFailed(UserError):
  """A training run failed; compare exits with the run's exit code."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


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


def train(
  mode: Mode, train_flags: list[str], workdir: str, extra: tuple[str, ...]
) -> dict:
  """Runs `mode` in its own process; returns its `result.json`.

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
  with open(os.path.join(workdir, outputs.RESULT_FILE)) as f:
    result = json.load(f)
  if WINDOW + '=0' not in extra and not result['profile']:
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


# A timed run's figures that vary from run to run: kept for every run.
TIMED = ('compile_seconds', 'train_seconds', 'steps_per_second')
# The run's figures that tell the modes apart, as `outputs.FIGURES` words them.
TABLED = ('compile_seconds', 'train_seconds', 'steps_per_second', 'final_loss')


def table(results: dict[str, dict]) -> str:
  """The runs as a Markdown table, and how they were timed; speed-up is
  steps/s over `off`'s, spread a mode's slowest run over its fastest."""
  figures = [outputs.FIGURES[name] for name in (*TABLED, 'test_accuracy')]
  base = results['off']['steps_per_second']
  rows = []
  for mode, r in results.items():
    rate = r['steps_per_second']
    rows.append(
      (
        mode,
        r['jit'],
        r['steps_per_loop'],
        outputs.measured(rate and 1e3 / rate, '.3f'),
        outputs.measured(rate and base and rate / base, '.2f', 'x'),
        _spread(r['repeats']['steps_per_second']),
        *(f.show(r[f.field]) for f in figures),
        r['traces'],
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
  n = len(results['off']['repeats']['steps_per_second'])
  runs = 'one timed run' if n == 1 else f'the median of {n} timed runs'
  return (
    f'{text}\n\nTimed figures: {runs} per mode by speed (all of its figures'
    " are that run's), the modes in turn; spread:"
    " how much faster a mode's fastest run was than its slowest."
  )


def _spread(rates: list[float]) -> str:
  return f'{why.spread(rates):.0%}' if len(rates) > 1 else '-'


def _timed(
  train_flags: list[str],
  workdir: str,
  repeats: int,
  extra: tuple[str, ...] = (),
) -> dict[str, dict]:
  """Every mode's timed runs (no profiler) in `workdir/<mode>`, the modes in
  turn `repeats` times, so that a slow spell of a shared machine falls on
  every mode; each mode's figures are its run of median speed."""
  runs: dict[str, list[dict]] = {mode.name: [] for mode in MODES}
  for i in range(repeats):
    for mode in MODES:
      print(
        f'training {mode.name} in {workdir} ({i + 1}/{repeats}) ...', flush=True
      )
      folder = os.path.join(workdir, mode.name)  # Each run replaces the last.
      runs[mode.name].append(
        train(mode, train_flags, folder, (*extra, f'{WINDOW}=0'))
      )
  results = {}
  for name, done in runs.items():
    figures = {key: [r[key] for r in done] for key in TIMED}
    results[name] = {**_median_run(done), 'repeats': figures}
  return results


def _median_run(runs: list[dict]) -> dict:
  """The run of median speed (the slower middle one of an even count): its
  figures are one run's, not a mix of medians taken one figure at a time."""
  ranked = sorted(runs, key=lambda r: r['steps_per_second'])
  return ranked[(len(ranked) - 1) // 2]


def _explained(
  train_flags: list[str], workdir: str, results: dict[str, dict], window: int
) -> dict[str, dict]:
  """Every mode's profiled run, read with its timed run (`why.explain`)."""
  per_call = results['fused']['steps_per_loop']
  extra = (f'{WINDOW}={window}', f'--config.num_steps={per_call + window}')
  modes = {}
  for mode in MODES:
    print(f'profiling {mode.name} ...', flush=True)
    folder = os.path.join(workdir, 'profiled', mode.name)
    profiled = train(mode, train_flags, folder, extra)
    with open(profiled['profile']['breakdown_path']) as f:
      stored = json.load(f)
    modes[mode.name] = why.explain(results[mode.name], profiled, stored)
  return why.with_break_even(modes)


def _swept(
  train_flags: list[str],
  workdir: str,
  results: dict[str, dict],
  sizes: list[int],
  repeats: int,
) -> list[dict]:
  """The sweep's points; the main runs' size reuses the main runs."""
  first = results['off']
  points = []
  for size in sizes:
    if size == first['batch_size']:
      points.append(why.sweep_point(size, first['steps'], results))
      continue
    steps = why.sweep_steps(
      size,
      first['steps'],
      first['batch_size'],
      results['fused']['steps_per_loop'],
    )
    extra = (f'--config.batch_size={size}', f'--config.num_steps={steps}')
    folder = os.path.join(workdir, 'sweep', f'batch_size-{size}')
    points.append(
      why.sweep_point(size, steps, _timed(train_flags, folder, repeats, extra))
    )
  return points


def compare(
  train_flags: list[str],
  workdir: str,
  sweep: list[int] | None = None,
  page: str | None = None,
  repeats: int = 3,
) -> dict[str, dict]:
  """Trains and profiles every mode (and the sweep), writes the comparison
  files (and the page); returns the timed runs' results: each mode's run
  of median speed among `repeats`."""
  if repeats < 1:
    raise UsageError(
      f'{errors.arg("repeats", repeats)}: pass a whole number of timed runs'
      ' per mode, 1 or more'
    )
  if _given('--jit', train_flags):
    raise UsageError('compare runs every jit mode: drop --jit')
  window = _window(train_flags)
  train_flags = _without(WINDOW, train_flags)
  window = _check_runs(train_flags, window, sweep)
  if page:
    _check_page(page)
  outputs.prepare_workdir(workdir)
  with files.workdir_lock(workdir):
    _check_own(workdir)
    return _compared(train_flags, workdir, sweep, page, repeats, window)


def _compared(
  train_flags: list[str],
  workdir: str,
  sweep: list[int] | None,
  page: str | None,
  repeats: int,
  window: int,
) -> dict[str, dict]:
  """`compare` once its input passed every check and it holds `workdir`."""
  results = _timed(train_flags, workdir, repeats)
  modes = _explained(train_flags, workdir, results, window)
  points = (
    _swept(train_flags, workdir, results, sweep, repeats) if sweep else None
  )
  first = results['off']
  title = (
    f'{first["dataset"]}, {first["steps"]} steps of {first["batch_size"]},'
    f' {first["device"]}'
  )
  _write(workdir, page, title, train_flags, window, results, modes, points)
  return results


def _check_runs(
  train_flags: list[str], window: int | None, sweep: list[int] | None
) -> int:
  """Checks the config of every run compare will start, as train checks it,
  and that each leaves something to time; returns the profiled window."""
  timed = (f'{WINDOW}=0',)
  fused = [_config(m, train_flags, timed, m.name) for m in MODES][-1]
  per_call = config_lib.steps_per_loop(fused)
  steps, batch = fused.num_steps, fused.batch_size
  if steps == per_call:  # One call, which compiles: nothing is timed.
    k = fused.steps_per_loop or config_lib.DEFAULT_STEPS_PER_LOOP
    raise UsageError(
      f'{errors.field("num_steps", steps)} is one fused call, all of it'
      f' compiling: nothing left to time; pass {errors.field("num_steps")}'
      f' above {k}'
      + (
        f', or {errors.field("steps_per_loop")} below {steps}'
        if steps > 1
        else ''
      )
    )
  window = window or 2 * per_call
  plans = [('', timed)]
  plans.append(
    (
      ' profiled',
      (f'{WINDOW}={window}', f'--config.num_steps={per_call + window}'),
    )
  )
  for size in sweep or []:
    sized = why.sweep_steps(size, steps, batch, per_call)
    extra = (f'--config.batch_size={size}', f'--config.num_steps={sized}')
    plans.append((f' swept at batch_size {size}', (*extra, f'{WINDOW}=0')))
  for what, extra in plans:
    for mode in MODES:
      _fits(_config(mode, train_flags, extra, mode.name + what), bool(sweep))
  return window


def _config(
  mode: Mode, train_flags: list[str], extra: tuple[str, ...], what: str
):  # noqa: ANN202 - an ml_collections.ConfigDict.
  """The checked config of `mode`'s run; UsageError naming the run."""
  try:
    return train_lib.config_of(_run_flags(mode, train_flags, extra))
  except UserError as e:
    raise UsageError(f'the {what} run would fail: {e}') from None


def _fits(config, swept: bool) -> None:  # noqa: ANN001 - a ConfigDict.
  """UsageError when the run's batch is larger than its training split."""
  size = _train_examples(config)
  if size is None or config.batch_size <= size:
    return
  fix = errors.arg('sweep') if swept else errors.field('batch_size')
  raise UsageError(
    f'batch size {config.batch_size} does not fit the training split of'
    f' {size} examples: pass {fix} with sizes from 1 to {size}'
  )


def _train_examples(config) -> int | None:  # noqa: ANN001 - a ConfigDict.
  """The training split's examples, from its IDX header (or the dataset's
  known size); None when unknown, for the run to say why."""
  folder = config.idx_dir or layout.DEBIAN_DIRS.get(config.dataset, '')
  if not folder:
    return layout.TRAIN_EXAMPLES.get(config.dataset)
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
  workdir: str,
  page: str | None,
  title: str,
  train_flags: list[str],
  window: int,
  results: dict[str, dict],
  modes: dict[str, dict],
  points: list[dict] | None,
) -> None:
  """compare.json, compare.md, the chart, the Text tab (and the page)."""
  first = results['off']
  env.quiet_by_default()
  with env.importing_tensorflow():
    import tensorflow as tf  # noqa: PLC0415 - after the runs: a fast start.

    from xla_mnist.workdir import reporting  # noqa: PLC0415
  about = why.header(first, tf.version.GIT_VERSION)
  text = f'{table(results)}\n\n{why.markdown(results, modes, points)}'
  report = {
    'title': title,
    'measured': about,
    'flags': train_flags,
    'profiled_steps': window,
    'results': {
      name: {**r, 'breakdown': modes[name]} for name, r in results.items()
    },
    'sweep': points
    and {'points': points, 'crossovers': why.crossovers(points)},
  }
  files.write_atomically(
    os.path.join(workdir, 'compare.json'), json.dumps(report, indent=2) + '\n'
  )
  with reporting.Reporter(workdir) as reporter:
    reporter.discard_earlier_runs()
    reporter.text(first['steps'], 'why', f'{about}\n\n{text}')
  png = None
  if importlib.util.find_spec('matplotlib'):
    png = why.chart(modes, points, title)
    files.write_atomically(os.path.join(workdir, 'compare.png'), png)
  else:
    print("no compare.png: pip install 'xla_mnist[plot]' for the chart")
  files.write_atomically(
    os.path.join(workdir, 'compare.md'),
    why.document(title, about, text, png and 'compare.png'),
  )
  if page:
    _write_page(page, title, about, text, png)
  print(title)
  print(text)


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


def main(argv: list[str]) -> None:
  env.check_user_flags()  # Before the runs, which would each fail on it.
  cli.unwind_on_signals()  # From here on files are written.
  train_flags = argv[1:]  # absl left them: the training runs parse them.
  _, config_file = config_lib.resolve_argv(train_flags)
  workdir = _WORKDIR.value or os.path.join(
    'logs', f'compare-{config_lib.config_name(config_file)}'
  )
  sweep = why.parse_sweep(_SWEEP.value) if _SWEEP.value else None
  compare(train_flags, workdir, sweep, _PAGE.value, _REPEATS.value)
  written = [f for f in FILES if os.path.exists(os.path.join(workdir, f))]
  print(f'outputs in {workdir}: {", ".join(written)}')
  if _PAGE.value:
    print(f'page: {_PAGE.value}')


def _define_flags() -> None:
  """compare's own flags, defined as `_parse_flags` runs (see `cli`)."""
  global _WORKDIR, _SWEEP, _PAGE, _REPEATS
  _WORKDIR = flags.DEFINE_string(
    'workdir',
    None,
    'Output folder: a sub-folder per mode and the comparison. Default:'
    ' ./logs/compare-<config name>.',
  )
  _SWEEP = flags.DEFINE_string(
    'sweep',
    None,
    'batch_size=N,N,...: times every mode at each batch size too.',
  )
  _REPEATS = flags.DEFINE_integer(
    'repeats',
    3,
    'Timed runs per mode (and sweep size), the modes in turn: the figures'
    ' are the run of median speed, the spread their range.',
  )
  _PAGE = flags.DEFINE_string(
    'page',
    None,
    'Also writes the comparison as a Markdown page here (docs/why.md), its'
    ' chart beside it (docs/why.png).',
  )


def _parse_flags(argv: list[str]) -> list[str]:
  """Parses compare's own flags; every other flag is left for the runs."""
  _define_flags()
  return cli.parse(argv, known_only=True)


def run() -> None:
  """The `xla-mnist-compare` console script."""
  cli.run(main, _parse_flags)


if __name__ == '__main__':
  run()
