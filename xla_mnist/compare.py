r"""Trains one recipe in every jit mode, puts the figures side by side, and
says why one mode's step is faster than another's.

  python -m xla_mnist.compare --config=fashion_mnist \
      [--workdir=logs/compare-fashion_mnist] [--config.num_steps=2000] \
      [--sweep=batch_size=10,100,1000] [--sweep=model=softmax,mlp,cnn] \
      [--sweep=optimizer=sgd,adam] [--sweep=FIELD=V,V,...] \
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
profile); --sweep=FIELD=... for any other field of the recipe that changes
the step (`sweepable`: model, optimizer, learning_rate, dataset, seed,
optimizer_args.momentum...) compares every mode again, timed and profiled,
for each value (of the field's type in configs/default.py), only that field
changed, and says per value whether XLA's gain is host time or kernels
(a model: packaged, or a factory 'package.module:factory', docs/models.md).
Each run writes its usual outputs to `<workdir>/<mode>`,
`<workdir>/profiled/<mode>`, `<workdir>/sweep/batch_size-<N>/<mode>` and
`<workdir>/<field>/<value>/...`;
the comparison goes to
`<workdir>/compare.{md,json,png}` and, as text, to TensorBoard's Text tab
for `<workdir>`; --page writes it as a docs page too, the chart beside it.
The chart needs matplotlib, the `plot` extra
(`pip install 'xla_mnist[plot]'`), and is left out without it.

--fit (on by default) trains the main runs' recipe by Keras's own
`model.fit` too (`inspection.keras_fit`), at the loop's settings: off is
`jit_compile=False`, on `jit_compile=True`, fused `jit_compile=True` with
`steps_per_execution=K`, timed and profiled alike into `<workdir>/fit/...`;
the page says what fit's default `jit_compile="auto"` picks on this machine
for this model, what each setting gives, and the loop against fit.

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
from ml_collections import ConfigDict

from xla_mnist import config as config_lib
from xla_mnist import parse
from xla_mnist.configs import default
from xla_mnist.inspection import comparison, why
from xla_mnist.runtime import console, env
from xla_mnist.runtime.errors import UsageError
from xla_mnist.workdir import files

_WORKDIR: flags.FlagHolder | None = None
_SWEEP: flags.FlagHolder | None = None
_PAGE: flags.FlagHolder | None = None
_REPEATS: flags.FlagHolder | None = None
_TIME_BUDGET: flags.FlagHolder | None = None
_FIT: flags.FlagHolder | None = None
# Fields a sweep leaves alone: compare's own (every jit mode; the steps, the
# fused mode's steps a call and the profiled window, which its time budget
# sizes) and those that change no step (logging, checkpoints, dumps).
UNSWEPT = (
  'jit',
  'num_steps',
  'steps_per_loop',
  'profile_steps',
  'log_every',
  'checkpoint_every',
  'keep_checkpoints',
  'dump_hlo',
)


def sweepable() -> dict[str, type]:
  """The fields --sweep takes, each of its type in configs/default.py: the
  recipe's own and its groups' (`optimizer_args.momentum`)."""
  fields = {}
  for name, value in default.get_config().items():
    if isinstance(value, ConfigDict):
      fields |= {f'{name}.{k}': value.get_ref(k).get_type() for k in value}
    elif name not in UNSWEPT:
      fields[name] = type(value)
  return fields


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
  fields = sweepable()
  for text in _SWEEP.value or []:
    field, values = why.parse_sweep(text, fields)
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
    sweep=swept.pop(why.SWEPT, None),
    by=swept,
    page=_PAGE.value,
    time_budget=_TIME_BUDGET.value,
    fit=_FIT.value,
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
  global _WORKDIR, _SWEEP, _PAGE, _REPEATS, _TIME_BUDGET, _FIT
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
    ' FIELD=V,V,..., any other field of the recipe that changes the step'
    ' (model, optimizer, learning_rate, dataset, optimizer_args.momentum...):'
    ' compares every mode for each value too, each with its verdict. Once a'
    ' field; several fields each compared apart.',
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
  _FIT = flags.DEFINE_bool(
    'fit',
    True,
    "Also trains the recipe by Keras's own model.fit at the loop's settings"
    ' (jit_compile False, True, and True with steps_per_execution=K), timed'
    " and profiled alike: what fit's default picks here, and whether to set"
    ' them.',
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
