"""Training and test data: TFDS splits held in memory, and the batch order.

Both splits are loaded once into device memory as uint8 (Fashion-MNIST,
55 MB), from what TFDS prepared once in the data dir (`datasets.prepared`).
The batch order is a function of (seed, step), whatever K, so a resumed run
rebuilds it: each epoch a seeded permutation cut into batches, the
remainder dropped so that XLA sees one shape.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import ml_collections
import numpy as np
import tensorflow as tf

from xla_mnist.datasets import prepared
from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import DataError, UsageError


@dataclasses.dataclass(frozen=True)
class Split:
  images: tf.Tensor  # uint8 [N, *image_shape]
  labels: tf.Tensor  # int64 [N]

  @property
  def size(self) -> int:
    return int(self.labels.shape[0])


@dataclasses.dataclass(frozen=True)
class Data:
  """Both splits and the facts a model is built for (docs/data.md)."""

  train: Split
  test: Split
  source: str  # Human-readable origin, printed in the run summary.
  prepared_now: bool  # False when an earlier run had prepared it.
  # sha256 naming the exact data: the IDX files' contents, TFDS's download
  # checksums, a folder's images; with the splits and size they were read at.
  source_digest: str
  class_names: tuple[str, ...]

  @property
  def image_shape(self) -> tuple[int, ...]:
    return tuple(self.train.images.shape[1:])


def of_config(config: ml_collections.ConfigDict, data_dir: str) -> Data:
  """The data `config` names (dataset, idx_dir or image_dir, splits, size)."""
  fields = ('image_dir', 'train_split', 'test_split', 'image_size')
  return load(config.dataset, config.idx_dir, data_dir, **{
    f: config[f] for f in fields
  })  # fmt: skip


def load(
  dataset: str,
  idx_dir: str,
  data_dir: str,
  image_dir: str = '',
  train_split: str = 'train',
  test_split: str = 'test',
  image_size: int = 0,
) -> Data:
  """Prepares the data once in `data_dir` and loads both splits: from IDX
  files (`idx_dir`, or Debian's folder for Fashion-MNIST), a folder of
  images (`image_dir`, `datasets/folder.py`), else TFDS's own builder of
  `dataset` (`datasets/registered.py`), which may need the network once.
  `image_size` > 0 resizes every image to that square."""
  folder = idx_dir or layout.DEBIAN_DIRS.get(dataset, '')
  for path, arg, what in ((idx_dir, 'idx_dir', 'four IDX files'), (
    image_dir, 'image_dir', 'split folders of class folders of images'
  )):  # fmt: skip
    if path and not os.path.isdir(path):
      problem = 'is not a folder' if os.path.exists(path) else 'does not exist'
      raise DataError(
        f'data folder {path} {problem}: point {errors.field(arg)} at the'
        f' folder holding the {what}'
      )
  with_idx = not image_dir and folder and os.path.isdir(folder)
  ready = prepared.from_idx(dataset, folder, data_dir) if with_idx else None
  if ready is None:  # To check or prepare, a folder or TFDS's own dataset.
    from xla_mnist.datasets import prepare  # noqa: PLC0415 - only then.

    with prepare.notices_off():
      if with_idx:
        ready = prepare.from_idx(dataset, folder, data_dir)
      else:
        splits = (train_split, test_split)
        ready = prepare.from_source(
          dataset, image_dir, data_dir, splits, image_size
        )
  return Data(
    train=Split(*map(tf.constant, ready.train)),
    test=Split(*map(tf.constant, ready.test)),
    source=ready.source,
    prepared_now=ready.prepared_now,
    source_digest=ready.source_digest,
    class_names=ready.class_names,
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
