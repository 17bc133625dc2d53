"""A TFDS builder over a local folder of the four MNIST-format IDX files.

TFDS's own `mnist` builder downloads from the internet and checks the
registered checksums; Debian's Fashion-MNIST `.gz` files are recompressed, so
their checksums differ. This manual-download builder reads whatever folder it
is given, validates every file up front (magic number, dimensions, counts,
label range), and only then lets TFDS write the prepared split files, so a bad
file is reported by name and never leaves a half-prepared dataset behind
(TFDS writes into a temporary folder that it renames on success).
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import tensorflow_datasets as tfds

from xla_mnist.errors import DataError

IMAGE_MAGIC = 2051  # IDX: unsigned byte, 3 dimensions.
LABEL_MAGIC = 2049  # IDX: unsigned byte, 1 dimension.
IMAGE_SIZE = 28
NUM_CLASSES = 10

# Split name -> (images file, labels file), the names shared by MNIST and
# Fashion-MNIST. Each may also be present without the `.gz` suffix.
FILES = {
  'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
  'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}


def check_folder(folder: str, names: list[str] | None = None) -> None:
  """DataError naming the IDX files (all four by default) `folder` lacks."""
  every = [name for pair in FILES.values() for name in pair]
  missing = [name for name in names or every if not _locate(folder, name)]
  if not missing:
    return
  what = (
    'holds none of the four IDX files'
    if len(missing) == len(every)
    else f'lacks {", ".join(missing)}'
  )
  raise DataError(
    f'{folder} {what}: put {", ".join(every)} there (gzipped or not), or'
    ' point config.idx_dir at the folder that holds them'
  )


def _locate(folder: str, name: str) -> str | None:
  """The path of `name` in `folder`, gzipped or not; None if neither."""
  for candidate in (name, name.removesuffix('.gz')):
    path = os.path.join(folder, candidate)
    if os.path.isfile(path):
      return path
  return None


def _read_bytes(path: str) -> bytes:
  try:
    if path.endswith('.gz'):
      with gzip.open(path, 'rb') as f:
        return f.read()
    with open(path, 'rb') as f:
      return f.read()
  except (OSError, EOFError) as e:  # gzip raises both on truncation.
    raise DataError(f'{path} cannot be read ({e}): replace the file') from None


def read_idx(path: str, magic: int, item_shape: tuple[int, ...]) -> np.ndarray:
  """Parses one IDX file of unsigned bytes, checking its header and size."""
  data = _read_bytes(path)
  ndim = 1 + len(item_shape)
  header = 4 + 4 * ndim
  if len(data) < header:
    raise DataError(f'{path} is truncated: {len(data)} bytes, no full header')
  (found,) = struct.unpack('>i', data[:4])
  if found != magic:
    raise DataError(
      f'{path} has magic number {found}, expected {magic}: not an IDX'
      f' {"image" if magic == IMAGE_MAGIC else "label"} file'
    )
  count, *dims = struct.unpack(f'>{ndim}i', data[4:header])
  if tuple(dims) != item_shape:
    raise DataError(
      f'{path} holds items of shape {tuple(dims)}, expected {item_shape}'
    )
  expected = header + count * int(np.prod(item_shape, dtype=np.int64))
  if len(data) != expected:
    raise DataError(
      f'{path} is truncated or padded: {len(data)} bytes, its header'
      f' announces {count} items ({expected} bytes)'
    )
  return np.frombuffer(data, np.uint8, offset=header).reshape(
    (count, *item_shape)
  )


def read_split(folder: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """Returns the validated (images [N,28,28,1] uint8, labels [N]) of a split."""
  images_name, labels_name = FILES[split]
  check_folder(folder, [images_name, labels_name])
  images_path = _locate(folder, images_name)
  labels_path = _locate(folder, labels_name)
  images = read_idx(images_path, IMAGE_MAGIC, (IMAGE_SIZE, IMAGE_SIZE))
  labels = read_idx(labels_path, LABEL_MAGIC, ())
  if len(images) != len(labels):
    raise DataError(
      f'{images_path} has {len(images)} images but {labels_path} has'
      f' {len(labels)} labels: the two files must come from one release'
    )
  if len(labels) and labels.max() >= NUM_CLASSES:
    raise DataError(
      f'{labels_path} has label {labels.max()}, outside 0..{NUM_CLASSES - 1}'
    )
  return images[..., np.newaxis], labels


class IdxMnist(tfds.core.GeneratorBasedBuilder):
  """MNIST or Fashion-MNIST from local IDX files (TFDS name `idx_mnist`)."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  BUILDER_CONFIGS = [
    tfds.core.BuilderConfig(name='mnist', description='LeCun et al. MNIST'),
    tfds.core.BuilderConfig(
      name='fashion_mnist', description='Zalando Fashion-MNIST'
    ),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    'Put the four IDX files (train-images-idx3-ubyte.gz,'
    ' train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz,'
    ' t10k-labels-idx1-ubyte.gz) in one folder and pass it as manual_dir.'
  )

  def _info(self) -> tfds.core.DatasetInfo:
    # Raw uint8 tensors rather than PNG-encoded `Image`s: loading the whole
    # split then needs no per-image decoding.
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          'image': tfds.features.Tensor(
            shape=(IMAGE_SIZE, IMAGE_SIZE, 1),
            dtype=np.uint8,
            encoding=tfds.features.Encoding.BYTES,
          ),
          'label': tfds.features.ClassLabel(num_classes=NUM_CLASSES),
        }
      ),
      supervised_keys=('image', 'label'),
      # Keep the files' order: the training loop shuffles with its own seed.
      disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    folder = os.fspath(dl_manager.manual_dir)
    # Read and validate every split before TFDS writes anything.
    splits = {split: read_split(folder, split) for split in FILES}
    return {
      split: self._generate_examples(images, labels)
      for split, (images, labels) in splits.items()
    }

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray):
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
      yield i, {'image': image, 'label': int(label)}
