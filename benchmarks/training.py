"""Every way of running the training step, timed in this one process.

Each variant is a function in `VARIANTS`: it trains the run's recipe from
zero weights on the same batch order and returns a `baselines.Run`. Imports
TF: `bench.main` imports this module once TF's environment is set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator

import ml_collections
import numpy as np
import tensorflow as tf

from benchmarks import baselines, mnist
from xla_mnist import config as config_lib
from xla_mnist import data, input_pipeline, loop, model, program, step
from xla_mnist.runtime import devices

Variant = Callable[[data.Split, ml_collections.ConfigDict], baselines.Run]

FUSED = 'fused K=100'  # The default program, which the ratios compare to.
# The first steps' losses, which every variant must share: same batches, same
# maths. Later ones drift apart with the summation order: at lr 0.5 a 1e-7
# difference grows about tenfold every two steps (measured: ~1e-6 by step 8).
HEAD_STEPS = 10


@dataclasses.dataclass(frozen=True)
class Measurement:
  variant: str
  steps_per_loop: int
  compile_seconds: float  # Medians over rounds.
  train_seconds: float
  timed_steps: int
  round_train_seconds: list[float]  # Each round's, in order: for ratios.
  steps_per_second: float
  vs_fused: float  # Time per step over the default fused loop's.
  final_loss: float | None  # None where the program reports no losses.
  test_accuracy: float
  cluster_compiles: int  # XLA compiles of auto-clustered modules, all rounds.
  head_losses: list[float]  # The first HEAD_STEPS losses.
  threads: str  # The thread setting it ran at (`baselines.Run.threads`).


class _HeadLosses:
  """Keeps the first HEAD_STEPS losses; waits for no call after those."""

  def __init__(self) -> None:
    self.losses: list[float] = []

  def action(self) -> loop.Action:
    return loop.Action(self, every=1, losses=True, until=HEAD_STEPS)

  def __call__(self, boundary: loop.Boundary) -> None:
    if boundary.first <= HEAD_STEPS:
      self.losses += [loss for _, loss in boundary.synced_steps()]


def _looped(
  net: tf.keras.Model,
  make: Callable[[tf.keras.optimizers.Optimizer], loop.Program],
  config: ml_collections.ConfigDict,
) -> baselines.Run:
  """Runs `make(optimizer)`'s program in the trainer's loop and clock.

  Compile time is making the optimizer and program (tracing) and the loop's
  compile.
  """
  start = time.perf_counter()
  made = make(step.make_optimizer(net, config))
  tracing = time.perf_counter() - start
  head = _HeadLosses()
  stats = loop.Loop(
    made, [head.action()], learning_rate=config.learning_rate
  ).run(0, config.num_steps)
  return baselines.Run(
    tracing + stats.compile_seconds,
    stats.train_seconds,
    stats.timed_steps,
    np.array([*head.losses, stats.last_loss]),
    net.get_weights(),
    baselines.tf_threads(),
    made.steps_per_loop,
  )


def _fed(traced: bool) -> Variant:
  """`step.make_update` fed tf.data's batches: op by op, or the textbook
  TF2 loop's tf.function."""

  def run(
    train: data.Split, config: ml_collections.ConfigDict
  ) -> baselines.Run:
    net = model.create_model(**mnist.FACTS)

    def make(optimizer: tf.keras.optimizers.Optimizer) -> loop.Program:
      update = step.make_update(net, optimizer, config.batch_size)
      update = tf.function(update) if traced else update
      batches = iter(
        input_pipeline.train_batches(train, config.batch_size, config.seed)
      )
      return loop.Program(lambda _: update(*next(batches)), 1)

    return _looped(net, make, config)

  return run


@contextlib.contextmanager
def _autoclustering(on: bool) -> Iterator[None]:
  """TF's auto-clustering, process-wide, on only around one variant."""
  if on:
    tf.config.optimizer.set_jit('autoclustering')
  try:
    yield
  finally:
    tf.config.optimizer.set_jit(False)


def _dense_model() -> tf.keras.Model:
  """`model.create_model` with Keras's Dense: what the layout choice costs."""
  return tf.keras.Sequential(
    [
      tf.keras.Input((mnist.FLAT[0],)),
      tf.keras.layers.Dense(
        mnist.FACTS['num_classes'], kernel_initializer='zeros'
      ),
    ]
  )


def _trainer(
  jit: str, steps_per_loop: int | None, dense: bool = False
) -> Variant:
  """The trainer's program for `jit` and K (0: all steps in one call;
  None: the config's own K, as `xla-mnist-train` picks it) on the config's
  model; `dense`: with Keras's Dense layer, W stored [784, 10]."""

  def run(
    train: data.Split, config: ml_collections.ConfigDict
  ) -> baselines.Run:
    config = ml_collections.ConfigDict(config)
    config.jit = jit
    if steps_per_loop is None:
      config.steps_per_loop = config_lib.steps_per_loop(config)
    else:
      config.steps_per_loop = steps_per_loop or config.num_steps
    net = (
      _dense_model()
      if dense
      else model.create_model(config.model, config.seed, **mnist.FACTS)
    )
    strategy = tf.distribute.get_strategy()  # The default: one device.
    with _autoclustering(jit == 'auto'):
      done = _looped(
        net,
        lambda opt: program.make(net, opt, train, config, 0, strategy).program,
        config,
      )
    if dense:  # To the Linear layout of the eval model.
      done = dataclasses.replace(
        done, weights=[done.weights[0].T, *done.weights[1:]]
      )
    return done

  return run


VARIANTS: dict[str, Variant] = {
  'numpy': baselines.numpy_sgd,
  'TF1 session': functools.partial(baselines.tf1_session, xla=False),
  'TF1 session, XLA ON_1': functools.partial(baselines.tf1_session, xla=True),
  'Keras fit, XLA, 100 steps/execution': functools.partial(
    baselines.keras_fit, steps_per_execution=100
  ),
  'eager': _fed(traced=False),
  'tf.function': _fed(traced=True),
  'trainer --jit=off': _trainer('off', 1),
  'jit per step': _trainer('on', 1),
  'auto-clustering': _trainer('auto', 1),
  'fused K=10': _trainer('on', 10),
  FUSED: _trainer('on', 100),
  'fused K=100, Dense': _trainer('on', 100, dense=True),
  'fused K=all': _trainer('on', 0),
}


def _cluster_modules(folder: str) -> set[str]:
  """The auto-clustered XLA modules dumped into `folder` (see XLA_FLAGS)."""
  names = os.listdir(folder)
  return {m.group(0) for n in names if (m := re.match(r'module_\d+', n))}


def summarize(
  name: str,
  runs: list[baselines.Run],
  clusters: int,
  accuracy: Callable[[list[np.ndarray]], float],
) -> Measurement:
  """Medians over the rounds; `vs_fused` is left at 1.0."""
  last = runs[-1]
  train_seconds = statistics.median(r.train_seconds for r in runs)
  return Measurement(
    variant=name,
    steps_per_loop=last.steps_per_loop,
    compile_seconds=statistics.median(r.compile_seconds for r in runs),
    train_seconds=train_seconds,
    timed_steps=last.timed_steps,
    round_train_seconds=[r.train_seconds for r in runs],
    steps_per_second=last.timed_steps / train_seconds,
    vs_fused=1.0,
    final_loss=float(last.losses[-1]) if len(last.losses) else None,
    test_accuracy=accuracy(last.weights),
    cluster_compiles=clusters,
    head_losses=[float(x) for x in last.losses[:HEAD_STEPS]],
    threads=last.threads,
  )


def _test_accuracy(
  test: data.Split, name: str = 'softmax'
) -> Callable[[list[np.ndarray]], float]:
  """One evaluation function for every variant's weights of model `name`:
  a single trace."""
  net = model.create_model(name, **mnist.FACTS)
  evaluate = step.make_eval_step(net, 'off')

  def accuracy(weights: list[np.ndarray]) -> float:
    net.set_weights(weights)
    return float(evaluate(test.images, test.labels))

  return accuracy


def _with_ratios(
  measurements: list[Measurement], base_name: str = FUSED
) -> list[Measurement]:
  base = next(m for m in measurements if m.variant == base_name)
  return [
    dataclasses.replace(m, vs_fused=base.steps_per_second / m.steps_per_second)
    for m in measurements
  ]


def _warm_up_process(
  config: ml_collections.ConfigDict, train: data.Split
) -> None:
  """Pays TF's one-time start-up costs, which the first variant would pay.

  Among them the first execution of XLA:CPU's dots in a process, 30 to 40 ms
  (issue 13's first progress window), which no zero-step warm-up pays.
  """
  config = ml_collections.ConfigDict(config)
  config.num_steps = 2
  for jit in ('off', 'on'):
    _trainer(jit, 2)(train, config)


def run(
  config: ml_collections.ConfigDict,
  data_dir: str,
  repeats: int,
  jax_python: str,
  cluster_dump: str,
  log: Callable[[str], None] = print,
) -> tuple[list[Measurement], str, str]:
  """Every variant in alternating rounds, medians over rounds.

  Returns the measurements, JAX's version ('' when skipped) and why JAX was
  skipped ('' when it ran). `cluster_dump` is where XLA_FLAGS dumps the
  modules of the clusters XLA compiles.
  """
  tf.get_logger().setLevel('ERROR')  # Each round retraces on purpose.
  devices.configure_threads(config.cpu_threads)
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  jax_variants = baselines.JaxVariants(jax_python, dataset.train, config)
  runs: dict[str, list[baselines.Run]] = {}
  compiles: dict[str, int] = {}
  try:
    with tf.device(devices.select(config.device)):
      _warm_up_process(config, dataset.train)
      accuracy = _test_accuracy(dataset.test)
      for round_ in range(repeats):
        log(f'round {round_ + 1} of {repeats} ...')
        for name in list(VARIANTS)[:: 1 if round_ % 2 == 0 else -1]:
          before = _cluster_modules(cluster_dump)
          runs.setdefault(name, []).append(
            VARIANTS[name](dataset.train, config)
          )
          new = len(_cluster_modules(cluster_dump) - before)
          compiles[name] = compiles.get(name, 0) + new
        if not jax_variants.skipped:
          for name, run_ in jax_variants.run().items():
            runs.setdefault(name, []).append(run_)
      measurements = [
        summarize(name, r, compiles.get(name, 0), accuracy)
        for name, r in runs.items()
      ]
  finally:
    jax_variants.close()
  return _with_ratios(measurements), jax_variants.version, jax_variants.skipped


BY_MODEL_OFF = 'off'
BY_MODEL_FUSED = 'fused'


def _alternating(
  variants: dict[str, Variant],
  config: ml_collections.ConfigDict,
  data_dir: str,
  repeats: int,
  log: Callable[[str], None],
  label: str,
  warm_up: bool = True,
) -> list[Measurement]:
  """`variants` on the config's data and model in alternating rounds, with
  `warm_up` each first run for 2 steps; medians over rounds."""
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  runs: dict[str, list[baselines.Run]] = {}
  with tf.device(devices.select(config.device)):
    warm = ml_collections.ConfigDict(config)
    warm.num_steps = 2
    for variant in variants.values() if warm_up else ():
      variant(dataset.train, warm)
    accuracy = _test_accuracy(dataset.test, config.model)
    for round_ in range(repeats):
      log(f'{label}: round {round_ + 1} of {repeats} ...')
      for v in list(variants)[:: 1 if round_ % 2 == 0 else -1]:
        runs.setdefault(v, []).append(variants[v](dataset.train, config))
  return [summarize(v, r, 0, accuracy) for v, r in runs.items()]


def by_model(
  configs: dict[str, ml_collections.ConfigDict],
  data_dir: str,
  repeats: int,
  log: Callable[[str], None] = print,
) -> dict[str, list[Measurement]]:
  """Each packaged model's default program (`xla-mnist-train
  --config=<model>`: jit on, the config's K) against `off` (one step per
  call), alternating rounds in this process; `vs_fused` is the time per
  step over the fused program's, so `off`'s is the speed-up."""
  variants = {
    BY_MODEL_FUSED: _trainer('on', None),
    BY_MODEL_OFF: _trainer('off', 1),
  }
  return {
    name: _with_ratios(
      _alternating(variants, config, data_dir, repeats, log, name),
      BY_MODEL_FUSED,
    )
    for name, config in configs.items()
  }


# The loop's modes and `fit`'s matching settings: (jit, jit_compile, K),
# K None for the fused K `versus_fit` is given.
FIT_MODES = {
  'off': ('off', False, 1),
  'on': ('on', True, 1),
  'fused': ('on', True, None),
}
# Each mode's two variants are named LOOP + mode and FIT + mode.
LOOP, FIT = 'loop ', 'fit '


def versus_fit(
  configs: list[ml_collections.ConfigDict],
  data_dir: str,
  repeats: int,
  k: int = config_lib.DEFAULT_STEPS_PER_LOOP,
  log: Callable[[str], None] = print,
) -> dict:
  """Each config's run by the loop in each of FIT_MODES beside Keras's `fit`
  at the matching setting (the fused K and `steps_per_execution` both `k`,
  at most half the run): the same model and initial weights, optimizer,
  batches and steps, pairs side by side in alternating rounds; no warm-up
  runs: each variant's timed steps follow a first call or execution, which
  pays what a process pays once. The report's part: each run's
  measurements, as the results page reads them."""
  runs = []
  for config in configs:
    fused_k = min(k, max(1, config.num_steps // 2))
    variants: dict[str, Variant] = {}
    for mode, (jit, jit_compile, per_call) in FIT_MODES.items():
      variants[LOOP + mode] = _trainer(jit, per_call or fused_k)
      variants[FIT + mode] = functools.partial(
        baselines.keras_fit,
        steps_per_execution=per_call or fused_k,
        jit_compile=jit_compile,
      )
    label = f'{config.model}, {config.optimizer}'
    measured = _alternating(
      variants, config, data_dir, repeats, log, label, warm_up=False
    )
    runs.append(
      {
        'model': config.model,
        'optimizer': config.optimizer,
        'learning_rate': config.learning_rate,
        'steps': config.num_steps,
        'measurements': [dataclasses.asdict(m) for m in measured],
      }
    )
  return {'k': k, 'runs': runs}
