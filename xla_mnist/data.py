"""Training and test data: TFDS splits held in memory, and the batch order.

The whole of (Fashion-)MNIST is 55 MB as uint8, so both splits are loaded
once into device memory. The batch order is a pure function of (seed, step):
each epoch is a seeded permutation of the training set cut into fixed-size
batches (the remainder dropped, so XLA sees one shape). The per-step loop and
the fused loop read the same order, and a resumed run can rebuild it from the
step alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from zipfile import BadZipFile

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from xla_mnist import files, idx_builder
from xla_mnist.config import DATASETS
from xla_mnist.errors import DataError, UsageError

# Where Debian's packages put the IDX files; used when `idx_dir` is empty.
DEBIAN_DIRS = {'fashion_mnist': '/usr/share/datasets/fashion-mnist'}
PREPARE_LOCK = '.prepare.lock'  # In the data dir, while a run prepares.
# A prepared split's arrays, in the builder's folder: `<prefix><split>.npz`.
ARRAYS_PREFIX = 'xla_mnist-'


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


def load(dataset: str, idx_dir: str, data_dir: str) -> Data:
  """Prepares `dataset` once in `data_dir` with TFDS and loads both splits.

  Local IDX files (`idx_dir`, or Debian's folder for Fashion-MNIST) go through
  the `idx_mnist` builder; otherwise TFDS's own builder is used, which needs
  the network the first time.
  """
  if dataset not in DATASETS:
    raise UsageError(
      f'unknown dataset {dataset!r}: set config.dataset to one of'
      f' {", ".join(DATASETS)}'
    )
  folder = idx_dir or DEBIAN_DIRS.get(dataset, '')
  if idx_dir and not os.path.isdir(idx_dir):
    problem = 'is not a folder' if os.path.exists(idx_dir) else 'does not exist'
    raise DataError(
      f'data folder {idx_dir} {problem}: point config.idx_dir at the'
      ' folder holding the four IDX files'
    )
  if folder and os.path.isdir(folder):
    return _load_idx(dataset, folder, data_dir)
  return _load_registered(dataset, data_dir)


def _load_idx(dataset: str, folder: str, data_dir: str) -> Data:
  builder, prepared_now = _prepared(
    lambda: idx_builder.IdxMnist(config=dataset, data_dir=data_dir),
    data_dir,
    # Before TFDS looks: its own check of an empty folder is a traceback.
    check=lambda _: idx_builder.check_folder(folder),
    download_config=tfds.download.DownloadConfig(manual_dir=folder),
  )
  return Data(
    train=_split(builder, 'train', _parse_records),
    test=_split(builder, 'test', _parse_records),
    source=f'{dataset} IDX files from {folder}, via TFDS in {data_dir}',
    prepared_now=prepared_now,
  )


def _prepared(
  make_builder: Callable[[], tfds.core.DatasetBuilder],
  data_dir: str,
  check: Callable[[tfds.core.DatasetBuilder], None] = lambda _: None,
  **prepare_args,
) -> tuple[tfds.core.DatasetBuilder, bool]:
  """A builder whose dataset is prepared, and whether this call prepared it.

  Runs that start together on one data dir (a sweep, workers on one host)
  prepare it one at a time: the first prepares, the others wait on a lock,
  then find it prepared. TFDS alone would have them collide in its rename.
  TFDS's progress bars and notices are kept off the terminal.
  """
  if os.path.exists(data_dir) and not os.path.isdir(data_dir):
    files.ensure_writable_dir(data_dir, 'data dir', 'data_dir')  # Raises.
  builder = make_builder()
  # Prepared: no lock. Runs only read it, and add arrays files atomically.
  if builder.is_prepared():
    return builder, False
  files.ensure_writable_dir(data_dir, 'data dir', 'data_dir')
  with files.waiting_lock(os.path.join(data_dir, PREPARE_LOCK)):
    builder = make_builder()  # Another run may have prepared it meanwhile.
    if builder.is_prepared():
      return builder, False
    check(builder)
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
      builder.download_and_prepare(**prepare_args)
  return builder, True


def _split(
  builder: tfds.core.DatasetBuilder,
  split: str,
  read: Callable[
    [tfds.core.DatasetBuilder, str], tuple[np.ndarray, np.ndarray]
  ],
) -> Split:
  """A prepared split, from its arrays file beside TFDS's records if any.

  Reading the records costs about half a second a run; the arrays, written
  once by the first run that reads them, a few hundredths. The file lives in
  the builder's own folder, so a dataset prepared anew drops it with the
  records; one that cannot be written (a read-only data dir) is skipped.
  """
  path = os.path.join(builder.data_dir, f'{ARRAYS_PREFIX}{split}.npz')
  count = builder.info.splits[split].num_examples
  shape = (count, *builder.info.features['image'].shape)
  arrays = _cached_arrays(path, shape)
  if arrays is None:
    images, labels = read(builder, split)
    with contextlib.suppress(OSError):
      files.write_atomically(
        path, lambda f: np.savez(f, images=images, labels=labels)
      )
    arrays = images, labels
  return Split(*map(tf.constant, arrays))


def _cached_arrays(
  path: str, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray] | None:
  """uint8 images of `shape` and their int64 labels, if `path` holds them."""
  try:
    with np.load(path) as f:
      images, labels = f['images'], f['labels']
  # An empty, cut or foreign file: each fails in its own way.
  except (OSError, EOFError, KeyError, TypeError, ValueError, BadZipFile):
    return None
  whole = images.shape == shape and labels.shape == shape[:1]
  typed = images.dtype == np.uint8 and labels.dtype == np.int64
  return (images, labels) if whole and typed else None


def _parse_records(
  builder: tfds.core.DatasetBuilder, split: str
) -> tuple[np.ndarray, np.ndarray]:
  """Reads a split of `idx_mnist` in one vectorised parse.

  `builder.as_dataset` parses example by example, about ten times slower for
  70k small records; the format read here is the one `idx_builder` writes.
  """
  paths = [os.fspath(p) for p in builder.info.splits[split].filepaths]
  records = tf.data.TFRecordDataset(paths)
  serialized = records.batch(builder.info.splits[split].num_examples)
  parsed = tf.io.parse_example(
    serialized.get_single_element(),
    {
      'image': tf.io.FixedLenFeature([], tf.string),
      'label': tf.io.FixedLenFeature([], tf.int64),
    },
  )
  images = tf.io.decode_raw(parsed['image'], tf.uint8)
  shape = builder.info.features['image'].shape
  return tf.reshape(images, (-1, *shape)).numpy(), parsed['label'].numpy()


def _as_dataset(
  builder: tfds.core.DatasetBuilder, split: str
) -> tuple[np.ndarray, np.ndarray]:
  """TFDS's own read of a split, for its registered builders."""
  dataset = builder.as_dataset(split, batch_size=-1, as_supervised=True)
  return tuple(tfds.as_numpy(dataset))


def _load_registered(dataset: str, data_dir: str) -> Data:
  builder, prepared_now = _prepared(
    lambda: tfds.builder(dataset, data_dir=data_dir),
    data_dir,
    check=lambda builder: _check_download_reachable(builder, dataset),
  )
  return Data(
    train=_split(builder, 'train', _as_dataset),
    test=_split(builder, 'test', _as_dataset),
    source=f'{dataset} from TFDS in {data_dir}',
    prepared_now=prepared_now,
  )


def _check_download_reachable(builder: tfds.core.DatasetBuilder, name: str):
  """Fails in seconds, not after minutes of TFDS retries, when offline."""
  url = urllib.parse.urlparse(builder.URL)  # TFDS's MNIST builders set URL.
  port = url.port or (443 if url.scheme == 'https' else 80)
  try:
    socket.create_connection((url.hostname, port), timeout=5).close()
  except OSError as e:
    hint = {
      'fashion_mnist': 'apt-get install dataset-fashion-mnist (Debian), or ',
      'mnist': '',
    }[name]
    raise DataError(
      f'{name} is not prepared in the data dir and cannot be downloaded'
      f' ({url.hostname}: {e.strerror or e}): {hint}put its four IDX .gz'
      ' files in a folder and pass config.idx_dir=DIR, or train offline on'
      ' Fashion-MNIST with the fashion_mnist config'
    ) from None


def epoch_permutation(seed: int, epoch: tf.Tensor, size: int) -> tf.Tensor:
  """The order of the training examples in `epoch`, from (seed, epoch) alone."""
  keys = tf.random.stateless_uniform(
    (size,),
    seed=tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)]),
    minval=None,
    maxval=None,
    dtype=tf.int64,
    alg='philox',
  )
  return tf.argsort(keys, stable=True)  # int32


def batch_indices(
  size: int, batch_size: int, seed: int, start_step: int = 0
) -> tf.data.Dataset:
  """The endless stream of int32 [batch_size] index vectors from `start_step`.

  Step s reads batch s % E of epoch s // E, E = size // batch_size.
  """
  per_epoch = _batches_per_epoch(size, batch_size)

  def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
    order = epoch_permutation(seed, epoch, size)[: per_epoch * batch_size]
    return tf.data.Dataset.from_tensor_slices(
      tf.reshape(order, (per_epoch, batch_size))
    )

  first_epoch = start_step // per_epoch
  epochs = tf.data.Dataset.range(first_epoch, 2**62)
  return epochs.flat_map(epoch_batches).skip(start_step % per_epoch)


def index_blocks(
  size: int, batch_size: int, seed: int, start_step: int, steps: int
) -> Iterator[np.ndarray]:
  """`batch_indices`' order as endless int32 [steps, batch_size] blocks.

  Each epoch's order is made once and sliced: no tf.data work per call of
  the training program, which showed in a fused loop's time.
  """
  per_epoch = _batches_per_epoch(size, batch_size)
  return _blocks(size, batch_size, seed, start_step, steps, per_epoch)


def _blocks(
  size: int,
  batch_size: int,
  seed: int,
  start_step: int,
  steps: int,
  per_epoch: int,
) -> Iterator[np.ndarray]:
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


def _batches_per_epoch(size: int, batch_size: int) -> int:
  if not 0 < batch_size <= size:
    raise UsageError(
      f'batch size {batch_size} does not fit a training split of {size}'
      ' examples: set config.batch_size between 1 and that size'
    )
  return size // batch_size


def train_batches(
  split: Split, batch_size: int, seed: int, start_step: int = 0
) -> tf.data.Dataset:
  """(uint8 images, int64 labels) batches in the order of `batch_indices`."""

  def gather(indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.gather(split.images, indices), tf.gather(split.labels, indices)

  indices = batch_indices(split.size, batch_size, seed, start_step)
  return indices.map(gather).prefetch(tf.data.AUTOTUNE)
