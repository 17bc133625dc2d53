"""IDX files: small valid folders, damaged or oversized files, and Debian's
real Fashion-MNIST."""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import numpy as np
import pytest

from xla_mnist.datasets import idx_builder
from xla_mnist.runtime import layout

FASHION_DIR = layout.DEBIAN_FASHION_MNIST
IDX_NAMES = layout.IDX_FILES


def write_idx(path: str, magic: int, array: np.ndarray) -> None:
  """Writes `array` (uint8) as an IDX file, gzipped when `path` ends in .gz."""
  header = struct.pack(f'>i{array.ndim}i', magic, *array.shape)
  payload = header + array.astype(np.uint8).tobytes()
  opener = gzip.open if path.endswith('.gz') else open
  with opener(path, 'wb') as f:
    f.write(payload)


def make_idx_folder(
  folder: str, train: int = 300, test: int = 100, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Writes four small, valid IDX files; returns the arrays written."""
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  arrays = {}
  for split, n in (('train', train), ('test', test)):
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    images_name, labels_name = IDX_NAMES[split]
    write_idx(os.path.join(folder, images_name), 2051, images)
    write_idx(os.path.join(folder, labels_name), 2049, labels)
    arrays[split] = (images, labels)
  return arrays


def require_fashion_mnist() -> None:
  """Skips without Debian's files, except under CI where that is a failure."""
  if os.path.isfile(os.path.join(FASHION_DIR, IDX_NAMES['train'][0])):
    return
  message = (
    f'Fashion-MNIST is not in {FASHION_DIR}: make test installs it'
    ' (apt-get install dataset-fashion-mnist, as root)'
  )
  if os.environ.get('CI'):
    pytest.fail(message)
  pytest.skip(message)


# IDX files are checked against their header and the machine's memory
# before they are read: training, the export and classify alike.


def idx_header(magic: int, count: int) -> bytes:
  dims = (count, 28, 28) if magic == 2051 else (count,)
  return struct.pack(f'>i{len(dims)}i', magic, *dims)


def sparse(path: str, head: bytes, size: int) -> str:
  """A file of `size` bytes that holds only `head`: no disk, no time."""
  with open(path, 'wb') as f:
    f.write(head)
    f.truncate(size)
  return path


def bomb(path: str, head: bytes, zeros: int) -> str:
  """A small gzip file of `head` then `zeros` zero bytes unzipped."""
  unzip = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
  chunk = bytes(1 << 20)
  with open(path, 'wb') as f:
    f.write(unzip.compress(head))
    for _ in range(zeros >> 20):
      f.write(unzip.compress(chunk))
    f.write(unzip.flush())
  return path


def more_than_memory() -> int:
  """An image count whose bytes the machine's memory cannot hold."""
  # Twice the memory free now: free memory changes while a test runs.
  return min(2 * idx_builder.available_memory() // 784, 2**31 - 1)
