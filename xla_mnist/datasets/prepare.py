"""Preparing a dataset once with TFDS, and checking what a run has not.

Loaded when a run's files are not all as stamped (`prepared`): the first run
on a source, the run after (which checks the arrays files the first wrote),
a changed or damaged file; and on each run on one of TFDS's registered
datasets, whose builder names the source. It hashes and stamps what it
checks, prepares under the data dir's lock (runs that start together
prepare one at a time), and reads a split's records back into its arrays
file. TFDS writes into a temporary folder that it renames when whole, so a
failed or killed preparation leaves nothing taken as prepared.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import io
import json
import logging
import os
import re
import shutil
import socket
import time
import zipfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from xla_mnist.datasets import prepared
from xla_mnist.datasets.prepared import FILES, Arrays, Parts, Stamps
from xla_mnist.runtime import errors, process
from xla_mnist.runtime.errors import DataError
from xla_mnist.workdir import files

PREPARE_LOCK = '.prepare.lock'  # In the data dir, while a run prepares.
# In the data dir: a TFDS dataset's or an image folder's arrays files, in a
# folder per source digest (the splits and size read are part of it).
ARRAYS_ROOT = 'arrays'
# A file changed less than this before it was hashed is not stamped: another
# change within its timestamps' granularity (a kernel tick; 2 s on FAT)
# could leave its version as it was. A later run stamps it.
SETTLED_NS = 3_000_000_000

Builder = tfds.core.DatasetBuilder
Read = Callable[[Builder, str], Parts]


@contextlib.contextmanager
def notices_off() -> Iterator[None]:
  """TFDS's notices (absl's WARNING lines, e.g. that a folder not yet
  prepared has no dataset_info.json) off the terminal: what goes wrong is
  raised, in one line."""
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    absl_logger.setLevel(level)


def from_idx(dataset: str, folder: str, data_dir: str) -> prepared.Prepared:
  """`folder`'s splits, checked (hashed, and stamped for later runs) or
  prepared: a source is prepared in a TFDS data dir of its own."""
  stamps = Stamps(data_dir)
  hashed = functools.partial(_checked, stamps, compute=_hash_idx)
  if (source := prepared.identify(folder, hashed)) is None:
    from xla_mnist.datasets import idx_builder  # noqa: PLC0415 - a fault.

    idx_builder.check_folder(folder)  # Raises, naming what is missing...
    source = prepared.identify(folder, hashed)  # ... unless it has just come.
  root = prepared.idx_root(data_dir, source)
  exclusive = functools.partial(
    _exclusive,
    data_dir,
    os.path.join(
      glob.escape(data_dir), prepared.IDX_ROOT, '*', prepared.IDX_BUILDER, '*'
    ),
  )

  def find() -> Builder | None:
    try:  # TFDS reads the prepared folder without the builder's code.
      return tfds.builder(f'{prepared.IDX_BUILDER}/{dataset}', data_dir=root)
    except tfds.core.DatasetNotFoundError:
      return None

  def make() -> Builder:
    from xla_mnist.datasets import idx_builder  # noqa: PLC0415 - to prepare.

    return idx_builder.IdxMnist(config=dataset, data_dir=root, source=source)

  manifest: dict = {}

  def ready() -> tuple[Builder, bool]:
    builder, prepared_now = _prepared(find, make, root, data_dir, exclusive)
    manifest.update(read_manifest(builder.data_dir) or {})
    if manifest.get('source') != source.digest:
      raise _damaged(builder, f"its {prepared.MANIFEST} is not the source's")
    return builder, prepared_now

  def read(builder: Builder, split: str) -> Parts:
    images, labels = _parse_records(builder, split)  # MNIST's sizes: whole.
    digest = arrays_digest(images, labels)
    if digest != manifest['arrays'][split]:
      raise _damaged(builder, f'its {split} records differ from the manifest')
    return len(labels), iter([(images, labels)])

  where = prepared.idx_folder(data_dir, dataset, source)
  splits, prepared_now = _splits(
    where, source.digest, stamps, ready, read, exclusive
  )
  return prepared.of_idx(dataset, data_dir, source, splits, prepared_now)


def from_source(
  dataset: str,
  image_dir: str,
  data_dir: str,
  train_split: str = 'train',
  test_split: str = 'test',
  image_size: int = 0,
  label: str = '',
) -> prepared.Prepared:
  """A folder of images (`image_dir`), else TFDS's registered `dataset`,
  whose builder checks its download against its checksums: the training
  and test splits named, at `image_size` (0: as they are), labelled by
  `label` (a TFDS ClassLabel feature; '': its supervised one), kept as
  arrays files in the data dir, in a folder named by their digest
  (`ARRAYS_ROOT`)."""
  files.check_data_dir(data_dir)  # Before TFDS sees it.
  stamps = Stamps(data_dir)
  splits = (train_split, test_split)
  roles = list(FILES)  # The arrays files' names: train, test.
  if image_dir:
    from xla_mnist.datasets import folder  # noqa: PLC0415 - a folder's only.

    names, listed = folder.listing(image_dir, splits)
    settled = time.time_ns() - SETTLED_NS
    digest = folder.digest(
      image_dir, listed, stamps, splits, image_size, settled
    )
    source = f'images in {image_dir}'
    channels = functools.cache(
      lambda: folder.channels(listed, splits, image_size)
    )
    dirs: tuple[str, ...] = ()

    def ready() -> tuple[Builder | None, bool]:
      return None, True  # Read from the folder itself.

    def read(_: Builder | None, role: str) -> Parts:
      split = splits[roles.index(role)]
      return folder.read(listed[split], channels(), image_size)

  else:
    from xla_mnist.datasets import registered  # noqa: PLC0415

    where = os.path.join(data_dir, re.split('[/:]', dataset)[0])
    find = functools.partial(registered.builder, dataset, data_dir)
    names, digest = registered.facts(
      _opened(find, where), splits, image_size, label
    )
    source = f'{dataset} from TFDS in {data_dir}'
    # A config's version folders lie one deeper (emnist/letters/3.1.0).
    dirs = (glob.escape(where), os.path.join(glob.escape(where), '*'))

    def make() -> Builder:
      builder = find()
      _check_download_reachable(builder, dataset)
      return builder

    def ready() -> tuple[Builder | None, bool]:
      return _prepared(find, make, where, data_dir, exclusive)

    def read(builder: Builder | None, role: str) -> Parts:
      split = splits[roles.index(role)]
      return registered.read(builder, split, image_size, label)

  arrays_root = os.path.join(data_dir, ARRAYS_ROOT)
  exclusive = functools.partial(
    _exclusive, data_dir, *dirs, glob.escape(arrays_root)
  )
  ready_splits, prepared_now = _splits(
    os.path.join(arrays_root, digest[:16]), digest, stamps, ready, read,
    exclusive,
  )  # fmt: skip
  return prepared.Prepared(
    *ready_splits,
    source=f'{source} (source {digest[:12]})',
    prepared_now=prepared_now,
    source_digest=digest,
    class_names=names,
  )


def arrays_digest(images: np.ndarray, labels: np.ndarray) -> str:
  """sha256 of a split as loaded (uint8 images, int64 labels, shapes): what
  a prepared split or an arrays file must hash to, to be used."""
  h = arrays_hash(images.shape)
  h.update(np.ascontiguousarray(images, np.uint8))
  h.update(np.ascontiguousarray(labels, '<i8'))
  return h.hexdigest()


def arrays_hash(shape: tuple[int, ...]) -> hashlib._Hash:
  """`arrays_digest`'s hash before the arrays' bytes, for a split written
  part by part (`_write_arrays`)."""
  head = f'{prepared.FORMAT_VERSION} {tuple(map(int, shape))}'
  return hashlib.sha256(head.encode())


def read_manifest(prepared_dir: str) -> dict | None:
  """The manifest of a prepared folder; None if missing or not whole."""
  try:
    with open(os.path.join(prepared_dir, prepared.MANIFEST)) as f:
      manifest = json.load(f)
    digests = [manifest['source'], *(manifest['arrays'][s] for s in FILES)]
  # Missing, cut, not JSON, or JSON of another shape.
  except (OSError, ValueError, KeyError, TypeError):
    return None
  return manifest if all(isinstance(d, str) for d in digests) else None


def _hash_idx(path: str) -> str:
  """`idx_builder.hash_file`: that module loads only to hash a file."""
  from xla_mnist.datasets import idx_builder  # noqa: PLC0415

  return idx_builder.hash_file(path)


def _checked(
  stamps: Stamps, path: str, compute: Callable[[str], str | None]
) -> str | None:
  """`path`'s digest: stamped, or `compute(path)`'s (None: not computable),
  stamped unless the file changed while hashed or just before
  (`SETTLED_NS`)."""
  started = time.time_ns()
  before = prepared.file_version(path)
  digest = stamps.digest(path, before)
  if digest is not None:
    return digest
  digest = compute(path)
  after = prepared.file_version(path)
  settled = after and max(after[3:]) < started - SETTLED_NS
  if digest and settled and after == before:
    stamps.stamp(path, after, digest)
  return digest


def _checked_arrays(
  stamps: Stamps, folder: str, split: str, source_digest: str
) -> Arrays | None:
  """`split`'s arrays from its file in `folder` if provably written from
  `source_digest`'s data: a cut, foreign or swapped-in file, or one written
  from another source, is never used. Its arrays are hashed once per
  version of the file (`stamps`)."""
  stamped = prepared.stamped_arrays(stamps, folder, split, source_digest)
  if stamped is not None:
    return stamped
  found = []

  def hashed(path: str) -> str | None:
    found.append(prepared.read_arrays(path, source_digest))
    return found[0] and arrays_digest(*found[0][0])

  digest = _checked(stamps, prepared.arrays_file(folder, split), hashed)
  return found[0][0] if found and found[0] and found[0][1] == digest else None


def _splits(
  folder: str,
  source_digest: str,
  stamps: Stamps,
  ready: Callable[[], tuple[Builder, bool]],
  read: Read,
  exclusive: Callable[[], contextlib.AbstractContextManager],
) -> tuple[list[Arrays], bool]:
  """Both splits, from their arrays files in `folder` if provably the
  source's, else from the records of TFDS's builder (`ready()`, which
  prepares it if need be); and whether this call prepared them.

  Reading the records costs about half a second a run; the arrays file,
  written once by the first run that reads them, far less, its check
  included. The file lives in the builder's own folder, so a dataset
  prepared anew drops it with the records; one that cannot be written (a
  read-only or full data dir) is skipped. It is written under the prepare
  lock, so that the lock's holder may clear temp files of killed writes.
  """
  splits = [_checked_arrays(stamps, folder, s, source_digest) for s in FILES]
  prepared_now = False
  if None in splits:
    builder, prepared_now = ready()
    for i, split in enumerate(FILES):
      if splits[i] is None:
        splits[i] = _records(
          builder, folder, split, read, source_digest, exclusive
        )
  stamps.save()
  return splits, prepared_now


def _records(
  builder: Builder | None,
  folder: str,
  split: str,
  read: Read,
  source_digest: str,
  exclusive: Callable[[], contextlib.AbstractContextManager],
) -> Arrays:
  """A prepared split read from its records (or a folder's images: no
  `builder`) into its arrays file in `folder` part by part, then mapped from
  the file: a split larger than memory is never held (`data.load` streams
  it). Where the data dir cannot take the file (read-only, full), the split
  is held in memory instead, if it fits there."""
  path = prepared.arrays_file(folder, split)
  try:
    with contextlib.suppress(OSError), exclusive():
      os.makedirs(folder, exist_ok=True)
      files.write_atomically(
        path, lambda f: _write_arrays(f, *read(builder, split), source_digest)
      )
      if found := prepared.read_arrays(path, source_digest):
        return found[0]
    return _held(path, *read(builder, split))
  except tf.errors.OpError as e:  # Cut, flipped or missing record files.
    if builder is None:  # A folder's images: `folder.read` names a file.
      raise DataError(f'{folder}: {errors.first_line(e)}') from None
    raise _damaged(
      builder, f'{split} records: {errors.first_line(e)}'
    ) from None


def _write_arrays(
  f: BinaryIO, count: int, parts: Iterator[Arrays], source_digest: str
) -> None:
  """What `np.savez` writes for the split's images, labels, source digest
  and arrays' digest (`arrays_digest`), the images written and hashed part
  by part as they are read."""
  labels: list[np.ndarray] = []
  shape, digest, written = (count,), None, 0

  def changed(got: tuple[int, ...]) -> DataError:
    return DataError(
      f'the data changed while read: {written} images or more of {got} came'
      f' where {count} of {shape[1:]} were counted: run again'
    )

  with zipfile.ZipFile(f, 'w', zipfile.ZIP_STORED, allowZip64=True) as z:
    with z.open('images.npy', 'w', force_zip64=True) as member:
      for images, part_labels in parts:
        if digest is None:
          shape = (count, *images.shape[1:])
          digest = arrays_hash(shape)
          np.lib.format.write_array_header_1_0(member, {
            'descr': '|u1', 'fortran_order': False, 'shape': shape,
          })  # fmt: skip
        written += len(images)
        if images.shape[1:] != shape[1:] or written > count:
          raise changed(images.shape[1:])
        pixels = np.ascontiguousarray(images, np.uint8)
        member.write(pixels)
        digest.update(pixels)
        labels.append(part_labels)
    if digest is None or written != count:
      raise changed(shape[1:])
    together = np.concatenate(labels).astype('<i8')
    digest.update(together)
    for name, array in (
      ('labels', together),
      ('source', np.array(source_digest)),
      ('digest', np.array(digest.hexdigest())),
    ):
      with z.open(f'{name}.npy', 'w') as member:
        np.lib.format.write_array(member, array)


def _held(path: str, count: int, parts: Iterator[Arrays]) -> Arrays:
  """The split in memory, as its arrays file could not be written at
  `path`; one line where it would not fit either."""
  first_images, first_labels = next(parts)
  need = count * first_images[0].nbytes
  room = process.MEMORY_SHARE * process.memory_bytes()
  if room and need > room:
    raise DataError(
      f'cannot write {path}, and its {need / 2**30:.1f} GiB of images do'
      f' not fit the {room / 2**30:.1f} GiB a run may hold: make the data dir'
      f' writable, or pass another {errors.arg("data_dir", "DIR")}'
    )
  together = [(first_images, first_labels), *parts]
  images, labels = zip(*together, strict=True)
  return np.concatenate(images), np.concatenate(labels)


def _prepared(
  find: Callable[[], Builder | None],
  make: Callable[[], Builder],
  folder: str,
  data_dir: str,
  exclusive: Callable[[], contextlib.AbstractContextManager],
) -> tuple[Builder, bool]:
  """A builder whose dataset is prepared, and whether this call prepared it.

  `find` opens the dataset kept in `folder` of `data_dir` (None if there is
  none); `make` makes the builder that prepares it.

  Runs that start together on one data dir (a sweep, workers on one host)
  prepare it one at a time: the first prepares, the others wait on a lock,
  then find it prepared. TFDS alone would have them collide in its rename.
  TFDS's progress bars and notices are kept off the terminal.
  """
  files.check_data_dir(data_dir)  # Before TFDS sees it.

  def found() -> Builder | None:
    builder = find()
    return builder if builder and builder.is_prepared() else None

  # Prepared: no lock. Runs only read it, and add arrays files atomically.
  if builder := _opened(found, folder):
    return builder, False
  files.ensure_writable_dir(data_dir, 'data dir', 'data_dir')
  with exclusive():
    if builder := _opened(found, folder):  # Another run may have prepared it.
      return builder, False
    builder = _opened(make, folder)
    _prepare(builder, data_dir)
  return builder, True


def _opened(call: Callable[[], Builder | None], folder: str) -> Builder | None:
  """`call()`'s builder; TFDS's failures to read `folder` one line."""
  try:
    return call()
  except errors.UserError:
    raise
  # TFDS reads a prepared dataset's metadata here, and fails in its own ways
  # on a damaged file (protobuf's ParseError, ValueError, ...).
  except Exception as e:  # noqa: BLE001
    raise DataError(
      f'the prepared dataset in {folder} cannot be read'
      f' ({errors.first_line(e)}):'
      ' delete that folder and run again to prepare it anew'
    ) from None


def _prepare(builder: Builder, data_dir: str) -> None:
  """TFDS's preparation, its progress bars off the terminal; a failed write
  (a full disk) one line."""
  quiet = io.StringIO()
  try:
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
      builder.download_and_prepare()
  except Exception as e:  # noqa: BLE001 - TFDS wraps a write's error.
    if (reason := _write_failure(e)) is None:
      raise
    raise DataError(
      f'data dir {data_dir} could not take the prepared dataset ({reason}):'
      f' free space there, or pass another {errors.arg("data_dir", "DIR")}'
    ) from None


@contextlib.contextmanager
def _exclusive(data_dir: str, *dataset_dirs: str) -> Iterator[None]:
  """Holds the data dir's prepare lock, and clears what killed runs left.

  TFDS's `incomplete.*` folders and our `*.tmp` arrays files are written
  only under this lock, so once it is held, any found in the folders
  matched by the globs `dataset_dirs` (those holding the version folders,
  or the arrays folders) belong to no live run.
  """
  with files.waiting_lock(os.path.join(data_dir, PREPARE_LOCK)):
    for dataset_dir in (d for p in dataset_dirs for d in glob.glob(p)):
      for path in glob.glob(
        os.path.join(glob.escape(dataset_dir), 'incomplete.*')
      ):
        shutil.rmtree(path, ignore_errors=True)
      for path in glob.glob(
        os.path.join(glob.escape(dataset_dir), '*', '*.tmp')
      ):
        with contextlib.suppress(OSError):
          os.remove(path)
    yield


def _damaged(builder: Builder, what: str) -> DataError:
  return DataError(
    f'the prepared dataset in {builder.data_dir} is damaged ({what}):'
    ' delete that folder and run again to prepare it anew'
  )


def _write_failure(error: BaseException | None) -> str | None:
  """The reason of the failed write behind `error`, if one is behind it.

  TFDS re-raises a failed write of its records as a RuntimeError of its
  own, with TF's error (`<path>; No space left on device`) as its cause.
  """
  while error is not None:
    if isinstance(error, OSError):
      return error.strerror or str(error)
    if isinstance(error, tf.errors.OpError):
      return error.message.rsplit('; ', 1)[-1]
    error = error.__cause__ or error.__context__
  return None


def _parse_records(builder: Builder, split: str) -> Arrays:
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


def _check_download_reachable(builder: Builder, name: str) -> None:
  """Fails in seconds, not after minutes of TFDS retries, when offline; or
  at once, naming the folder, when TFDS needs files the user must fetch."""
  from xla_mnist.datasets import registered  # noqa: PLC0415

  manual = os.path.join(builder._data_dir_root, 'downloads', 'manual')  # noqa: SLF001 - TFDS's default, as it reads it.
  if builder.MANUAL_DOWNLOAD_INSTRUCTIONS:
    if os.path.isdir(manual) and os.listdir(manual):
      return
    how = ' '.join(builder.MANUAL_DOWNLOAD_INSTRUCTIONS.split())
    raise DataError(
      f'{name} is not prepared, and TFDS prepares it only from files you'
      f' download yourself: put them in {manual} ({how[:300]})'
    )
  hint = {
    'fashion_mnist': 'apt-get install dataset-fashion-mnist (Debian), or ',
    'mnist': '',
  }
  for host in registered.download_hosts(builder):
    try:
      socket.create_connection((host, 443), timeout=5).close()
    except OSError as e:
      fix = (
        f'{hint[name]}put its four IDX .gz files in a folder and pass'
        f' {errors.field("idx_dir", "DIR")}'
        if name in hint
        else f'prepare it where the network reaches, then copy {name}'
        ' into this data dir, or pass a folder of its images with'
        f' {errors.field("image_dir", "DIR")}'
      )
      raise DataError(
        f'{name} is not prepared in the data dir and cannot be downloaded'
        f' ({host}: {e.strerror or e}): {fix}, or train offline on'
        ' Fashion-MNIST with the fashion_mnist config'
      ) from None
