r"""Times every way of running the training step, in one process.

  python -m benchmarks.bench [--steps=1000] [--repeats=3] [--out=FILE.json]

On the real Fashion-MNIST, with the recipe of `configs/fashion_mnist.py`, each
variant trains from zero weights on the same batch order. `numpy` is the
recipe hand-written in numpy, the bar the issue set; `eager` runs
`step.make_update` op by op and `tf.function` is the textbook TF2 loop, both
fed batches by tf.data; the ratios are to `tf.function`. The rest are the
trainer's programs over the resident dataset: `trainer --jit=off`, `jit per
step` and `auto-clustering` one step per call for `--jit` off, on and auto,
`fused K=...` K steps per call of the XLA loop, and `fused K=100, Dense` the
same with Keras's Dense layer in place of the model's transposed `Linear`. A
variant's compile time is all that comes before its timed steps: tracing, the
input pipeline's set-up, XLA's compile and the first call (a zero-step call
for the fused loop); its train time is the remaining steps. Both are the
minimum over repeats, each repeat a fresh model and a freshly traced program.

Auto-clustering is process-wide in TF, so it is switched on only around its
own variant, and XLA dumps the modules of any cluster it compiles into a
scratch folder: the `cluster_compiles` column shows where clustering happened.
"""

from __future__ import annotations

import os
import sys
import tempfile

# Set before TF starts, which reads them once. The CPU flag alone clusters
# nothing: it lets `set_jit('autoclustering')` cluster on the CPU, and the
# benchmark turns that on only around the auto-clustering variant.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # As train.py: no C++ log.
os.environ['TF_XLA_FLAGS'] = '--tf_xla_cpu_global_jit'
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
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from xla_mnist import data, devices, model, outputs, step, trainer  # noqa: E402
from xla_mnist.configs import fashion_mnist  # noqa: E402
from xla_mnist.errors import UsageError, UserError  # noqa: E402

_STEPS = flags.DEFINE_integer('steps', 1000, 'Training steps per repeat.')
_REPEATS = flags.DEFINE_integer(
  'repeats', 3, 'Runs per variant; the times are the fastest run.'
)
_OUT = flags.DEFINE_string('out', 'logs/bench.json', 'The JSON report.')
_DATA_DIR = flags.DEFINE_string(
  'data_dir', './data', 'TFDS data dir, where the dataset is prepared once.'
)

BASELINE = 'tf.function'
# The first steps' losses, which every variant must share: same batches, same
# maths. Later ones drift apart with the summation order: at lr 0.5 a 1e-7
# difference grows about tenfold every two steps (measured: ~1e-6 by step 8).
HEAD_STEPS = 10


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  # numpy: hand-written SGD; eager: `step.make_update` op by op; fed: the
  # textbook loop, tf.data batches into a `tf.function` step; trainer: the
  # trainer's program for `jit` and `steps_per_loop`.
  program: str
  jit: str = 'off'  # The trainer's jit mode.
  steps_per_loop: int = 1  # As in the config: 1 per step, 0 all steps per call.
  # Keras's Dense, W stored [784, 10], instead of the model's Linear [10, 784].
  dense: bool = False


VARIANTS = (
  Variant('numpy', 'numpy'),
  Variant('eager', 'eager'),
  Variant(BASELINE, 'fed'),
  Variant('trainer --jit=off', 'trainer', 'off', 1),
  Variant('jit per step', 'trainer', 'on', 1),
  Variant('auto-clustering', 'trainer', 'auto', 1),
  Variant('fused K=10', 'trainer', 'on', 10),
  Variant('fused K=100', 'trainer', 'on', 100),
  Variant('fused K=100, Dense', 'trainer', 'on', 100, dense=True),
  Variant('fused K=all', 'trainer', 'on', 0),
)


@dataclasses.dataclass(frozen=True)
class Measurement:
  variant: str
  steps_per_call: int
  compile_seconds: float
  train_seconds: float
  timed_steps: int
  steps_per_second: float
  speedup: float  # steps/s over the `tf.function` variant's.
  final_loss: float
  test_accuracy: float
  cluster_compiles: int  # XLA compiles of auto-clustered modules, all repeats.
  head_losses: list[float]  # The first HEAD_STEPS losses.


@dataclasses.dataclass(frozen=True)
class _Run:
  compile_seconds: float
  train_seconds: float
  timed_steps: int
  losses: np.ndarray
  weights: list[np.ndarray]  # The trained model's, as `get_weights` has them.


def _fed_program(
  update: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
  train: data.Split,
  config: ml_collections.ConfigDict,
) -> trainer.Program:
  """`update(images, labels)` called on tf.data's batches, one per call."""
  batches = iter(data.train_batches(train, config.batch_size, config.seed))
  run = lambda count: update(*next(batches))  # noqa: E731
  return trainer.Program(update, (), 1, run, warm_up=None)


class _NumpySGD:
  """The recipe in hand-written numpy, W stored [784, 10] as numpy likes it.

  The reference the issue set: XLA's fused loop should beat it.
  """

  def __init__(self, train: data.Split, config: ml_collections.ConfigDict):
    self.images = train.images.numpy().reshape(train.size, -1)
    self.labels = train.labels.numpy()
    batches = data.batch_indices(
      train.size, config.batch_size, config.seed
    ).batch(config.num_steps)
    self.indices = next(iter(batches)).numpy()  # Made before the timing.
    self.learning_rate = config.learning_rate
    self.w = np.zeros((self.images.shape[1], model.NUM_CLASSES), np.float32)
    self.b = np.zeros(model.NUM_CLASSES, np.float32)
    self.step = 0

  def run(self, count: int) -> np.ndarray:
    losses = np.empty(count, np.float32)
    for i in range(count):
      batch = self.indices[self.step]
      self.step += 1
      x = self.images[batch].astype(np.float32) / np.float32(255.0)
      y = self.labels[batch]
      logits = x @ self.w + self.b
      logits -= logits.max(axis=1, keepdims=True)
      exp = np.exp(logits)
      probs = exp / exp.sum(axis=1, keepdims=True)
      rows = np.arange(len(y))
      losses[i] = -np.log(probs[rows, y]).mean()
      probs[rows, y] -= 1.0  # d loss / d logits, times the batch size.
      probs /= len(y)
      self.w -= self.learning_rate * (x.T @ probs)
      self.b -= self.learning_rate * probs.sum(axis=0)
    return losses

  def weights(self) -> list[np.ndarray]:
    """In the Keras model's layout: kernel [10, 784], bias."""
    return [self.w.T.copy(), self.b.copy()]


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
) -> trainer.Program:
  optimizer = tf.keras.optimizers.SGD(config.learning_rate)
  optimizer.build(net.trainable_variables)
  if variant.program == 'trainer':
    strategy = tf.distribute.get_strategy()  # The default: one device.
    return trainer.make_program(net, optimizer, train, config, 0, strategy)
  update = step.make_update(net, optimizer, config.batch_size)
  if variant.program == 'fed':
    update = tf.function(update)
  return _fed_program(update, train, config)


def _train_once(
  variant: Variant, config: ml_collections.ConfigDict, train: data.Split
) -> _Run:
  """Trains from zero weights; times what precedes the timed steps apart."""
  if variant.program == 'numpy':
    sgd = _NumpySGD(train, config)
    start = time.perf_counter()
    program = trainer.Program(sgd.run, (), 1, sgd.run, warm_up=None)
  else:
    net = _dense_model() if variant.dense else model.create_model()
    start = time.perf_counter()  # `make_program` traces.
    program = _program(variant, config, train, net)
  losses = []
  if program.warm_up:
    program.warm_up()
  else:
    losses.append(np.reshape(program.run(1), -1))
  train_start = time.perf_counter()
  done = len(losses)
  while done < config.num_steps:
    count = min(program.steps_per_call, config.num_steps - done)
    losses.append(program.run(count))
    done += count
  # Waits for all.
  losses = np.concatenate([np.reshape(x, -1) for x in losses])
  end = time.perf_counter()
  timed_steps = config.num_steps - (0 if program.warm_up else 1)
  if variant.program == 'numpy':
    weights = sgd.weights()
  else:
    weights = net.get_weights()
    if variant.dense:
      weights[0] = weights[0].T  # To the Linear layout of the eval model.
  return _Run(
    train_start - start, end - train_start, timed_steps, losses, weights
  )


def _cluster_modules() -> set[str]:
  """The auto-clustered XLA modules dumped so far in this process."""
  names = os.listdir(_CLUSTER_DUMP)
  return {m.group(0) for n in names if (m := re.match(r'module_\d+', n))}


def measure(
  variant: Variant,
  config: ml_collections.ConfigDict,
  dataset: data.Data,
  repeats: int,
  accuracy: Callable[[list[np.ndarray]], float],
) -> Measurement:
  """Runs `variant` `repeats` times; `speedup` is left at 1.0."""
  config = ml_collections.ConfigDict(config)
  config.jit = variant.jit
  config.steps_per_loop = variant.steps_per_loop or config.num_steps
  modules = _cluster_modules()
  if variant.jit == 'auto':
    tf.config.optimizer.set_jit('autoclustering')
  try:
    runs = [_train_once(variant, config, dataset.train) for _ in range(repeats)]
  finally:
    tf.config.optimizer.set_jit(False)
  last = runs[-1]
  train_seconds = min(r.train_seconds for r in runs)
  return Measurement(
    variant=variant.name,
    steps_per_call=trainer.steps_per_loop(config),
    compile_seconds=min(r.compile_seconds for r in runs),
    train_seconds=train_seconds,
    timed_steps=last.timed_steps,
    steps_per_second=last.timed_steps / train_seconds,
    speedup=1.0,
    final_loss=float(last.losses[-1]),
    test_accuracy=accuracy(last.weights),
    cluster_compiles=len(_cluster_modules() - modules),
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


def _with_speedups(measurements: list[Measurement]) -> list[Measurement]:
  base = next(m for m in measurements if m.variant == BASELINE)
  return [
    dataclasses.replace(m, speedup=m.steps_per_second / base.steps_per_second)
    for m in measurements
  ]


def table(measurements: list[Measurement]) -> str:
  """The measurements as a Markdown table."""
  rows = [
    '| variant | steps/call | compile s | train s | ms/step | steps/s'
    ' | vs tf.function | test accuracy | cluster compiles |',
    '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
  ]
  for m in measurements:
    rows.append(
      f'| {m.variant} | {m.steps_per_call} | {m.compile_seconds:.3f}'
      f' | {m.train_seconds:.3f} | {1e3 / m.steps_per_second:.3f}'
      f' | {m.steps_per_second:,.0f} | {m.speedup:.2f}x'
      f' | {m.test_accuracy:.4f} | {m.cluster_compiles} |'
    )
  return '\n'.join(rows)


def _machine() -> dict[str, str | int]:
  cpu = platform.processor()
  try:
    with open('/proc/cpuinfo') as f:
      cpu = next(
        (line.split(':', 1)[1].strip() for line in f if 'model name' in line),
        cpu,
      )
  except OSError:
    pass
  return {
    'cpu': cpu,
    'cores': os.cpu_count() or 0,
    'tensorflow': tf.__version__,
  }


def _warm_up_process(config: ml_collections.ConfigDict, train: data.Split):
  """Pays TF's one-time start-up costs, which the first variant would pay."""
  config = ml_collections.ConfigDict(config)
  config.num_steps = 2
  for jit in ('off', 'on'):
    config.jit = jit
    _train_once(Variant('warm-up', 'trainer', jit), config, train)


def run(
  steps: int, repeats: int, data_dir: str, log: Callable[[str], None] = print
) -> dict:
  """Measures every variant; returns the report that `main` writes."""
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
  with tf.device(devices.select(config.device)):
    _warm_up_process(config, dataset.train)
    accuracy = _test_accuracy(dataset.test)
    measurements = []
    for variant in VARIANTS:
      log(f'{variant.name} ...')
      measurements.append(measure(variant, config, dataset, repeats, accuracy))
  measurements = _with_speedups(measurements)
  return {
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds'
    ),
    'machine': _machine(),
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
    'variants': [dataclasses.asdict(m) for m in measurements],
    'table': table(measurements),
  }


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    print(f'error: unexpected arguments {" ".join(argv[1:])}', file=sys.stderr)
    sys.exit(2)
  # Each repeat traces a fresh program on purpose; TF would warn of retracing.
  tf.get_logger().setLevel('ERROR')
  try:
    report = run(_STEPS.value, _REPEATS.value, _DATA_DIR.value)
    os.makedirs(os.path.dirname(_OUT.value) or '.', exist_ok=True)
    outputs.write_atomically(_OUT.value, json.dumps(report, indent=2) + '\n')
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(e.exit_code)
  finally:
    shutil.rmtree(_CLUSTER_DUMP, ignore_errors=True)
  machine = report['machine']
  load_before, load_after = report['load_average']
  print(
    f'{report["steps"]} steps of {report["batch_size"]}, fastest of'
    f' {report["repeats"]}, {machine["cpu"]}, {machine["cores"]} cores,'
    f' TF {machine["tensorflow"]}, load {load_before:.1f} then'
    f' {load_after:.1f}, {report["date"]}'
  )
  print(report['table'])
  print(f'written to {_OUT.value}')


if __name__ == '__main__':
  app.run(main)
