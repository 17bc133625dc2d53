"""One training process for tests/system/test_distribute.py, and its reference.

  python -m support.dist_worker STRATEGY NUM_CPU_DEVICES OUT.npy

(run with tests/ on PYTHONPATH, from the repository root)

trains `STEPS` steps of the same synthetic global batches under the strategy
(TF_CONFIG from the environment for multi_worker) and, on the chief, saves the
final weights to OUT.npy. `train_single` trains the same on one device.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf
from support import mnist, steps

from xla_mnist import data, input_pipeline, model, replicated
from xla_mnist.runtime import distribute

GLOBAL_BATCH = 64
# A small rate: at 0.5 float32 trajectories part chaotically within ~50
# steps, whatever the device count.
LEARNING_RATE = 0.1
STEPS = 60
SEED = 3


def synthetic_split() -> data.Split:
  """Sparse, learnable images: the class sets a band of bright pixels."""
  rng = np.random.default_rng(SEED)
  labels = rng.integers(0, 10, 640)
  images = rng.integers(0, 256, (640, 28, 28, 1)) * (
    rng.random((640, 28, 28, 1)) < 0.1
  )
  for i, label in enumerate(labels):
    images[i, 2 * label : 2 * label + 3] = 255
  return data.Split(tf.constant(images, tf.uint8), tf.constant(labels))


def batches():
  return input_pipeline.train_batches(
    synthetic_split(), GLOBAL_BATCH, SEED
  ).take(STEPS)


def weights(net: tf.keras.Model) -> np.ndarray:
  return np.concatenate([np.ravel(v.numpy()) for v in net.trainable_variables])


def train_single() -> np.ndarray:
  """The reference: the textbook step on one device, XLA on."""
  net = model.create_model(**mnist.FACTS)
  optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
  optimizer.build(net.trainable_variables)
  train_step = steps.train_step(net, optimizer, 'on', GLOBAL_BATCH)
  for images, labels in batches():
    train_step(images, labels)
  return weights(net)


def main(name: str, num_cpu_devices: str, out: str) -> None:
  strategy = distribute.make_strategy(name, int(num_cpu_devices))
  with strategy.scope():
    net = model.create_model(**mnist.FACTS)
    optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
    optimizer.build(net.trainable_variables)
  train_step = replicated.make_step(
    strategy, net, optimizer, 'on', GLOBAL_BATCH
  )
  for images, labels in batches():
    loss = train_step(images, labels)
  print(f'replicas {strategy.num_replicas_in_sync} loss {float(loss):.6f}')
  if strategy.extended.should_checkpoint:  # The chief.
    np.save(out, weights(net))


if __name__ == '__main__':
  main(*sys.argv[1:])
