"""A TFDS builder over a local folder of the four MNIST-format IDX files.

TFDS's own `mnist` builder downloads from the internet and checks the
registered checksums; Debian's Fashion-MNIST `.gz` files are recompressed, so
their checksums differ. This manual-download builder reads whatever folder it
is given, validates every file up front (magic number, dimensions, counts,
label range), and only then lets TFDS write the prepared split files, so a bad
file is reported by name and never leaves a half-prepared dataset behind
(TFDS writes into a temporary folder that it renames on success).

It prepares from a `prepared.Source`, checking that the bytes it parses are
the ones hashed, and writes the manifest (the source's files, and a digest
of each split's arrays) into the folder TFDS renames into place, so a
prepared dataset always has its manifest. Only preparing, hashing a source
file not stamped, a source folder's fault, and reading IDX files elsewhere
(the AOT export's check) load this module.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct
import zlib

import numpy as np
import tensorflow_datasets as tfds

from xla_mnist.datasets import prepare, prepared
from xla_mnist.datasets.prepared import FILES, Source, locate
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import DataError
from xla_mnist.runtime.layout import IMAGE_MAGIC, LABEL_MAGIC

IMAGE_SIZE = 28
NUM_CLASSES = 10


def check_folder(
  folder: str, names: list[str] | None = None, other: str = ''
) -> None:
  """DataError naming the IDX files (all four by default) `folder` lacks,
  and the caller's fix: put the files it reads there, or `other` (by
  default, training's: point config.idx_dir at the folder that holds them).
  """
  if not os.path.isdir(folder):
    problem = 'is not a folder' if os.path.exists(folder) else 'does not exist'
    raise DataError(
      f'data folder {folder} {problem}: point {errors.field("idx_dir")} at'
      ' the folder holding the four IDX files'
    )
  every = [name for pair in FILES.values() for name in pair]
  needed = names or every
  missing = [name for name in needed if not locate(folder, name)]
  if not missing:
    return
  what = (
    f'holds none of the {"four " * (needed == every)}IDX files'
    if len(missing) == len(needed)
    else f'lacks {", ".join(missing)}'
  )
  other = other or (
    f'point {errors.field("idx_dir")} at the folder that holds them'
  )
  raise DataError(
    f'{folder} {what}: put {", ".join(needed)} there (gzipped or not), or'
    f' {other}'
  )


def available_memory() -> int:
  """Bytes this machine can give a process now without swapping: Linux's
  MemAvailable, else the free pages."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) << 10
  except (OSError, ValueError, IndexError):
    pass
  return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


def check_size(path: str, magic: int, item_shape: tuple[int, ...]) -> int:
  """DataError unless the IDX file `path` can be read whole: its header
  (read alone), the file's size against what the header announces, and
  what reading it needs against the machine's memory. Returns the bytes
  the header announces, unzipped."""
  gzipped = path.endswith('.gz')
  header = 4 + 4 * (1 + len(item_shape))
  try:
    with (gzip.open if gzipped else open)(path, 'rb') as f:
      head = f.read(header)
    size = os.stat(path).st_size
  except gzip.BadGzipFile as e:
    raise _not_gzipped(path, magic) or DataError(
      f'{path} cannot be read ({e}): replace the file'
    ) from None
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f'{path} cannot be read ({e}): replace the file') from None
  count, expected = _header(path, head, magic, item_shape)
  announces = f'its header announces {count} items ({expected} bytes)'
  # Deflate's worst case: stored blocks, 5 bytes per 64 KiB, and gzip's
  # header (a name or comment may lengthen it) and trailer.
  if size != expected and not gzipped or size > expected * 1.001 + 4096:
    raise DataError(
      f'{path} is truncated or padded: {size} bytes'
      f'{" gzipped" * gzipped}, {announces}: replace the file'
    )
  needed = expected + size * gzipped  # The file's bytes, and unzipped.
  available = available_memory()
  if needed > available:
    raise DataError(
      f'{path}: {announces}, reading it needs {needed >> 20} MiB and this'
      f' machine has {available >> 20} MiB available: use a smaller IDX file'
      ' or free memory'
    )
  return expected


def _not_gzipped(path: str, magic: int) -> DataError | None:
  """The error of a file named .gz that is the IDX file itself, unzipped
  (its fix a rename); None if it is not that either."""
  try:
    with open(path, 'rb') as f:
      head = f.read(4)
  except OSError:
    return None
  if head != struct.pack('>i', magic):
    return None
  return DataError(
    f'{path} is not gzipped, though its name ends in .gz: rename it'
    f' {os.path.basename(path).removesuffix(".gz")}, or gzip it'
  )


def _header(
  path: str, head: bytes, magic: int, item_shape: tuple[int, ...]
) -> tuple[int, int]:
  """The item count and the bytes an IDX file of header `head` announces;
  DataError naming what the file is instead, and the fix."""
  ndim = 1 + len(item_shape)
  header = 4 + 4 * ndim
  kind = 'image' if magic == IMAGE_MAGIC else 'label'
  if head[:2] == b'\x1f\x8b' and not path.endswith('.gz'):  # gzip's magic.
    raise DataError(
      f'{path} is gzipped, though its name does not end in .gz: rename it'
      f' {os.path.basename(path)}.gz, or gunzip it'
    )
  if len(head) < header:
    raise DataError(
      f'{path} is truncated: {len(head)} bytes, no full header: replace the'
      ' file'
    )
  (found,) = struct.unpack('>i', head[:4])
  if found != magic:
    raise DataError(
      f'{path} has magic number {found}, expected {magic}: not a'
      f' {ndim}-dimensional IDX {kind} file of unsigned bytes; put the'
      f" release's {kind} file there"
    )
  count, *dims = struct.unpack(f'>{ndim}i', head[4:header])
  if tuple(dims) != item_shape:
    size = 'x'.join(map(str, item_shape))
    raise DataError(
      f'{path} holds items of shape {tuple(dims)}, expected {item_shape}:'
      f' the models here take {size} images, as MNIST has them; resize the'
      f' images to {size} and write the file anew'
    )
  if count < 0:
    raise DataError(
      f'{path} announces {count} items: not an IDX file; replace the file'
    )
  return count, header + count * int(np.prod(item_shape, dtype=np.int64))


def hash_file(path: str) -> str:
  """The sha256 of the IDX file `path`'s bytes, read in chunks once its
  header and size are checked: a file far bigger than its header announces
  is refused unread. Its format is the one its name says (`FILES`)."""
  name = os.path.basename(path).removesuffix('.gz')
  if name in (images.removesuffix('.gz') for images, _ in FILES.values()):
    check_size(path, IMAGE_MAGIC, (IMAGE_SIZE, IMAGE_SIZE))
  else:
    check_size(path, LABEL_MAGIC, ())
  sha = hashlib.sha256()
  try:
    with open(path, 'rb') as f:
      while chunk := f.read(1 << 20):
        sha.update(chunk)
  except OSError as e:
    raise DataError(f'{path} cannot be read ({e}): replace the file') from None
  return sha.hexdigest()


def _read_raw(path: str) -> bytes:
  try:
    with open(path, 'rb') as f:
      return f.read()
  except OSError as e:
    raise DataError(f'{path} cannot be read ({e}): replace the file') from None


def _read_bytes(path: str, limit: int, sha256: str | None = None) -> bytes:
  """The IDX bytes of `path`, unzipped, up to `limit` + 1 bytes; DataError
  unless they hash to `sha256` (when given) before unzipping."""
  raw = _read_raw(path)
  if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
    raise DataError(
      f'{path} changed while the dataset was being prepared: run again once'
      ' the IDX files are in place'
    )
  if not path.endswith('.gz'):
    return raw
  try:
    return _gunzip(raw, limit)
  # zlib.error on corrupt data; EOFError on a stream that ends early.
  except (EOFError, zlib.error) as e:
    raise DataError(f'{path} cannot be read ({e}): replace the file') from None


def _gunzip(raw: bytes, limit: int) -> bytes:
  """gzip's members in `raw` unzipped, stopping past `limit` bytes: a small
  file that unzips to far more than its header announces (a gzip bomb)
  costs no more than the header's size."""
  parts, total = [], 0
  while raw:
    unzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
    parts.append(unzip.decompress(raw, limit + 1 - total))
    total += len(parts[-1])
    if total > limit:
      break
    if not unzip.eof:
      raise EOFError('compressed file ended before the end of its stream')
    raw = unzip.unused_data.lstrip(b'\0')  # Members, then zero padding.
  return b''.join(parts)


def read_idx(
  path: str,
  magic: int,
  item_shape: tuple[int, ...],
  sha256: str | None = None,
) -> np.ndarray:
  """Parses one IDX file of unsigned bytes, checking its header and size.

  With `sha256`, also that the file is the one identified.
  """
  expected = check_size(path, magic, item_shape)
  data = _read_bytes(path, expected, sha256)
  header = 4 + 4 * (1 + len(item_shape))
  count, announced = _header(path, data[:header], magic, item_shape)
  if len(data) != expected or announced != expected:  # Or changed since.
    raise DataError(
      f'{path} is truncated or padded: {len(data)} bytes, its header'
      f' announces {count} items ({announced} bytes): replace the file'
    )
  return np.frombuffer(data, np.uint8, offset=header).reshape(
    (count, *item_shape)
  )


def read_split(
  folder: str, split: str, source: Source | None = None, other: str = ''
) -> tuple[np.ndarray, np.ndarray]:
  """Returns the validated (images [N,28,28,1] uint8, labels [N]) of a split.

  With `source`, the files must still be the ones it identified. A missing
  file names `other` as the fix (see `check_folder`).
  """
  images_name, labels_name = FILES[split]
  check_folder(folder, [images_name, labels_name], other)
  images_path = locate(folder, images_name)
  labels_path = locate(folder, labels_name)

  def identified(path: str) -> str | None:
    # A file not identified (e.g. .gz swapped for raw since) matches nothing.
    return source.files.get(path, 'not identified') if source else None

  size = (IMAGE_SIZE, IMAGE_SIZE)
  images = read_idx(images_path, IMAGE_MAGIC, size, identified(images_path))
  labels = read_idx(labels_path, LABEL_MAGIC, (), identified(labels_path))
  if len(images) != len(labels):
    raise DataError(
      f'{images_path} has {len(images)} images but {labels_path} has'
      f' {len(labels)} labels: the two files must come from one release'
    )
  if not len(labels):  # TFDS would fail on a split that yields nothing.
    raise DataError(
      f'{images_path} and {labels_path} hold no examples: a {split} split'
      ' needs at least one; put files that hold some there'
      + (f', or {other}' if other else '')
    )
  if labels.max() >= NUM_CLASSES:
    raise DataError(
      f'{labels_path} has label {labels.max()}, outside 0..{NUM_CLASSES - 1}:'
      f' the models here learn {NUM_CLASSES} classes; map the labels into'
      ' that range, or replace the file'
    )
  return images[..., np.newaxis], labels


class IdxMnist(tfds.core.GeneratorBasedBuilder):
  """MNIST or Fashion-MNIST from local IDX files (TFDS name `idx_mnist`).

  Prepares from `source`'s folder, refusing files that differ from it; pass
  a `data_dir` of that source's own (see `prepare`), as TFDS keys the
  prepared folder by config name only.
  """

  VERSION = tfds.core.Version(prepared.IDX_VERSION)
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

  def __init__(self, *, source: Source | None = None, **kwargs):
    """`source` None: only to open a dataset already prepared."""
    self.source = source
    super().__init__(**kwargs)

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
    if self.source is None:
      raise ValueError('IdxMnist prepares from a source only')
    # Read and validate every split before TFDS writes anything.
    folder = self.source.folder
    splits = {split: read_split(folder, split, self.source) for split in FILES}
    manifest = {
      'format': prepared.FORMAT_VERSION,
      'source': self.source.digest,
      'folder': folder,
      'files': self.source.files,  # Path -> sha256.
      # As `data` loads them: int64 labels.
      'arrays': {
        split: prepare.arrays_digest(images, labels.astype(np.int64))
        for split, (images, labels) in splits.items()
      },
    }
    # TFDS's temporary folder here: renamed into place with the records.
    with open(os.path.join(self.data_dir, prepared.MANIFEST), 'w') as f:
      json.dump(manifest, f, indent=1)
    return {
      split: self._generate_examples(images, labels)
      for split, (images, labels) in splits.items()
    }

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray):
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
      yield i, {'image': image, 'label': int(label)}
