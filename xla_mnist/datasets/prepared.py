"""Datasets prepared once by TFDS in the data dir, and read back as arrays.

An IDX folder goes through the `idx_mnist` builder, in a TFDS data dir of
its own named by its files' digest (`identity`), so a run never takes
another source's records for its own; TFDS's registered builders check
their download against their checksums. Runs that start together prepare
one at a time, under a lock; a prepared split's arrays are kept beside its
records, so later runs load them instead of parsing the records. What a run
checked by hashing (the source files, the arrays files) is stamped in the
data dir with the file's stat, so that later runs hash only files whose stat
changed. A prepared dataset is opened with TFDS's reader of prepared folders,
so `idx_builder` (reading IDX files, writing records) loads only to prepare
or to hash a source file not stamped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator
from zipfile import BadZipFile

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from xla_mnist.datasets import identity
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import DataError
from xla_mnist.workdir import files

PREPARE_LOCK = '.prepare.lock'  # In the data dir, while a run prepares.
# A prepared split's arrays, in the builder's folder: `<prefix><split>.npz`.
ARRAYS_PREFIX = 'xla_mnist-'
# In the data dir: a TFDS data dir per IDX source, named by its digest.
IDX_ROOT = 'idx'
IDX_BUILDER = 'idx_mnist'  # TFDS's name of `idx_builder.IdxMnist`.
# In the data dir: the digests of files checked, each with the stat the file
# had (`Stamps`).
STAMPS = 'xla_mnist-stamps.json'
# A file changed less than this before it was hashed is not stamped: another
# change within its timestamps' granularity (a kernel tick; 2 s on FAT)
# could leave its stat as it was. A later run stamps it.
SETTLED_NS = 3_000_000_000


@dataclasses.dataclass(frozen=True)
class Prepared:
  train: tuple[np.ndarray, np.ndarray]  # uint8 [N, 28, 28, 1], int64 [N]
  test: tuple[np.ndarray, np.ndarray]
  source: str  # Human-readable origin, printed in the run summary.
  prepared_now: bool  # False when an earlier run had prepared it.
  # sha256 naming the exact source: for IDX files, their contents; for TFDS's
  # registered datasets, the checksums TFDS verifies its download against.
  source_digest: str


def from_idx(dataset: str, folder: str, data_dir: str) -> Prepared:
  """Each source is prepared in a folder of its own, named by its digest.

  So a run never takes another source's records for its own, and switching
  sources destroys nothing a concurrent run on the other source may be
  reading; going back to a source finds it still prepared.
  """
  stamps = Stamps(data_dir)
  # Before TFDS looks: its own check of an empty folder is a traceback.
  source = identity.identify(folder, stamps.hashed)
  root = os.path.join(data_dir, IDX_ROOT, source.digest[:16])
  exclusive = functools.partial(
    _exclusive,
    data_dir,
    os.path.join(glob.escape(data_dir), IDX_ROOT, '*', IDX_BUILDER, '*'),
  )

  def find() -> tfds.core.DatasetBuilder | None:
    try:  # TFDS reads the prepared folder without the builder's code.
      return tfds.builder(f'{IDX_BUILDER}/{dataset}', data_dir=root)
    except tfds.core.DatasetNotFoundError:
      return None

  def make() -> tfds.core.DatasetBuilder:
    from xla_mnist.datasets import idx_builder  # noqa: PLC0415 - to prepare.

    return idx_builder.IdxMnist(config=dataset, data_dir=root, source=source)

  builder, prepared_now = _prepared(find, make, root, data_dir, exclusive)
  manifest = identity.read_manifest(builder.data_dir)
  if manifest is None or manifest['source'] != source.digest:
    raise _damaged(builder, f"its {identity.MANIFEST} is not the source's")

  def read(builder: tfds.core.DatasetBuilder, split: str):
    images, labels = _parse_records(builder, split)
    if identity.arrays_digest(images, labels) != manifest['arrays'][split]:
      raise _damaged(builder, f'its {split} records differ from the manifest')
    return images, labels

  def split(name: str) -> tuple[np.ndarray, np.ndarray]:
    return _split(builder, name, read, source.digest, exclusive, stamps)

  loaded = Prepared(
    train=split('train'),
    test=split('test'),
    source=f'{dataset} IDX files from {source.folder} (source'
    f' {source.digest[:12]}), via TFDS in {builder.data_dir}',
    prepared_now=prepared_now,
    source_digest=source.digest,
  )
  stamps.save()
  return loaded


class Stamps:
  """Digests of files, each with the stat the file had when it was hashed.

  A digest is taken from here only while the file's stat (device, inode,
  size, mtime, ctime) is the one stamped: any write, replacement or `touch`
  changes its ctime, which no user can set back, so a changed file is
  hashed again. Files changed just before their hash are not stamped
  (`SETTLED_NS`). The stamps live in the data dir, in one file written
  atomically; one that cannot be read or written is done without.
  """

  def __init__(self, data_dir: str):
    self._path = os.path.join(data_dir, STAMPS)
    self._entries: dict[str, list] = {}
    self._changed = False
    with contextlib.suppress(OSError, ValueError, AttributeError):
      with open(self._path) as f:
        entries = json.load(f)
      self._entries = {
        p: e
        for p, e in entries.items()
        if isinstance(e, list) and len(e) == 2 and isinstance(e[1], str)
      }

  def digest(
    self, path: str, compute: Callable[[str], str]
  ) -> tuple[os.stat_result, str]:
    """`path`'s stat, and its digest: stamped, or `compute(path)`'s."""
    started = time.time_ns()
    before = _stat(path)
    key = os.path.abspath(path)
    entry = self._entries.get(key)
    if before is not None and entry and entry[0] == _fields(before):
      return before, entry[1]
    digest = compute(path)
    after = _stat(path)
    settled = after and max(after.st_mtime_ns, after.st_ctime_ns) < (
      started - SETTLED_NS
    )
    if settled and _fields(after) == _fields(before):
      self._entries[key] = [_fields(after), digest]
      self._changed = True
    return before, digest

  def hashed(self, path: str) -> tuple[int, int, str]:
    """`idx_builder.hash_file(path)`, its sha256 stamped: that module
    loads only for a file not stamped."""
    computed = []

    def compute(path: str) -> str:
      from xla_mnist.datasets import idx_builder  # noqa: PLC0415

      computed.append(idx_builder.hash_file(path))
      return computed[0][2]

    stat, sha = self.digest(path, compute)
    return computed[0] if computed else (stat.st_size, stat.st_mtime_ns, sha)

  def save(self) -> None:
    """Writes the stamps if any is new, without those of files since
    changed or gone (a test's or a sweep's temporary folders)."""
    if not self._changed:
      return
    current = {
      path: entry
      for path, entry in self._entries.items()
      if entry[0] == _fields(_stat(path))
    }
    with contextlib.suppress(OSError):
      files.write_atomically(self._path, json.dumps(current))
    self._changed = False


def _stat(path: str) -> os.stat_result | None:
  try:
    return os.stat(path)
  except OSError:
    return None


def _fields(stat: os.stat_result | None) -> list[int] | None:
  """What of a stat tells a file's version: any write changes the ctime."""
  if stat is None:
    return None
  return [
    stat.st_dev,
    stat.st_ino,
    stat.st_size,
    stat.st_mtime_ns,
    stat.st_ctime_ns,
  ]


def _prepared(
  find: Callable[[], tfds.core.DatasetBuilder | None],
  make: Callable[[], tfds.core.DatasetBuilder],
  folder: str,
  data_dir: str,
  exclusive: Callable[[], contextlib.AbstractContextManager],
) -> tuple[tfds.core.DatasetBuilder, bool]:
  """A builder whose dataset is prepared, and whether this call prepared it.

  `find` opens the dataset kept in `folder` of `data_dir` (None if there is
  none); `make` makes the builder that prepares it.

  Runs that start together on one data dir (a sweep, workers on one host)
  prepare it one at a time: the first prepares, the others wait on a lock,
  then find it prepared. TFDS alone would have them collide in its rename.
  TFDS writes into a temporary folder that it renames when whole, so a run
  that fails (a full disk) or is killed leaves nothing taken as prepared.
  TFDS's progress bars and notices are kept off the terminal.
  """
  files.check_utf8(data_dir, 'data dir', 'data_dir')  # Before TFDS sees it.
  if os.path.exists(data_dir) and not os.path.isdir(data_dir):
    files.ensure_writable_dir(data_dir, 'data dir', 'data_dir')  # Raises.

  def found() -> tfds.core.DatasetBuilder | None:
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


def _opened(
  call: Callable[[], tfds.core.DatasetBuilder | None], folder: str
) -> tfds.core.DatasetBuilder | None:
  """`call()`'s builder; TFDS's failures to read `folder` one line."""
  try:
    return call()
  except DataError:
    raise
  # TFDS reads a prepared dataset's metadata here, and fails in its own ways
  # on a damaged file (protobuf's ParseError, ValueError, ...).
  except Exception as e:  # noqa: BLE001
    raise DataError(
      f'the prepared dataset in {folder} cannot be read'
      f' ({errors.first_line(e)}):'
      ' delete that folder and run again to prepare it anew'
    ) from None


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


def _prepare(builder: tfds.core.DatasetBuilder, data_dir: str) -> None:
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
def _exclusive(data_dir: str, dataset_dirs: str) -> Iterator[None]:
  """Holds the data dir's prepare lock, and clears what killed runs left.

  TFDS's `incomplete.*` folders and our `*.tmp` arrays files are written
  only under this lock, so once it is held, any found in the dataset
  folders matched by glob `dataset_dirs` (those holding the version
  folders) belong to no live run.
  """
  with files.waiting_lock(os.path.join(data_dir, PREPARE_LOCK)):
    for dataset_dir in glob.glob(dataset_dirs):
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


def _damaged(builder: tfds.core.DatasetBuilder, what: str) -> DataError:
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


def _split(
  builder: tfds.core.DatasetBuilder,
  split: str,
  read: Callable[
    [tfds.core.DatasetBuilder, str], tuple[np.ndarray, np.ndarray]
  ],
  source_digest: str,
  exclusive: Callable[[], contextlib.AbstractContextManager],
  stamps: Stamps,
) -> tuple[np.ndarray, np.ndarray]:
  """A prepared split's (images, labels), from its arrays file beside
  TFDS's records if any.

  Reading the records costs about half a second a run; the arrays file,
  written once by the first run that reads them, far less, its check
  included. The file lives in the builder's own folder, so a dataset
  prepared anew drops it with the records; one that cannot be written (a
  read-only or full data dir) is skipped. It is written under the prepare
  lock, so that the lock's holder may clear temp files of killed writes.
  """
  path = os.path.join(builder.data_dir, f'{ARRAYS_PREFIX}{split}.npz')
  arrays = _cached_arrays(path, source_digest, stamps)
  if arrays is None:
    try:
      images, labels = read(builder, split)
    except tf.errors.OpError as e:  # Cut, flipped or missing record files.
      raise _damaged(
        builder, f'{split} records: {errors.first_line(e)}'
      ) from None
    digest = identity.arrays_digest(images, labels)
    with contextlib.suppress(OSError), exclusive():
      files.write_atomically(
        path,
        lambda f: np.savez(
          f,
          images=images,
          labels=labels,
          source=np.array(source_digest),
          digest=np.array(digest),
        ),
      )
    arrays = images, labels
  return arrays


def _cached_arrays(
  path: str, source_digest: str, stamps: Stamps
) -> tuple[np.ndarray, np.ndarray] | None:
  """The arrays in `path` if provably written from `source_digest`'s data.

  The file names its source and a digest of its arrays: a cut, foreign or
  swapped-in file, or one written from another source, is never used. The
  digest of its arrays is computed once per version of the file (`stamps`).
  """
  stored: dict = {}

  def read(path: str) -> None:
    with np.load(path) as f:
      stored.update(images=f['images'], labels=f['labels'])
      stored.update(source=str(f['source']), digest=str(f['digest']))

  def hashed(path: str) -> str:
    read(path)
    return identity.arrays_digest(stored['images'], stored['labels'])

  try:
    stat, digest = stamps.digest(path, hashed)
    if not stored:  # Stamped: read now, unchanged since it was stamped.
      read(path)
      if _fields(_stat(path)) != _fields(stat):
        return None
  # An empty, cut or foreign file: each fails in its own way; one whose
  # arrays claim more than memory holds is as foreign.
  except (
    OSError,
    EOFError,
    KeyError,
    TypeError,
    ValueError,
    BadZipFile,
    MemoryError,
  ):
    return None
  images, labels = stored['images'], stored['labels']
  typed = images.dtype == np.uint8 and labels.dtype == np.int64
  if not typed or stored['source'] != source_digest:
    return None
  return (images, labels) if digest == stored['digest'] else None


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


def from_tfds(dataset: str, data_dir: str) -> Prepared:
  """TFDS's builder, which checks its download against its checksums."""
  exclusive = functools.partial(
    _exclusive, data_dir, os.path.join(glob.escape(data_dir), dataset)
  )

  def make() -> tfds.core.DatasetBuilder:
    builder = tfds.builder(dataset, data_dir=data_dir)
    _check_download_reachable(builder, dataset)
    return builder

  builder, prepared_now = _prepared(
    lambda: tfds.builder(dataset, data_dir=data_dir),
    make,
    os.path.join(data_dir, dataset),
    data_dir,
    exclusive,
  )
  digest = _registered_digest(builder)
  stamps = Stamps(data_dir)

  def split(name: str) -> tuple[np.ndarray, np.ndarray]:
    return _split(builder, name, _as_dataset, digest, exclusive, stamps)

  loaded = Prepared(
    train=split('train'),
    test=split('test'),
    source=f'{dataset} from TFDS in {data_dir} (source {digest[:12]})',
    prepared_now=prepared_now,
    source_digest=digest,
  )
  stamps.save()
  return loaded


def _registered_digest(builder: tfds.core.DatasetBuilder) -> str:
  """sha256 of the dataset's name, version and TFDS's download checksums."""
  lines = [f'xla_mnist tfds source {identity.FORMAT_VERSION}']
  lines.append(builder.info.full_name)
  infos = builder.url_infos or {}
  lines += [f'{url} {info.checksum}' for url, info in sorted(infos.items())]
  return hashlib.sha256('\n'.join(lines).encode()).hexdigest()


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
      f' files in a folder and pass {errors.field("idx_dir", "DIR")}, or train'
      ' offline on'
      ' Fashion-MNIST with the fashion_mnist config'
    ) from None
