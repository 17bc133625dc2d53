"""The training program under a tf.distribute strategy: one step per call,
fed by tf.data in `data`'s batch order, loaded only for a run with a
strategy.

Each replica's forward and backward pass is compiled as the jit mode asks;
the update is not: the whole step fails to compile under a strategy
(tensorflow#45940, #58961; Keras turns XLA off there for that reason).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from xla_mnist import data, input_pipeline, loop, step
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError


def make_step(
  strategy: tf.distribute.Strategy,
  model: keras.Model,
  optimizer: keras.optimizers.Optimizer,
  jit: str,
  global_batch_size: int,
  probabilities: bool = False,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """Returns `step(uint8 images [B, ...], labels [B]) -> mean loss`.

  `model` and `optimizer` must have been created in `strategy.scope()`. The
  step takes the whole global batch, in the order `batch_indices` gives,
  and replica r of R takes rows [r * B/R, (r + 1) * B/R), so the weights
  match one device's up to float rounding.
  """
  replicas = strategy.num_replicas_in_sync
  if global_batch_size % replicas:
    raise UsageError(
      f'batch_size {global_batch_size} does not split evenly over {replicas}'
      f' replicas: set {errors.field("batch_size")} to a multiple of'
      f' {replicas}'
    )
  per_replica = global_batch_size // replicas
  grads = step.make_grads(
    model, global_batch_size, probabilities=probabilities, optimizer=optimizer
  )
  compiled = tf.function(grads, jit_compile=step.jit_compile(jit))

  def replica_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    loss, grads = compiled(images, labels)
    # Keras sums the gradients over the replicas here; summing them first
    # would count them twice. Weights without one stay (`step.make_update`).
    pairs = zip(grads, model.trainable_variables, strict=True)
    optimizer.apply_gradients([(g, v) for g, v in pairs if g is not None])
    return loss

  def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    def my_slice(ctx: tf.distribute.experimental.ValueContext):
      start = ctx.replica_id_in_sync_group * per_replica
      rows = slice(start, start + per_replica)
      return images[rows], labels[rows]

    shards = strategy.experimental_distribute_values_from_function(my_slice)
    losses = strategy.run(replica_step, args=shards)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

  return tf.function(train_step)


def make_program(
  strategy: tf.distribute.Strategy,
  net: keras.Model,
  optimizer: keras.optimizers.Optimizer,
  train: data.Split,
  jit: str,
  batch: int,
  seed: int,
  start_step: int,
  probabilities: bool,
) -> tuple[loop.Program, tf.types.experimental.PolymorphicFunction, tuple]:
  """The loop's program (one step a call), its function and its inputs'
  specs. The first batch is made before the loop's clock starts."""
  if train.streamed:
    raise UsageError(
      f'the training split is streamed ({errors.field("input", "stream")}, or'
      ' too large to hold), which runs on one device only so far: set'
      f' {errors.field("strategy", "default")}'
    )
  fn = make_step(strategy, net, optimizer, jit, batch, probabilities)
  specs = (
    tf.TensorSpec((batch, *train.images.shape[1:]), tf.uint8),
    tf.TensorSpec((batch,), tf.int64),
  )
  batches = loop.started(
    input_pipeline.train_batches(train, batch, seed, start_step)
  )
  return loop.Program(lambda _: fn(*next(batches)), 1), fn, specs
