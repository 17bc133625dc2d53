"""Real steps of the real model, trained under the profiler."""

from __future__ import annotations

import tensorflow as tf
from support import mnist, steps

from xla_mnist import input_pipeline, loop, model

BATCH = 32


def make(jit: str):
  net = model.create_model(**mnist.FACTS)
  optimizer = tf.keras.optimizers.SGD(0.5)
  optimizer.build(net.trainable_variables)
  return net, steps.train_step(net, optimizer, jit, BATCH)


def train(train_step, profiler, split, calls) -> list[float]:
  """Runs the (first, last) step ranges, each as one profiled call.

  Returns the last loss of each call.
  """
  batches = iter(input_pipeline.train_batches(split, BATCH, seed=0))
  losses, clock = [], loop.Clock()
  for first, last in calls:
    with profiler.around(first, last, clock.paused) as wait:
      for _ in range(first, last + 1):
        loss = train_step(*next(batches))
      if wait:
        float(loss)  # Syncs inside the marker, as the loop does.
    losses.append(float(loss))
  return losses


def per_step(last: int) -> list[tuple[int, int]]:
  return [(i, i) for i in range(1, last + 1)]
