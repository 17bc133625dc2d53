"""The compiled training program that the loop calls, for a config.

K = `steps_per_loop` steps per call: K = 1 calls the step once per batch,
K > 1 runs K steps inside one XLA program over the resident uint8 dataset;
a tf.distribute strategy's program (`replicated.py`) runs one step a call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import ml_collections
import numpy as np
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
  # A block of indices per call of K > 1; for K = 1, the rows of a block.
  per_block = k if k > 1 else config_lib.DEFAULT_STEPS_PER_LOOP
  blocks = loop.started(
    data.index_blocks(train.size, batch, config.seed, start_step, per_block)
  )
  data_specs = (
    tf.TensorSpec(train.images.shape, tf.uint8),
    tf.TensorSpec(train.labels.shape, tf.int64),
  )
  if k == 1:
    fn = step.make_indexed_step(
      net, optimizer, config.jit, batch, probabilities
    )
    specs = (*data_specs, tf.TensorSpec((batch,), tf.int32))
    call = fn.get_concrete_function(*specs)
    rows = (row for block in blocks for row in block)

    def run_step(_: int) -> tf.Tensor:  # The first step compiles: no warm-up.
      return call(train.images, train.labels, next(rows))

    return Compiled(loop.Program(run_step, 1), fn, specs)
  fn = step.make_train_loop(net, optimizer, config.jit, batch, probabilities)
  specs = (
    *data_specs,
    tf.TensorSpec((k, batch), tf.int32),
    tf.TensorSpec((), tf.int32),
  )
  # All of the training state, the model's random-number generators' too.
  state = [*net.variables, *optimizer.variables]
  run = _fused(fn.get_concrete_function(*specs), train, blocks, k, batch, state)
  return Compiled(run, fn, specs)


def _fused(
  call: Callable,
  train: data.Split,
  blocks: Iterator[np.ndarray],
  k: int,
  batch: int,
  state: list[tf.Variable],
) -> loop.Program:
  """K steps per call in one XLA loop, compiled by a warm-up that leaves
  the training `state` as it found it."""
  full = tf.constant(k)

  def run(count: int) -> tf.Tensor:
    steps = full if count == k else tf.constant(count)
    losses = call(train.images, train.labels, next(blocks), steps)
    return losses if count == k else losses[:count]

  def warm_up() -> None:
    """Compiles, then runs one step and undoes it: the first run in a
    process of XLA:CPU's dots is slow, once, and would land in the first
    timed call (docs/speed.md)."""
    saved = [v.numpy() for v in state]
    indices = tf.zeros((k, batch), tf.int32)
    call(train.images, train.labels, indices, tf.constant(1)).numpy()
    for variable, value in zip(state, saved, strict=True):
      variable.assign(value)

  return loop.Program(run, k, warm_up)
