"""The compiled training program that the loop calls, for a config.

K = `steps_per_loop` steps per call: K = 1 calls the step once per batch,
K > 1 runs K steps inside one XLA program over the resident uint8 dataset,
or over the K batches a streamed split's pipeline read (`input_pipeline`);
a tf.distribute strategy's program (`replicated.py`) runs one step a call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_collections
import tensorflow as tf

from xla_mnist import config as config_lib
from xla_mnist import data, loop, step


@dataclasses.dataclass(frozen=True)
class Compiled:
  """A loop program and the traced function behind it."""

  program: loop.Program
  fn: tf.types.experimental.PolymorphicFunction
  specs: tuple  # Its input signature, for the graph and the HLO dump.

  @property
  def graph(self) -> tf.Graph:
    """The step's graph, from the program's one trace."""
    return self.fn.get_concrete_function(*self.specs).graph


def make(
  net: tf.keras.Model,
  optimizer: tf.keras.optimizers.Optimizer,
  train: data.Split,
  config: ml_collections.ConfigDict,
  start_step: int,
  strategy: tf.distribute.Strategy,
  probabilities: bool = False,
) -> Compiled:
  """The program for the config's jit mode, K and strategy.

  The loop calls the traced concrete function, not the `tf.function`: that
  skips matching Python arguments to a trace, a sizeable part of a small
  step's dispatch time (docs/speed.md).
  """
  if config.strategy != 'default':
    from xla_mnist import replicated  # noqa: PLC0415 - a strategy's only.

    return Compiled(
      *replicated.make_program(
        strategy, net, optimizer, train, config.jit, config.batch_size,
        config.seed, start_step, probabilities,
      )
    )  # fmt: skip
  batch, k = config.batch_size, config_lib.steps_per_loop(config)
  batch_of = None
  if train.streamed:  # Read from disk by tf.data as the calls need it.
    from xla_mnist import input_pipeline  # noqa: PLC0415

    feed, specs, zeros = input_pipeline.streamed(
      train, batch, config.seed, start_step, k
    )
    batch_of = input_pipeline.picking
  else:
    feed, specs, zeros = _resident(train, batch, config.seed, start_step, k)
  fn = step.make_train_call(
    net, optimizer, config.jit, batch, probabilities, batch_of, fused=k > 1
  )
  if k == 1:  # The first step compiles: no warm-up.
    call = fn.get_concrete_function(*specs)
    return Compiled(loop.Program(lambda _: call(*feed()), 1), fn, specs)
  specs = (*specs, tf.TensorSpec((), tf.int32))
  # All of the training state, the model's random-number generators' too.
  state = [*net.variables, *optimizer.variables]
  run = _fused(fn.get_concrete_function(*specs), feed, zeros, k, state)
  return Compiled(run, fn, specs)


def _resident(
  train: data.Split, batch: int, seed: int, start_step: int, k: int
) -> tuple[Callable[[], tuple], tuple, tuple]:
  """`feed()`, a call's data arguments from the resident split (the split
  and the call's indices: a row for K = 1, a block of K for K > 1), their
  specs, and the arguments of a warm-up."""
  # A block of indices per call of K > 1; for K = 1, the rows of a block.
  per_block = k if k > 1 else config_lib.DEFAULT_STEPS_PER_LOOP
  blocks = loop.started(
    data.index_blocks(train.size, batch, seed, start_step, per_block)
  )
  rows = blocks if k > 1 else (row for block in blocks for row in block)
  shape = (k, batch) if k > 1 else (batch,)
  specs = (
    tf.TensorSpec(train.images.shape, tf.uint8),
    tf.TensorSpec(train.labels.shape, tf.int64),
    tf.TensorSpec(shape, tf.int32),
  )
  zeros = (train.images, train.labels, tf.zeros(shape, tf.int32))
  return lambda: (train.images, train.labels, next(rows)), specs, zeros


def _fused(
  call: Callable,
  feed: Callable[[], tuple],
  zeros: tuple,
  k: int,
  state: list[tf.Variable],
) -> loop.Program:
  """K steps per call in one XLA loop, compiled by a warm-up that leaves
  the training `state` as it found it."""
  full = tf.constant(k)

  def run(count: int) -> tf.Tensor:
    steps = full if count == k else tf.constant(count)
    losses = call(*feed(), steps)
    return losses if count == k else losses[:count]

  def warm_up() -> None:
    """Compiles, then runs one step and undoes it: the first run in a
    process of XLA:CPU's dots is slow, once, and would land in the first
    timed call (docs/speed.md)."""
    saved = [v.numpy() for v in state]
    call(*zeros, tf.constant(1)).numpy()
    for variable, value in zip(state, saved, strict=True):
      variable.assign(value)

  return loop.Program(run, k, warm_up)
