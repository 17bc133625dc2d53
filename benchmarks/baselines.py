"""What a user would otherwise run: numpy, TF1's session, Keras fit and JAX.

Every baseline trains the same recipe on the same batch order (the rows of
`batch_rows`) and returns a `Run`, as the benchmark's own variants do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
import time

import ml_collections
import numpy as np
import tensorflow as tf

from benchmarks import kernels, mnist, tf1_program, threads, timer
from xla_mnist import data, input_pipeline, model, step
from xla_mnist.runtime.errors import UserError

JAX_WORKER = os.path.join(os.path.dirname(__file__), 'jax_worker.py')


@dataclasses.dataclass(frozen=True)
class Run:
  compile_seconds: float
  train_seconds: float
  timed_steps: int
  losses: np.ndarray  # Per step; empty where the program reports none.
  weights: list[np.ndarray]  # In the Linear layout: kernel [10, 784], bias.
  threads: str  # The thread setting it ran at, as the results page says it.
  steps_per_loop: int = 1  # Steps each call of the compiled program runs.


def tf_threads() -> str:
  """TF's pools in this process, as `config.cpu_threads` sized them."""
  return threads.tf(tf.config.threading.get_intra_op_parallelism_threads())


def batch_rows(train: data.Split, config: ml_collections.ConfigDict):
  """The run's batch order as int32 [steps, batch], made before any timing."""
  rows = input_pipeline.batch_indices(
    train.size, config.batch_size, config.seed
  )
  return next(iter(rows.batch(config.num_steps))).numpy()


def flat_images(train: data.Split) -> np.ndarray:
  return train.images.numpy().reshape(train.size, -1)


def write_jax_data(
  path: str,
  train: data.Split,
  config: ml_collections.ConfigDict,
  test: data.Split | None = None,
) -> None:
  """What the JAX programs read: the train split flat, the run's batch order
  and learning rate; with `test` (for `jax_program.py`), the test split."""
  tested = {}
  if test is not None:
    tested = {
      'test_images': flat_images(test),
      'test_labels': test.labels.numpy().astype(np.int32),
    }
  np.savez(
    path,
    images=flat_images(train),
    labels=train.labels.numpy().astype(np.int32),
    indices=batch_rows(train, config),
    learning_rate=config.learning_rate,
    **tested,
  )


def numpy_sgd(train: data.Split, config: ml_collections.ConfigDict) -> Run:
  """The recipe in hand-written numpy, W stored [784, 10] as numpy likes it."""
  images, labels = flat_images(train), train.labels.numpy()
  rows = batch_rows(train, config)
  lr = np.float32(config.learning_rate)
  w = np.zeros((images.shape[1], mnist.FACTS['num_classes']), np.float32)
  b = np.zeros(mnist.FACTS['num_classes'], np.float32)
  losses = np.empty(len(rows), np.float32)
  start = time.perf_counter()
  for i, batch in enumerate(rows):
    x = images[batch].astype(np.float32) / np.float32(255.0)
    y = labels[batch]
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    probs = exp / exp.sum(axis=1, keepdims=True)
    every = np.arange(len(y))
    losses[i] = -np.log(probs[every, y]).mean()
    probs[every, y] -= 1.0  # d loss / d logits, times the batch size.
    probs /= len(y)
    w -= lr * (x.T @ probs)
    b -= lr * probs.sum(axis=0)
  seconds = time.perf_counter() - start
  return Run(0.0, seconds, len(rows), losses, [w.T.copy(), b], threads.blas())


def tf1_session(
  train: data.Split, config: ml_collections.ConfigDict, xla: bool
) -> Run:
  """TF1's program: placeholders, feed_dict, a session with XLA on or off.

  The images are scaled to float32 up front, as TF1's `input_data` held them.
  """
  images = flat_images(train).astype(np.float32) / np.float32(255.0)
  compile_s, train_s, losses, (w, b) = tf1_program.train(
    images,
    train.labels.numpy(),
    batch_rows(train, config),
    config.learning_rate,
    xla,
  )
  timed = config.num_steps - 1 if config.num_steps > 1 else 1
  return Run(compile_s, train_s, timed, losses, [w.T, b], threads.TF1)


def keras_fit(
  train: data.Split,
  config: ml_collections.ConfigDict,
  steps_per_execution: int,
  jit_compile: bool = True,
) -> Run:
  """Keras's own answer: compile(jit_compile, steps_per_execution=K), fit.

  The config's model from its seed and its optimizer as the trainer builds
  them, fed by tf.data (uint8 batches scaled in the pipeline). K is at most
  half the run: compile is the first execution, K steps included; train
  time ends with the last execution (fit then took up to a second more to
  return here, after its last callback: no step's work). Keras reports no
  per-step losses.
  """
  k = min(steps_per_execution, max(1, config.num_steps // 2))
  net = model.create_model(config.model, config.seed, **mnist.FACTS)
  batches = input_pipeline.train_batches(train, config.batch_size, config.seed)
  batches = batches.map(lambda x, y: (model.inputs(net, x), y))
  ends: list[float] = []
  done = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda *_, **__: ends.append(time.perf_counter())
  )
  start = time.perf_counter()
  net.compile(
    optimizer=step.make_optimizer(net, config),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    jit_compile=jit_compile,
    steps_per_execution=k,
  )
  net.fit(
    batches,
    steps_per_epoch=config.num_steps,
    shuffle=False,
    verbose=0,
    callbacks=[done],
  )
  return Run(
    ends[0] - start,
    ends[-1] - ends[0],
    config.num_steps - k,
    np.empty(0, np.float32),
    net.get_weights(),
    tf_threads(),
    k,
  )


class JaxVariants:
  """JAX's jit step and lax.scan, run in `python` (another venv, usually),
  at each of `threads.JAX_SETTINGS`.

  The data and batch order are written once to a scratch folder; each `run`
  starts the worker once per setting, which trains every JAX variant once.
  """

  def __init__(
    self, python: str, train: data.Split, config: ml_collections.ConfigDict
  ):
    self.python = python
    self.version = ''
    probe = subprocess.run(
      [python, '-c', 'import jax'], capture_output=True, text=True
    )
    self.skipped = (
      ''
      if probe.returncode == 0
      else f'{python} cannot import jax: run `make jax` and pass'
      ' --jax_python=.venv-jax/bin/python, or name a Python with JAX in'
      ' $XLA_MNIST_JAX_PYTHON (a venv apart: beside TF, JAX slows `import'
      ' tensorflow`)'
    )
    self._folder = tempfile.TemporaryDirectory(prefix='xla_mnist_jax_')
    if not self.skipped:
      write_jax_data(os.path.join(self._folder.name, 'data.npz'), train, config)

  def run(self) -> dict[str, Run]:
    """Every variant at every setting, by name: the setting's suffix added."""
    runs = {}
    for setting in threads.JAX_SETTINGS:
      for name, run in self._run(setting).items():
        runs[name + setting.suffix] = run
    return runs

  def _run(self, setting: threads.JaxSetting) -> dict[str, Run]:
    folder = self._folder.name
    env = {**timer.environment(), **threads.jax_variables(setting)}
    if setting is not threads.JAX_DEFAULTS:  # Profiled as users run it.
      env.pop(kernels.PROFILE_DIR_ENV, None)
    proc = subprocess.run(
      [self.python, JAX_WORKER, folder],
      capture_output=True,
      text=True,
      env=env,
    )
    if proc.returncode:
      said = proc.stderr.strip().splitlines() or ['no output']
      raise UserError(
        f'the JAX worker exited {proc.returncode} ({said[-1]}): run'
        f' {self.python} {JAX_WORKER} on a folder of data to see why'
      )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    self.version = report['jax']
    pool = report['xla_pool_threads']
    ran_at = setting.threads + (f', XLA pool of {pool}' * (pool is not None))
    runs = {}
    for v in report['variants']:
      with np.load(os.path.join(folder, f'{v["variant"]}.npz')) as f:
        weights = [f['arr_0'], f['arr_1']]
      losses = np.asarray(v['losses'], np.float32)
      runs[v['variant']] = Run(
        v['compile_seconds'],
        v['train_seconds'],
        v['timed_steps'],
        losses,
        weights,
        ran_at,
        v['steps_per_loop'],
      )
    return runs

  def close(self) -> None:
    self._folder.cleanup()
