"""The textbook TF2 step, fed its batches from outside: the tests' reference
for the trainer's own programs, which gather their batches inside."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from xla_mnist import step


def train_step(
  model: tf.keras.Model,
  optimizer: tf.keras.optimizers.Optimizer,
  jit: str,
  global_batch_size: int,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """`step(uint8 images, labels) -> loss`: one SGD step, compiled as `jit`
  asks."""
  update = step.make_update(model, optimizer, global_batch_size)
  return tf.function(update, jit_compile=step.jit_compile(jit))
