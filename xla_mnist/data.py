"""Training and test data: TFDS splits held in memory, and the batch order.

(Fashion-)MNIST is 55 MB as uint8: both splits are loaded once into device
memory, from what TFDS prepared once in the data dir (`datasets.prepared`).
The batch order is a function of (seed, step), whatever K, so a resumed run
rebuilds it: each epoch a seeded permutation cut into batches, the
remainder dropped so that XLA sees one shape.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from xla_mnist.config import DATASETS
from xla_mnist.datasets import prepared
from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import DataError, UsageError


@dataclasses.dataclass(frozen=True)
class Split:
  images: tf.Tensor  # uint8 [N, 28, 28, 1]
  labels: tf.Tensor  # int64 [N]

  @property
  def size(self) -> int:
    return int(self.labels.shape[0])


@dataclasses.dataclass(frozen=True)
class Data:
  train: Split
  test: Split
  source: str  # Human-readable origin, printed in the run summary.
  prepared_now: bool  # False when an earlier run had prepared it.
  # sha256 naming the exact source: for IDX files, their contents; for TFDS's
  # registered datasets, the checksums TFDS verifies its download against.
  source_digest: str


def load(dataset: str, idx_dir: str, data_dir: str) -> Data:
  """Prepares `dataset` once in `data_dir` with TFDS and loads both splits:
  from IDX files (`idx_dir`, or Debian's folder for Fashion-MNIST), else by
  TFDS's own builder, which needs the network the first time."""
  if dataset not in DATASETS:
    raise UsageError(
      f'unknown dataset {dataset!r}: set {errors.field("dataset")} to one of'
      f' {", ".join(DATASETS)}'
    )
  folder = idx_dir or layout.DEBIAN_DIRS.get(dataset, '')
  if idx_dir and not os.path.isdir(idx_dir):
    problem = 'is not a folder' if os.path.exists(idx_dir) else 'does not exist'
    raise DataError(
      f'data folder {idx_dir} {problem}: point {errors.field("idx_dir")} at'
      ' the folder holding the four IDX files'
    )
  with_idx = folder and os.path.isdir(folder)
  ready = prepared.from_idx(dataset, folder, data_dir) if with_idx else None
  if ready is None:  # To check or prepare, or TFDS's own dataset.
    from xla_mnist.datasets import prepare  # noqa: PLC0415 - only then.

    with prepare.notices_off():
      if with_idx:
        ready = prepare.from_idx(dataset, folder, data_dir)
      else:
        ready = prepare.from_tfds(dataset, data_dir)
  return Data(
    train=Split(*map(tf.constant, ready.train)),
    test=Split(*map(tf.constant, ready.test)),
    source=ready.source,
    prepared_now=ready.prepared_now,
    source_digest=ready.source_digest,
  )


def epoch_permutation(seed: int, epoch: tf.Tensor, size: int) -> tf.Tensor:
  """The order of the training examples in `epoch`, from (seed, epoch) alone."""
  seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
  keys = tf.random.stateless_uniform(
    (size,), seeds, minval=None, maxval=None, dtype=tf.int64, alg='philox'
  )
  return tf.argsort(keys, stable=True)  # int32


def index_blocks(
  size: int, batch_size: int, seed: int, start_step: int, steps: int
) -> Iterator[np.ndarray]:
  """The batch order from `start_step` as endless int32 [steps, batch_size]
  blocks: step s reads batch s % E of epoch s // E, E = size // batch_size.
  Each epoch's order is made once and sliced: tf.data work per call showed
  in a fused loop's time (docs/speed.md)."""
  per_epoch = batches_per_epoch(size, batch_size)
  epoch, skip = divmod(start_step, per_epoch)
  rows = np.empty((0, batch_size), np.int32)
  while True:
    while len(rows) < steps:
      order = epoch_permutation(seed, epoch, size).numpy()
      order = order[: per_epoch * batch_size].reshape(per_epoch, batch_size)
      rows = np.concatenate([rows, order[skip:]])
      epoch, skip = epoch + 1, 0
    yield rows[:steps]
    rows = rows[steps:]


def batches_per_epoch(size: int, batch_size: int) -> int:
  if not 0 < batch_size <= size:
    raise UsageError(
      f'batch size {batch_size} does not fit a training split of {size}'
      f' examples: set {errors.field("batch_size")} between 1 and that size'
    )
  return size // batch_size
