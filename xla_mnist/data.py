"""Training and test data: TFDS splits held in memory, and the batch order.

Both splits are loaded once into device memory as uint8 (Fashion-MNIST,
55 MB), from what TFDS prepared once in the data dir (`datasets.prepared`).
The batch order is a function of (seed, step), whatever K, so a resumed run
rebuilds it: each epoch a seeded permutation cut into batches, the
remainder dropped so that XLA sees one shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import ml_collections
import numpy as np
import tensorflow as tf

from xla_mnist import config as config_lib
from xla_mnist.datasets import prepared, sources
from xla_mnist.runtime import errors, process
from xla_mnist.runtime.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Split:
  images: tf.Tensor | np.ndarray  # uint8 [N, *image]; streamed: memory-mapped
  labels: tf.Tensor | np.ndarray  # int64 [N]

  @property
  def size(self) -> int:
    return int(self.labels.shape[0])

  @property
  def streamed(self) -> bool:
    return not tf.is_tensor(self.images)


@dataclasses.dataclass(frozen=True)
class Data(prepared.Prepared):
  """Both splits as the run holds them, with what `prepared.Prepared` says
  of their source, and the facts a model is built for (docs/data.md)."""

  train: Split
  test: Split
  input_line: str = ''  # Which input path the run takes, and why.

  @property
  def image_shape(self) -> tuple[int, ...]:
    return tuple(self.train.images.shape[1:])

  @property
  def facts(self) -> dict:
    """What a model is built for: `model.create_model`'s keywords."""
    return {
      'image_shape': self.image_shape,
      'num_classes': len(self.class_names),
    }


def of_config(config: ml_collections.ConfigDict, data_dir: str) -> Data:
  """The data `config` names (dataset, idx_dir or image_dir, splits, size);
  UsageError where a step's batch of them would not fit the machine."""
  fields = ('image_dir', 'train_split', 'test_split', 'image_size', 'label')
  loaded = load(config.dataset, config.idx_dir, data_dir, config.input, **{
    f: config[f] for f in fields
  })  # fmt: skip
  pixels = math.prod(loaded.image_shape)
  process.check_memory(config, config_lib.DEFAULT_STEPS_PER_LOOP, pixels)
  return loaded


def load(
  dataset: str, idx_dir: str, data_dir: str, input: str = 'auto', **source
) -> Data:
  """Both splits, prepared once in `data_dir` (`sources.prepared_data`,
  which `source`'s image_dir, train_split, test_split and image_size go
  to): held in memory, or `input='stream'`ed from their arrays files on
  disk; 'auto' streams what does not fit the memory a run may use."""
  ready = sources.prepared_data(dataset, idx_dir, data_dir, **source)
  size = ready.train[0].nbytes + ready.test[0].nbytes
  room = process.MEMORY_SHARE * process.memory_bytes()
  held = input == 'resident' or input == 'auto' and (not room or size <= room)
  why = f'{size / 2**20:,.0f} MiB of images, {room / 2**30:.1f} GiB to hold'
  kept = lambda arrays: Split(*map(tf.constant, arrays))  # noqa: E731
  if not held:
    from xla_mnist import input_pipeline  # noqa: PLC0415

    kept = input_pipeline.split
  return Data(
    **vars(ready) | {'train': kept(ready.train), 'test': kept(ready.test)},
    input_line=f'input: {"resident" if held else "streamed"} ({why};'
    f' {errors.field("input", input)})',
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
