"""The textbook TF2 step, fed its batches from outside: the tests' reference
for the trainer's own programs, which gather their batches inside; and a
split of random images in memory to train it on."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from xla_mnist import data, step


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


def synthetic_split() -> data.Split:
  """256 random images and labels in memory: a `data.Split` for the step."""
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (256, 28, 28, 1), dtype=np.uint8)
  return data.Split(tf.constant(images), tf.constant(rng.integers(0, 10, 256)))
