r"""Trains one recipe in every jit mode, puts the figures side by side, and
says why one mode's step is faster than another's.

  python -m xla_mnist.compare --config=fashion_mnist \
      [--workdir=logs/compare-fashion_mnist] [--config.num_steps=2000] \
      [--sweep=batch_size=10,100,1000] [--sweep=model=softmax,mlp,cnn] \
      [--repeats=3] [--time_budget=4] [--page=docs/why.md]

Each run is its own `python -m xla_mnist.train` process: auto-clustering
is process-wide, and a run's peak memory and first call depend on what ran
before it in a process (docs/speed.md). `off`, `on` and `auto` call the
compiled step once per batch, `fused` runs the XLA loop of `steps_per_loop`
steps per call (the config's, 0 = the default). Flags other than compare's
own go to every run; the runs compile with no XLA cache unless
--xla_cache_dir is given. Each mode trains profiled, then timed:

- profiled: one fused call unprofiled after the compile, then a window of
  `--config.profile_steps` steps (default: two fused calls, so that the
  fused loop's window holds whole calls and the host work between them),
  read into `breakdown.json`: how the timed step divides into kernel and
  host time, launches, bytes, and the TF ops of every XLA fusion (`why`);
- timed, without the profiler, which slows what it traces, --repeats times
  (the modes in turn, so that a slow spell of a shared machine falls on
  every mode): its run of median speed gives the figures (one run's, not
  medians taken one figure at a time), and the folder holds the last run.

--time_budget bounds each timed run: it holds the steps that fit that many
seconds at its profiled run's speed, or the config's, whichever are fewer;
a fused call of two steps, probed first, sizes the fused calls so that two
fit. A mode many times slower than another costs seconds, not minutes; one
measured over fewer steps says so in compare.json (`cut_from`) and on the
page (`inspection.comparison` says why this way).

--sweep=batch_size=... times every mode again at other batch sizes (no
profile); --sweep=model=... compares every mode again, timed and profiled,
for each model (packaged, or a factory 'package.module:factory'), only
config.model changed, and says per model whether XLA's gain is host time or
kernels (docs/models.md). Each run writes its usual outputs to
`<workdir>/<mode>`, `<workdir>/profiled/<mode>`,
`<workdir>/sweep/batch_size-<N>/<mode>` and `<workdir>/model/<model>/...`;
the comparison goes to
`<workdir>/compare.{md,json,png}` and, as text, to TensorBoard's Text tab
for `<workdir>`; --page writes it as a docs page too, the chart beside it.
The chart needs matplotlib, the `plot` extra
(`pip install 'xla_mnist[plot]'`), and is left out without it.

Every run's config, the page and the workdir are checked before the first
run; compare holds its workdir's lock and refuses one that holds anything
it did not write (it replaces its files and TensorBoard events there).
The work is `inspection.comparison.compare`, which a notebook calls; this
entry maps the flags onto it and gives it train's config check (`checked`).
"""

from __future__ import annotations

# First: catches stop signals before the imports below (see `cli`).
from xla_mnist.runtime import cli  # isort: skip

cli.catch_stop_signals()

import os

from absl import flags

from xla_mnist import config as config_lib
from xla_mnist import parse
from xla_mnist.inspection import comparison, why
from xla_mnist.runtime import console, env
from xla_mnist.runtime.errors import UsageError
from xla_mnist.workdir import files

_WORKDIR: flags.FlagHolder | None = None
_SWEEP: flags.FlagHolder | None = None
_PAGE: flags.FlagHolder | None = None
_REPEATS: flags.FlagHolder | None = None
_TIME_BUDGET: flags.FlagHolder | None = None


def checked(train_flags: list[str]) -> comparison.Checked:
  """A run's config, through train's own parse and check (`config_of`):
  what `comparison.compare` checks every run with before the first."""
  config = parse.config_of(train_flags)
  return comparison.Checked(
    num_steps=config.num_steps,
    batch_size=config.batch_size,
    steps_per_loop=config_lib.steps_per_loop(config),
    asked_steps_per_loop=(
      config.steps_per_loop or config_lib.DEFAULT_STEPS_PER_LOOP
    ),
    dataset=config.dataset,
    idx_dir=config.idx_dir,
    image_dir=config.image_dir,
    model=config.model,
  )


def main(argv: list[str]) -> None:
  env.check_user_flags()  # Before the runs, which would each fail on it.
  cli.unwind_on_signals()  # From here on files are written.
  train_flags = argv[1:]  # absl left them: the training runs parse them.
  _, config_file = parse.resolve_argv(train_flags)
  workdir = _WORKDIR.value or os.path.join(
    'logs', f'compare-{parse.config_name(config_file)}'
  )
  files.check_current_folder(workdir)
  swept: dict[str, list] = {}
  for text in _SWEEP.value or []:
    field, values = why.parse_sweep(text)
    if field in swept:
      raise UsageError(
        f'--sweep={field}=... is given twice: pass each field once, its'
        ' values together'
      )
    swept[field] = values
  done = comparison.compare(
    train_flags,
    workdir,
    check=checked,
    repeats=_REPEATS.value,
    sweep=swept.get(why.SWEPT),
    models=swept.get(why.MODEL),
    page=_PAGE.value,
    time_budget=_TIME_BUDGET.value,
  )
  console.say(done.title, done.text())
  written = [
    f for f in comparison.FILES if os.path.exists(os.path.join(workdir, f))
  ]
  console.say(f'outputs in {workdir}: {", ".join(written)}')
  if _PAGE.value:
    console.say(f'page: {_PAGE.value}')


def _define_flags() -> None:
  """compare's own flags, defined as `_parse_flags` runs (see `cli`)."""
  global _WORKDIR, _SWEEP, _PAGE, _REPEATS, _TIME_BUDGET
  _WORKDIR = flags.DEFINE_string(
    'workdir',
    None,
    'Output folder: a sub-folder per mode and the comparison. Default:'
    ' ./logs/compare-<config name>.',
  )
  _SWEEP = flags.DEFINE_multi_string(
    'sweep',
    None,
    'batch_size=N,N,...: times every mode at each batch size too.'
    ' model=NAME,NAME,...: compares every mode for each model too (packaged'
    " or 'package.module:factory'). Either or both.",
  )
  _REPEATS = flags.DEFINE_integer(
    'repeats',
    3,
    'Timed runs per mode (and sweep size), the modes in turn: the figures'
    ' are the run of median speed, the spread their range.',
  )
  _TIME_BUDGET = flags.DEFINE_float(
    'time_budget',
    comparison.TIME_BUDGET,
    "Seconds of steps a timed run holds at most, at its profiled run's"
    " speed: fewer than the config's steps when they would take longer."
    " 0: the config's steps, whatever they cost.",
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
