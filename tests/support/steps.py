"""The textbook TF2 step, fed its batches from outside: the tests' reference
for the trainer's own programs, which gather their batches inside; and a
split of random images in memory to train it on."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from xla_mnist import data, model, program, step


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


def run_program(
  split: data.Split, config, facts: dict
) -> tuple[np.ndarray, list[np.ndarray]]:
  """`program.make`'s program for `config` on a fresh model, warmed up as
  the loop warms it, run for `config.num_steps` in calls of its K: the
  losses and the final weights."""
  net = model.create_model(**facts)
  optimizer = tf.keras.optimizers.SGD(config.learning_rate)
  optimizer.build(net.trainable_variables)
  compiled = program.make(
    net, optimizer, split, config, 0, tf.distribute.get_strategy()
  )
  if compiled.program.warm_up:
    compiled.program.warm_up()
  losses, done, k = [], 0, compiled.program.steps_per_loop
  while done < config.num_steps:
    count = min(k, config.num_steps - done)
    losses.append(np.reshape(compiled.program.run(count), -1))
    done += count
  return np.concatenate(losses), net.get_weights()
