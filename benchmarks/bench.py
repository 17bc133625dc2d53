r"""Times every way of running the training step, and what users would run.

  python -m benchmarks.bench [--steps=1000] [--repeats=3] [--process_runs=5]
      [--scaling] [--noinference | --inference_workdir=W] [--nokernels]
      [--model_steps=200] [--fit_steps=1000] [--fit_cnn_steps=10]
      [--jax_python=PY]
      [--out=FILE.json] [--page=docs/results.md]

On the real Fashion-MNIST, with the `fashion_mnist` config's recipe, each
variant trains from zero weights on the same batch order. The baselines
(`baselines.py`): hand-written numpy, TF1's program as a tf.compat.v1 session
(XLA off and `global_jit_level=ON_1`), Keras's `fit` with `jit_compile` and
`steps_per_execution`, and JAX's jit step and lax.scan (in `--jax_python`'s
interpreter, at JAX's defaults and at one thread, `threads.py`; skipped,
with the reason, when it has no JAX). This project's
variants (`training.py`): `eager` runs `step.make_update` op by op and
`tf.function` is the textbook TF2 loop, both fed by tf.data; `trainer
--jit=off`, `jit per step` and `auto-clustering` are the trainer's one-step
programs, `fused K=...` its XLA loop of K steps per call (K=100 is the
default), `fused K=100, Dense` the same with Keras's Dense layer. The ratios
are times per step over the default fused loop's. A variant's compile time
is all that comes before its timed steps: tracing, the input pipeline's
set-up, XLA's compile and the first call (a zero-step call for the fused
loop); its train time is the remaining steps. Each round runs every variant
once, in alternating order, each a fresh model and program; the figures are
medians over rounds. The same way, each packaged model runs by its config
against `--jit=off` (`by_model`), and by the loop off, on and fused beside
Keras's `fit` at the matching setting, with SGD and with Adam
(`versus_fit`). Then `kernels.py` compares the fused loop's kernels
with lax.scan's, from one untimed profile of each, `process.py` times whole
processes (the trainer at `config.cpu_threads` 1, 0 and 2, JAX's program at
each of its thread settings), `inference.py` an exported run's inference,
and `results.py` writes the results page from the JSON.

Auto-clustering is process-wide in TF, so it is switched on only around its
own variant, and XLA dumps the modules of any cluster it compiles into a
scratch folder: the `cluster_compiles` column shows where clustering happened.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import tempfile
from types import ModuleType

from absl import flags, logging
from ml_collections import ConfigDict

# No TensorFlow or numpy yet: `_import_training` sets what they read as they
# start, then imports them.
from benchmarks import inference, kernels, machine, process, results
from xla_mnist.configs import cnn, fashion_mnist, mlp
from xla_mnist.export import build
from xla_mnist.runtime import cli, env, errors
from xla_mnist.runtime.errors import UsageError, UserError
from xla_mnist.workdir import files

# Defined by `_define_flags` as `_parse_flags` runs (see `runtime.cli`).
_STEPS: flags.FlagHolder
_REPEATS: flags.FlagHolder
_PROCESS_RUNS: flags.FlagHolder
_SCALING: flags.FlagHolder
_INFERENCE: flags.FlagHolder
_INFERENCE_WORKDIR: flags.FlagHolder
_JAX_PYTHON: flags.FlagHolder
_OUT: flags.FlagHolder
_PAGE: flags.FlagHolder
_DATA_DIR: flags.FlagHolder
_KERNELS: flags.FlagHolder
_MODEL_STEPS: flags.FlagHolder
_FIT_STEPS: flags.FlagHolder
_FIT_CNN_STEPS: flags.FlagHolder


def _define_flags() -> None:
  global _STEPS, _REPEATS, _PROCESS_RUNS, _SCALING, _INFERENCE
  global _INFERENCE_WORKDIR, _JAX_PYTHON, _OUT, _PAGE, _DATA_DIR, _KERNELS
  global _MODEL_STEPS, _FIT_STEPS, _FIT_CNN_STEPS
  _STEPS = flags.DEFINE_integer('steps', 1000, 'Training steps per run.')
  _REPEATS = flags.DEFINE_integer(
    'repeats',
    3,
    'Rounds over all variants; the figures are their medians. Also the'
    ' inference passes, of which the fastest counts.',
  )
  _PROCESS_RUNS = flags.DEFINE_integer(
    'process_runs', 5, 'Whole-process runs per program (0: no process table).'
  )
  _SCALING = flags.DEFINE_bool(
    'scaling', False, 'Also time the trainer for larger batches and runs.'
  )
  _INFERENCE = flags.DEFINE_bool(
    'inference',
    True,
    "Also time inference of an exported run (`inference.py`): the recipe's"
    ' run trained for --steps and compiled by python -m xla_mnist.aot (needs'
    ' make toolchain), unless --inference_workdir names one.',
  )
  _INFERENCE_WORKDIR = flags.DEFINE_string(
    'inference_workdir',
    '',
    'An exported run (python -m xla_mnist.aot) whose inference is timed.',
  )
  _JAX_PYTHON = flags.DEFINE_string(
    'jax_python',
    os.environ.get('XLA_MNIST_JAX_PYTHON') or sys.executable,
    'The Python that runs the JAX variants ($XLA_MNIST_JAX_PYTHON).',
  )
  _OUT = flags.DEFINE_string('out', 'logs/bench.json', 'The JSON report.')
  _PAGE = flags.DEFINE_string(
    'page', 'docs/results.md', 'The results page written from the report.'
  )
  _DATA_DIR = flags.DEFINE_string(
    'data_dir', './data', 'TFDS data dir, where the dataset is prepared once.'
  )
  _KERNELS = flags.DEFINE_bool(
    'kernels',
    True,
    "Also profile TF's fused loop and JAX's lax.scan once each, untimed, and"
    ' compare their kernels (`kernels.py`; needs JAX).',
  )

  _MODEL_STEPS = flags.DEFINE_integer(
    'model_steps',
    200,
    'Steps per run of the by-model table: each packaged model trained by'
    ' its config (fused, its own K) against --jit=off (0: no table). The'
    " CNN's step is the slow one: keep it to a few hundred.",
  )
  _FIT_STEPS = flags.DEFINE_integer(
    'fit_steps',
    500,
    "Steps per run of the table of the loop against Keras's fit: each"
    ' packaged model with SGD and Adam, the loop off, on and fused beside'
    ' fit at the matching setting (0: no table).',
  )
  _FIT_CNN_STEPS = flags.DEFINE_integer(
    'fit_cnn_steps',
    4,
    "The CNN's steps in that table: its fused loop takes a second and more"
    ' a step (docs/models.md), and each of its runs compiles for seconds.',
  )


def _parse_flags(argv: list[str]) -> list[str]:
  _define_flags()
  return cli.parse(argv)


def _import_training(cluster_dump: str) -> ModuleType:
  """Sets the environment TF and numpy read once, as they start; then
  imports them, with the in-process variants.

  The CPU flag alone clusters nothing: it lets `set_jit('autoclustering')`
  cluster on the CPU, which the auto-clustering variant turns on around
  itself; XLA dumps each cluster's module into `cluster_dump`.
  """
  started = [m for m in ('tensorflow', 'numpy') if m in sys.modules]
  if started:  # Would ignore the settings below and skew every figure.
    raise RuntimeError(f'{", ".join(started)} imported before the set-up')
  env.quiet_by_default()
  # numpy's BLAS on one thread, as TF's (config.cpu_threads): with two on 2
  # shared cores the numpy baseline ran 8x slower.
  os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
  env.autocluster(everywhere=False)
  os.environ['XLA_FLAGS'] = (
    f'--xla_dump_to={cluster_dump} --xla_dump_hlo_module_re=cluster_.*'
  )
  with env.importing_tensorflow():
    from benchmarks import training  # noqa: PLC0415 - imports TF.
  return training


def _check_flags() -> None:
  """Fails before the first measurement, not after the others."""
  if _STEPS.value < 1 or _REPEATS.value < 1 or _PROCESS_RUNS.value < 0:
    raise UsageError(
      f'{errors.arg("steps", _STEPS.value)}'
      f' {errors.arg("repeats", _REPEATS.value)}'
      f' {errors.arg("process_runs", _PROCESS_RUNS.value)}: steps and repeats'
      ' must be at least 1, process_runs at least 0'
    )
  steps, cnn_steps = _FIT_STEPS.value, _FIT_CNN_STEPS.value
  if steps and min(steps, cnn_steps) < 2:  # A run times its later steps.
    raise UsageError(
      f'{errors.arg("fit_steps", steps)}'
      f' {errors.arg("fit_cnn_steps", cnn_steps)}: both must be at least 2,'
      ' or fit_steps 0 (no table)'
    )
  _check_output(_OUT.value, 'out')
  if _PAGE.value:
    _check_output(_PAGE.value, 'page')
  if _INFERENCE.value and _INFERENCE_WORKDIR.value:
    inference.check_export(_INFERENCE_WORKDIR.value)
  elif _INFERENCE.value:
    build.check_toolchain()


def _check_output(path: str, arg: str) -> None:
  """UserError unless file `path` can be written, before any measurement."""
  folder = os.path.dirname(path) or '.'
  try:
    if os.path.isdir(path):
      raise IsADirectoryError(21, 'Is a directory')
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as e:
    raise UserError(
      f'{path} cannot be written ({e.strerror}): pass'
      f' {errors.arg(arg, "FILE")} in a writable folder'
    ) from None


def _in_process(
  config: ConfigDict, dump: str, profiles: str
) -> tuple[list, str, str, dict]:
  """`training.run`'s figures, JAX's version and why it was skipped, and
  the report's other in-process parts the flags ask for (by model, against
  fit, with --kernels the kernel comparison: the JAX worker profiles into
  `profiles` after its timed runs)."""
  training = _import_training(dump)
  if _KERNELS.value:
    os.environ[kernels.PROFILE_DIR_ENV] = profiles
  try:
    variants, jax_version, jax_skipped = training.run(
      config, _DATA_DIR.value, _REPEATS.value, _JAX_PYTHON.value, dump
    )
  finally:
    os.environ.pop(kernels.PROFILE_DIR_ENV, None)
  parts = {}
  if _MODEL_STEPS.value:
    print('by model ...')
    by_model = training.by_model(
      _model_configs(_MODEL_STEPS.value), _DATA_DIR.value, _REPEATS.value
    )
    parts['by_model'] = {
      'steps': _MODEL_STEPS.value,
      'models': {name: _dicts(ms) for name, ms in by_model.items()},
    }
  if _FIT_STEPS.value:
    print('against fit ...')
    parts['versus_fit'] = training.versus_fit(
      fit_configs(_FIT_STEPS.value, _FIT_CNN_STEPS.value),
      _DATA_DIR.value,
      _REPEATS.value,
    )
  if _KERNELS.value:
    print('kernels ...')
    parts['kernels'] = (
      {'skipped': 'JAX skipped'}
      if jax_skipped
      else kernels.measure(config, _DATA_DIR.value, profiles)
    )
  return variants, jax_version, jax_skipped, parts


def _dicts(measurements: list) -> list[dict]:
  return [dataclasses.asdict(m) for m in measurements]


# Each packaged model (config.PACKAGED_MODELS) by the config that trains it.
_MODEL_CONFIGS = {'softmax': fashion_mnist, 'mlp': mlp, 'cnn': cnn}


def _model_configs(steps: int) -> dict[str, ConfigDict]:
  """What `xla-mnist-train --config=<model>` runs, for `steps` steps."""
  configs = {}
  for name, module in _MODEL_CONFIGS.items():
    config = module.get_config()
    config.num_steps = steps
    config.profile_steps = 0
    configs[name] = config
  return configs


# Adam's rate: Keras's default (the recipe's 0.5 is SGD's, and diverges).
_ADAM_RATE = 1e-3


def fit_configs(steps: int, cnn_steps: int) -> list[ConfigDict]:
  """Each packaged model's config with SGD (its own rate) and with Adam,
  for `steps` steps (the CNN's, `cnn_steps`)."""
  configs = []
  for name, config in _model_configs(steps).items():
    if name == 'cnn':
      config.num_steps = cnn_steps
    for optimizer in ('sgd', 'adam'):
      each = ConfigDict(config)
      each.optimizer = optimizer
      if optimizer == 'adam':
        each.learning_rate = _ADAM_RATE
      configs.append(each)
  return configs


def _measure() -> dict:
  """Every table the flags ask for: the report."""
  config = fashion_mnist.get_config()
  config.num_steps = _STEPS.value
  config.profile_steps = 0
  load_before = os.getloadavg()[0]
  with (
    tempfile.TemporaryDirectory(prefix='xla_mnist_clusters_') as dump,
    tempfile.TemporaryDirectory(prefix='xla_mnist_kernels_') as profiles,
  ):
    variants, jax_version, jax_skipped, parts = _in_process(
      config, dump, profiles
    )
  report = {
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds'
    ),
    'machine': {**machine.describe(), 'jax': jax_version},
    # Other processes' work skews the times: the 1-minute load, before and
    # after, tells whether the machine was otherwise idle (load < ~1).
    'load_average': [load_before, os.getloadavg()[0]],
    'dataset': config.dataset,
    'steps': config.num_steps,
    'repeats': _REPEATS.value,
    'batch_size': config.batch_size,
    'learning_rate': config.learning_rate,
    'seed': config.seed,
    'cpu_threads': config.cpu_threads,
    'jax_skipped': jax_skipped,
    'variants': _dicts(variants),
    **parts,
  }
  if _PROCESS_RUNS.value:
    print('whole processes ...')
    report['processes'] = process.whole_processes(
      _PROCESS_RUNS.value,
      _DATA_DIR.value,
      '' if jax_skipped else _JAX_PYTHON.value,
    )
    report['process_runs'] = _PROCESS_RUNS.value
  if _SCALING.value:
    print('scaling ...')
    report['scaling'] = process.scaling(_DATA_DIR.value, _STEPS.value)
  if _INFERENCE.value:
    print('inference ...')
    with tempfile.TemporaryDirectory(prefix='xla_mnist_export_') as scratch:
      workdir = _INFERENCE_WORKDIR.value or inference.export_run(
        scratch, _DATA_DIR.value, _STEPS.value
      )
      report['inference'] = inference.measure(workdir, _REPEATS.value)
  return report


def main(argv: list[str]) -> None:
  if not flags.FLAGS['verbosity'].present:  # As train.py: no TFDS chatter.
    logging.set_verbosity(logging.ERROR)
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {" ".join(argv[1:])}: flags only')
  _check_flags()
  cli.unwind_on_signals()  # From here on files are written.
  report = _measure()
  print(results.text(report))
  out = _save(json.dumps(report, indent=2) + '\n')
  if _PAGE.value:
    try:
      results.write_page(report, _PAGE.value)
    except OSError as e:
      raise UserError(
        f'{_PAGE.value} cannot be written ({e.strerror}); the figures are in'
        f' {out}: python -m benchmarks.results {out} PAGE writes the page'
      ) from None
  print(
    f'written to {_OUT.value}' + (f' and {_PAGE.value}' if _PAGE.value else '')
  )


def _save(text: str) -> str:
  """Writes the report to --out; returns where it went. If --out fails now
  (a full disk), the figures go to a temp file, named in the error."""
  try:
    os.makedirs(os.path.dirname(_OUT.value) or '.', exist_ok=True)
    files.write_atomically(_OUT.value, text)
  except OSError as e:
    raise UserError(
      f'{_OUT.value} cannot be written ({e.strerror}); the figures are'
      f' {_kept(text)}: copy them from there'
    ) from None
  return _OUT.value


def _kept(text: str) -> str:
  """Where a report that --out could not take went: a temp file, or only
  the tables printed above when that fails too."""
  try:
    fd, kept = tempfile.mkstemp(prefix='bench-', suffix='.json')
    with os.fdopen(fd, 'w') as f:
      f.write(text)
  except OSError:
    return 'in the tables printed above only'
  return f'kept in {kept}'


if __name__ == '__main__':
  cli.run(main, _parse_flags)
