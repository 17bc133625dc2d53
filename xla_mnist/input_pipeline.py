"""The tf.data input pipelines, in `data`'s batch order: a strategy's
batches from the resident splits, and the streamed input, which reads a
training split from its arrays file on disk as the steps need it.

Streamed, each call's block of K batches is read by tf.data in parallel
(`numpy_function` over the memory-mapped file: the pages of those rows
only) and prefetched while the step runs. The step takes the batches
themselves instead of gathering them from resident data: the same update
on the same images, so the same weights after the same steps, and a
resumed run reads what an uninterrupted one did.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from xla_mnist import data, loop
from xla_mnist.runtime import errors, process
from xla_mnist.runtime.errors import UsageError

PREFETCH = 2  # Calls' blocks read ahead: the next while this one trains.


def batch_indices(
  size: int, batch_size: int, seed: int, start_step: int = 0
) -> tf.data.Dataset:
  """The endless stream of int32 [batch_size] index vectors from `start_step`.

  Step s reads batch s % E of epoch s // E, E = size // batch_size.
  """
  per_epoch = data.batches_per_epoch(size, batch_size)

  def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
    order = data.epoch_permutation(seed, epoch, size)[: per_epoch * batch_size]
    return tf.data.Dataset.from_tensor_slices(
      tf.reshape(order, (per_epoch, batch_size))
    )

  first_epoch = start_step // per_epoch
  epochs = tf.data.Dataset.range(first_epoch, 2**62)
  return epochs.flat_map(epoch_batches).skip(start_step % per_epoch)


def train_batches(
  split: data.Split, batch_size: int, seed: int, start_step: int = 0
) -> tf.data.Dataset:
  """(uint8 images, int64 labels) batches in the order of `batch_indices`."""

  def gather(indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.gather(split.images, indices), tf.gather(split.labels, indices)

  indices = batch_indices(split.size, batch_size, seed, start_step)
  return indices.map(gather).prefetch(tf.data.AUTOTUNE)


def streamed(
  split: data.Split, batch_size: int, seed: int, start_step: int, k: int
) -> tuple[Callable[[], tuple], tuple, tuple]:
  """For a call of K steps on a streamed split: `feed()`, the call's data
  arguments (images [K, batch, ...], labels [K, batch], the rows to step
  through: 0 for K = 1, else range(K)); their specs; and zeros of the same
  for a warm-up."""
  images, labels = split.images, np.asarray(split.labels)
  shape = (k, batch_size, *images.shape[1:])
  need = (PREFETCH + 2) * math.prod(shape)  # Read ahead, in the step, copied.
  if (
    memory := process.memory_bytes()
  ) and need > process.MEMORY_SHARE * memory:
    raise UsageError(
      f'streamed calls of {k} batches of {batch_size} need {need / 2**30:.1f}'
      f' GiB read ahead, more than half of the {memory / 2**30:.1f} GiB this'
      f' process may use: lower {errors.field("steps_per_loop")} or'
      f' {errors.field("batch_size")}'
    )

  def read(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return images[rows.reshape(-1)].reshape(shape), labels[rows]

  def block(rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    pixels, classes = tf.numpy_function(read, [rows], (tf.uint8, tf.int64))
    return tf.ensure_shape(pixels, shape), tf.ensure_shape(classes, shape[:2])

  indices = batch_indices(split.size, batch_size, seed, start_step).batch(k)
  blocks = indices.map(block, num_parallel_calls=tf.data.AUTOTUNE)
  calls = loop.started(blocks.prefetch(PREFETCH))  # Set-up: before the clock.
  rows = tf.constant(0) if k == 1 else tf.range(k)
  specs = (
    tf.TensorSpec(shape, tf.uint8),
    tf.TensorSpec(shape[:2], tf.int64),
    tf.TensorSpec.from_tensor(rows),
  )
  zeros = (tf.zeros(shape, tf.uint8), tf.zeros(shape[:2], tf.int64), rows)
  return lambda: (*next(calls), rows), specs, zeros


def picking(
  update: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]:
  """`update(images, labels)` made `update(batches, labels, row)`: the step
  of a streamed call, on its `row`-th batch (`step.make_train_call`)."""

  def update_row(images: tf.Tensor, labels: tf.Tensor, row: tf.Tensor):
    return update(images[row], labels[row])

  return update_row


def split(arrays: tuple[np.ndarray, np.ndarray]) -> data.Split:
  """A split read from its (memory-mapped) file as the steps need it."""
  return data.Split(arrays[0], np.asarray(arrays[1]))
