r"""Times every way of running the training step, and what users would run.

  python -m benchmarks.bench [--steps=1000] [--repeats=3] [--process_runs=5]
      [--scaling] [--jax_python=PY] [--out=FILE.json] [--page=docs/results.md]

On the real Fashion-MNIST, with the `fashion_mnist` config's recipe, each
variant trains from zero weights on the same batch order. The baselines
(`baselines.py`): hand-written numpy, TF1's program as a tf.compat.v1 session
(XLA off and `global_jit_level=ON_1`), Keras's `fit` with `jit_compile` and
`steps_per_execution`, and JAX's jit step and lax.scan (in `--jax_python`'s
interpreter; skipped, with the reason, when it has no JAX). This project's
variants: `eager` runs `step.make_update` op by op and `tf.function` is the
textbook TF2 loop, both fed by tf.data; `trainer --jit=off`, `jit per step`
and `auto-clustering` are the trainer's one-step programs, `fused K=...` its
XLA loop of K steps per call (K=100 is the default), `fused K=100, Dense` the
same with Keras's Dense layer. The ratios are times per step over the default
fused loop's. A variant's compile time is all that comes before its timed
steps: tracing, the input pipeline's set-up, XLA's compile and the first call
(a zero-step call for the fused loop); its train time is the remaining steps.
Each round runs every variant once, in alternating order, each a fresh model
and program; the figures are medians over rounds. Then `process.py` times
whole processes, and `results.py` writes the results page from the JSON.

Auto-clustering is process-wide in TF, so it is switched on only around its
own variant, and XLA dumps the modules of any cluster it compiles into a
scratch folder: the `cluster_compiles` column shows where clustering happened.
"""

from __future__ import annotations

import os
import sys
import tempfile

from xla_mnist import env  # Imports no TF.

# Set before TF starts, which reads them once. The CPU flag alone clusters
# nothing: it lets `set_jit('autoclustering')` cluster on the CPU, and the
# benchmark turns that on only around the auto-clustering variant.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # As train.py: no C++ log.
# numpy's BLAS on one thread, as TF's (config.cpu_threads): with two on 2
# shared cores the numpy baseline ran 8x slower here.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
env.autocluster(everywhere=False)
_CLUSTER_DUMP = tempfile.mkdtemp(prefix='xla_mnist_clusters_')
os.environ['XLA_FLAGS'] = (
  f'--xla_dump_to={_CLUSTER_DUMP} --xla_dump_hlo_module_re=cluster_.*'
)

import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402
from tensorflow.python.util import _pywrap_util_port  # noqa: E402

from benchmarks import baselines, process, results  # noqa: E402
from xla_mnist import (  # noqa: E402
  data,
  devices,
  files,
  loop,
  model,
  outputs,
  program,
  step,
)
from xla_mnist.configs import fashion_mnist  # noqa: E402
from xla_mnist.errors import UsageError, UserError  # noqa: E402

_STEPS = flags.DEFINE_integer('steps', 1000, 'Training steps per run.')
_REPEATS = flags.DEFINE_integer(
  'repeats', 3, 'Rounds over all variants; the figures are their medians.'
)
_PROCESS_RUNS = flags.DEFINE_integer(
  'process_runs', 5, 'Whole-process runs per program (0: no process table).'
)
_SCALING = flags.DEFINE_bool(
  'scaling', False, 'Also time the trainer for larger batches and runs.'
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

FUSED = 'fused K=100'  # The default program, which the ratios compare to.
# The first steps' losses, which every variant must share: same batches, same
# maths. Later ones drift apart with the summation order: at lr 0.5 a 1e-7
# difference grows about tenfold every two steps (measured: ~1e-6 by step 8).
HEAD_STEPS = 10


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  # numpy, tf1, keras: the baselines; eager: `step.make_update` op by op;
  # fed: the textbook loop, tf.data batches into a `tf.function` step;
  # trainer: the trainer's program for `jit` and `steps_per_loop`.
  program: str
  jit: str = 'off'  # The trainer's jit mode; for tf1, XLA on or off.
  steps_per_loop: int = 1  # As in the config: 1 per step, 0 all steps per call.
  # Keras's Dense, W stored [784, 10], instead of the model's Linear [10, 784].
  dense: bool = False


VARIANTS = (
  Variant('numpy', 'numpy'),
  Variant('TF1 session', 'tf1', 'off'),
  Variant('TF1 session, XLA ON_1', 'tf1', 'on'),
  Variant('Keras fit, XLA, 100 steps/execution', 'keras', 'on', 100),
  Variant('eager', 'eager'),
  Variant('tf.function', 'fed'),
  Variant('trainer --jit=off', 'trainer', 'off', 1),
  Variant('jit per step', 'trainer', 'on', 1),
  Variant('auto-clustering', 'trainer', 'auto', 1),
  Variant('fused K=10', 'trainer', 'on', 10),
  Variant(FUSED, 'trainer', 'on', 100),
  Variant('fused K=100, Dense', 'trainer', 'on', 100, dense=True),
  Variant('fused K=all', 'trainer', 'on', 0),
)


@dataclasses.dataclass(frozen=True)
class Measurement:
  variant: str
  steps_per_call: int
  compile_seconds: float  # Medians over rounds.
  train_seconds: float
  timed_steps: int
  steps_per_second: float
  vs_fused: float  # Time per step over the default fused loop's.
  final_loss: float | None  # None where the program reports no losses.
  test_accuracy: float
  cluster_compiles: int  # XLA compiles of auto-clustered modules, all rounds.
  head_losses: list[float]  # The first HEAD_STEPS losses.


def _fed_program(
  update: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
  train: data.Split,
  config: ml_collections.ConfigDict,
) -> loop.Program:
  """`update(images, labels)` called on tf.data's batches, one per call."""
  batches = iter(data.train_batches(train, config.batch_size, config.seed))
  return loop.Program(lambda _: update(*next(batches)), 1)


def _dense_model() -> tf.keras.Model:
  """`model.create_model` with Keras's Dense: what the layout choice costs."""
  return tf.keras.Sequential(
    [
      tf.keras.Input((model.NUM_FEATURES,)),
      tf.keras.layers.Dense(model.NUM_CLASSES, kernel_initializer='zeros'),
    ]
  )


def _program(
  variant: Variant,
  config: ml_collections.ConfigDict,
  train: data.Split,
  net: tf.keras.Model,
) -> loop.Program:
  optimizer = tf.keras.optimizers.SGD(config.learning_rate)
  optimizer.build(net.trainable_variables)
  if variant.program == 'trainer':
    strategy = tf.distribute.get_strategy()  # The default: one device.
    return program.make(net, optimizer, train, config, 0, strategy).program
  update = step.make_update(net, optimizer, config.batch_size)
  if variant.program == 'fed':
    update = tf.function(update)
  return _fed_program(update, train, config)


def _train_once(
  variant: Variant, config: ml_collections.ConfigDict, train: data.Split
) -> baselines.Run:
  """Trains from zero weights; times what precedes the timed steps apart."""
  if variant.program == 'numpy':
    return baselines.numpy_sgd(train, config)
  if variant.program == 'tf1':
    return baselines.tf1_session(train, config, xla=variant.jit == 'on')
  if variant.program == 'keras':
    return baselines.keras_fit(train, config)
  net = _dense_model() if variant.dense else model.create_model()
  start = time.perf_counter()  # Making the program traces it.
  prog = _program(variant, config, train, net)
  tracing = time.perf_counter() - start
  head = _HeadLosses()
  # The trainer's loop and clock: compile and train time as the trainer
  # reports them.
  stats = loop.Loop(prog, [head]).run(0, config.num_steps)
  weights = net.get_weights()
  if variant.dense:
    weights[0] = weights[0].T  # To the Linear layout of the eval model.
  return baselines.Run(
    tracing + stats.compile_seconds,
    stats.train_seconds,
    stats.timed_steps,
    np.array([*head.losses, stats.last_loss]),
    weights,
  )


class _HeadLosses(loop.Action):
  """Keeps the first HEAD_STEPS losses; waits for no call after those."""

  needs_losses = True

  def __init__(self) -> None:
    self.losses: list[float] = []

  def due(self, first: int, last: int, end: int) -> bool:
    del last, end  # Unused.
    return first <= HEAD_STEPS

  def __call__(self, boundary: loop.Boundary) -> None:
    self.losses += [loss for _, loss in boundary.synced_steps()]


def _cluster_modules() -> set[str]:
  """The auto-clustered XLA modules dumped so far in this process."""
  names = os.listdir(_CLUSTER_DUMP)
  return {m.group(0) for n in names if (m := re.match(r'module_\d+', n))}


def _config_for(
  variant: Variant, config: ml_collections.ConfigDict
) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(config)
  config.jit = variant.jit
  config.steps_per_loop = variant.steps_per_loop or config.num_steps
  return config


def _steps_per_call(variant: Variant, config: ml_collections.ConfigDict) -> int:
  config = _config_for(variant, config)
  if variant.program == 'keras':
    return baselines.keras_steps_per_execution(config)
  return program.steps_per_loop(config)


def _run_variant(
  variant: Variant, config: ml_collections.ConfigDict, train: data.Split
) -> tuple[baselines.Run, int]:
  """One run of `variant` and the XLA cluster modules it compiled."""
  modules = _cluster_modules()
  if variant.jit == 'auto':
    tf.config.optimizer.set_jit('autoclustering')
  try:
    run = _train_once(variant, _config_for(variant, config), train)
  finally:
    tf.config.optimizer.set_jit(False)
  return run, len(_cluster_modules() - modules)


def summarize(
  name: str,
  steps_per_call: int,
  runs: list[baselines.Run],
  clusters: int,
  accuracy: Callable[[list[np.ndarray]], float],
) -> Measurement:
  """Medians over the rounds; `vs_fused` is left at 1.0."""
  last = runs[-1]
  train_seconds = statistics.median(r.train_seconds for r in runs)
  return Measurement(
    variant=name,
    steps_per_call=steps_per_call,
    compile_seconds=statistics.median(r.compile_seconds for r in runs),
    train_seconds=train_seconds,
    timed_steps=last.timed_steps,
    steps_per_second=last.timed_steps / train_seconds,
    vs_fused=1.0,
    final_loss=float(last.losses[-1]) if len(last.losses) else None,
    test_accuracy=accuracy(last.weights),
    cluster_compiles=clusters,
    head_losses=[float(x) for x in last.losses[:HEAD_STEPS]],
  )


def _test_accuracy(
  test: data.Split,
) -> Callable[[list[np.ndarray]], float]:
  """One evaluation function for every variant's weights: a single trace."""
  net = model.create_model()
  evaluate = step.make_eval_step(net, 'off')

  def accuracy(weights: list[np.ndarray]) -> float:
    net.set_weights(weights)
    return float(evaluate(test.images, test.labels))

  return accuracy


def _with_ratios(measurements: list[Measurement]) -> list[Measurement]:
  base = next(m for m in measurements if m.variant == FUSED)
  return [
    dataclasses.replace(m, vs_fused=base.steps_per_second / m.steps_per_second)
    for m in measurements
  ]


def _machine() -> dict[str, str | int | bool]:
  flags_line = ''
  try:
    with open('/proc/cpuinfo') as f:
      flags_line = re.search(r'flags\s*:\s*(.*)', f.read()).group(1)
  except (OSError, AttributeError):
    pass
  return {
    'cpu': outputs.cpu_model(),
    'cores': os.cpu_count() or 0,
    'avx512': 'avx512f' in flags_line.split(),
    # What this process's TF decided: TF_ENABLE_ONEDNN_OPTS if set, else the
    # CPU's default (on with AVX-512 VNNI and the like).
    'onednn': bool(_pywrap_util_port.IsMklEnabled()),
    'python': platform.python_version(),
    'tensorflow': tf.__version__,
    'numpy': np.__version__,
  }


def _warm_up_process(config: ml_collections.ConfigDict, train: data.Split):
  """Pays TF's one-time start-up costs, which the first variant would pay.

  Among them the first execution of XLA:CPU's dots in a process, 30 to 40 ms
  (issue 13's first progress window), which no zero-step warm-up pays.
  """
  config = ml_collections.ConfigDict(config)
  config.num_steps = 2
  for jit in ('off', 'on'):
    _run_variant(Variant('warm-up', 'trainer', jit, 2), config, train)


def run(
  steps: int,
  repeats: int,
  data_dir: str,
  jax_python: str,
  log: Callable[[str], None] = print,
) -> dict:
  """Measures every variant in alternating rounds; returns the report."""
  if steps < 1 or repeats < 1:
    raise UsageError(
      f'--steps={steps} --repeats={repeats}: both must be at least 1'
    )
  load_before = os.getloadavg()[0]
  config = fashion_mnist.get_config()
  config.num_steps = steps
  config.profile_steps = 0
  devices.configure_threads(config.cpu_threads)
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  jax_variants = baselines.JaxVariants(jax_python, dataset.train, config)
  runs: dict[str, list[baselines.Run]] = {}
  clusters: dict[str, int] = {}
  with tf.device(devices.select(config.device)):
    _warm_up_process(config, dataset.train)
    accuracy = _test_accuracy(dataset.test)
    for round_ in range(repeats):
      log(f'round {round_ + 1} of {repeats} ...')
      for variant in VARIANTS[:: 1 if round_ % 2 == 0 else -1]:
        run_, compiles = _run_variant(variant, config, dataset.train)
        runs.setdefault(variant.name, []).append(run_)
        clusters[variant.name] = clusters.get(variant.name, 0) + compiles
      if not jax_variants.skipped:
        for name, run_ in jax_variants.run().items():
          runs.setdefault(name, []).append(run_)
    jax_variants.close()
    calls = {
      **{v.name: _steps_per_call(v, config) for v in VARIANTS},
      **{'jax jit step': 1, 'jax lax.scan': steps},
    }
    measurements = _with_ratios(
      [
        summarize(name, calls[name], r, clusters.get(name, 0), accuracy)
        for name, r in runs.items()
      ]
    )
  return {
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds'
    ),
    'machine': {**_machine(), 'jax': jax_variants.version},
    # Other processes' work skews the times: the 1-minute load, before and
    # after, tells whether the machine was otherwise idle (load < ~1).
    'load_average': [load_before, os.getloadavg()[0]],
    'dataset': config.dataset,
    'steps': steps,
    'repeats': repeats,
    'batch_size': config.batch_size,
    'learning_rate': config.learning_rate,
    'seed': config.seed,
    'cpu_threads': config.cpu_threads,
    'jax_skipped': jax_variants.skipped,
    'variants': [dataclasses.asdict(m) for m in measurements],
  }


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    print(f'error: unexpected arguments {" ".join(argv[1:])}', file=sys.stderr)
    sys.exit(2)
  # Each repeat traces a fresh program on purpose; TF would warn of retracing.
  tf.get_logger().setLevel('ERROR')
  try:
    report = run(
      _STEPS.value, _REPEATS.value, _DATA_DIR.value, _JAX_PYTHON.value
    )
    if _PROCESS_RUNS.value:
      print('whole processes ...')
      report['processes'] = process.whole_processes(
        _PROCESS_RUNS.value, _DATA_DIR.value
      )
      report['process_runs'] = _PROCESS_RUNS.value
    if _SCALING.value:
      print('scaling ...')
      report['scaling'] = process.scaling(_DATA_DIR.value, _STEPS.value)
    os.makedirs(os.path.dirname(_OUT.value) or '.', exist_ok=True)
    files.write_atomically(_OUT.value, json.dumps(report, indent=2) + '\n')
    if _PAGE.value:
      results.write_page(report, _PAGE.value)
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(e.exit_code)
  finally:
    shutil.rmtree(_CLUSTER_DUMP, ignore_errors=True)
  print(results.text(report))
  print(
    f'written to {_OUT.value}' + (f' and {_PAGE.value}' if _PAGE.value else '')
  )


if __name__ == '__main__':
  app.run(main)
