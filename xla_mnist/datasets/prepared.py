"""Datasets prepared once by TFDS in the data dir, as runs read them back.

An IDX folder is prepared in a TFDS data dir of its own named by its files'
digest, so a run never takes another source's records for its own; TFDS's
registered builders check their download against their checksums. Each
split's arrays are kept beside its records, in a file naming its source and
the digest of its arrays. What a run checked by hashing (the source files,
the arrays files) is stamped in the data dir with the file's stat: a run
on IDX files whose files are all as stamped loads the arrays without
hashing, TFDS, or what prepares (`prepare`, `idx_builder`), which load for
a file not stamped, data not prepared, and TFDS's registered datasets
(their builder names their source).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import zipfile
from collections.abc import Callable, Iterator

import numpy as np

from xla_mnist.runtime import layout
from xla_mnist.workdir import files

# Our own version of what is prepared from a source (the records, the
# manifest, the arrays files): part of every digest, so changing the format
# prepares anew instead of trusting files of the old one.
FORMAT_VERSION = 1
FILES = layout.IDX_FILES
# In the data dir: a TFDS data dir per IDX source, named by its digest,
# holding the folders of `idx_builder.IdxMnist` (its TFDS name, version).
IDX_ROOT = 'idx'
IDX_BUILDER = 'idx_mnist'
IDX_VERSION = '1.0.0'
# In a prepared folder: the source and its arrays' digests (`idx_builder`),
# and each split's arrays, `<ARRAYS_PREFIX><split>.npz`.
MANIFEST = 'xla_mnist-source.json'
ARRAYS_PREFIX = 'xla_mnist-'
# In the data dir: the digests of files checked, each with the version
# (`file_version`) the file had when hashed.
STAMPS = 'xla_mnist-stamps.json'

Arrays = tuple[np.ndarray, np.ndarray]  # uint8 [N, H, W, C], int64 [N]
# A split as its reader gives it: its count, and its Arrays part by part.
Parts = tuple[int, Iterator[Arrays]]


@dataclasses.dataclass(frozen=True)
class Prepared:
  train: Arrays
  test: Arrays
  source: str  # Human-readable origin, printed in the run summary.
  prepared_now: bool  # False when an earlier run had prepared it.
  # sha256 naming the exact data: the IDX files' contents, TFDS's download
  # checksums, a folder's images; with the splits and size they were read at.
  source_digest: str
  class_names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Source:
  """The exact IDX files a dataset is prepared from."""

  folder: str
  files: dict[str, str]  # Path -> sha256 of its bytes as stored, as `FILES`.
  digest: str  # sha256 of FORMAT_VERSION and the files' names and hashes.


def from_idx(dataset: str, folder: str, data_dir: str) -> Prepared | None:
  """`folder`'s splits, if its files and their arrays files are all as
  stamped: nothing hashed, TFDS not opened. None otherwise, for
  `prepare.from_idx` to check or prepare them."""
  stamps = Stamps(data_dir)
  source = identify(folder, stamps.digest)
  where = source and idx_folder(data_dir, dataset, source)
  splits = where and [
    stamped_arrays(stamps, where, s, source.digest) for s in FILES
  ]
  if not splits or None in splits:
    return None
  return of_idx(dataset, data_dir, source, splits, prepared_now=False)


def of_idx(
  dataset: str,
  data_dir: str,
  source: Source,
  splits: list[Arrays],
  prepared_now: bool,
) -> Prepared:
  """Each source is prepared in a folder of its own, named by its digest,
  so a run never takes another source's records for its own, and switching
  sources destroys nothing a concurrent run on the other may be reading."""
  where = idx_folder(data_dir, dataset, source)
  return Prepared(
    *splits,
    source=f'{dataset} IDX files from {source.folder} (source'
    f' {source.digest[:12]}), via TFDS in {where}',
    prepared_now=prepared_now,
    source_digest=source.digest,
    class_names=layout.IDX_CLASSES[dataset],
  )


def identify(folder: str, hashed: Callable[[str], str | None]) -> Source | None:
  """Names the four IDX files of `folder` by their bytes; None if one is
  missing (`idx_builder.check_folder` names it) or `hashed` has not every
  file's sha256.

  By content, not by size and mtime: a copy that kept the mtime (cp -p,
  rsync -t) but not the bytes must not pass for the old files, and a
  touched file with the same bytes needs no new preparation. `hashed` gives
  a file's sha256: `idx_builder.hash_file`, which checks its header first,
  or what an earlier hash of the same, unchanged file gave. The paths are
  absolute, as `read_split` finds them from the source's folder: a relative
  one would never match (issue 39).
  """
  folder = os.path.abspath(folder)
  paths = [locate(folder, name) for pair in FILES.values() for name in pair]
  if None in paths:
    return None
  hashes = {path: hashed(path) for path in paths}
  if None in hashes.values():
    return None
  lines = [f'xla_mnist idx source {FORMAT_VERSION}']
  lines += [f'{os.path.basename(path)} {sha}' for path, sha in hashes.items()]
  digest = hashlib.sha256('\n'.join(lines).encode()).hexdigest()
  return Source(folder, hashes, digest)


def locate(folder: str, name: str) -> str | None:
  """The path of `name` in `folder`, gzipped or not; None if neither."""
  for candidate in (name, name.removesuffix('.gz')):
    path = os.path.join(folder, candidate)
    if os.path.isfile(path):
      return path
  return None


def idx_folder(data_dir: str, dataset: str, source: Source) -> str:
  """Where TFDS keeps `dataset` prepared from `source`."""
  root = idx_root(data_dir, source)
  return os.path.join(root, IDX_BUILDER, dataset, IDX_VERSION)


def idx_root(data_dir: str, source: Source) -> str:
  """The TFDS data dir of `source` (`prepare` passes it to TFDS)."""
  return os.path.join(data_dir, IDX_ROOT, source.digest[:16])


def arrays_file(folder: str, split: str) -> str:
  return os.path.join(folder, f'{ARRAYS_PREFIX}{split}.npz')


def read_arrays(path: str, source: str) -> tuple[Arrays, str] | None:
  """The arrays in `path`, and the digest the file states for them; None
  unless the file is whole, of our format and states source digest
  `source`. The images are memory-mapped, read as they are used: a run
  holds them or streams them (`data.load`)."""
  try:
    with np.load(path) as f:
      labels, stated, digest = f['labels'], str(f['source']), str(f['digest'])
    images = _mapped(path, 'images.npy')
  # An empty, cut or foreign file fails in its own way (OSError, BadZipFile,
  # KeyError, ValueError...); one whose arrays claim more than memory holds
  # (MemoryError) is as foreign.
  except Exception:  # noqa: BLE001
    return None
  typed = images.dtype == np.uint8 and labels.dtype == np.int64
  return ((images, labels), digest) if typed and stated == source else None


def _mapped(path: str, member: str) -> np.ndarray:
  """`member` of the .npz `path` (np.savez stores it uncompressed), mapped
  from the file: where its bytes start is the zip's local header's end."""
  with zipfile.ZipFile(path) as z:
    info = z.getinfo(member)
  with open(path, 'rb') as f:
    f.seek(info.header_offset)
    local = f.read(30)  # The local header: its name and extra lengths last.
    f.seek(int.from_bytes(local[26:28], 'little'), 1)
    f.seek(int.from_bytes(local[28:30], 'little'), 1)
    read = {(1, 0): np.lib.format.read_array_header_1_0}.get(
      np.lib.format.read_magic(f), np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(f)
    if info.compress_type or local[:4] != b'PK\x03\x04' or fortran:
      raise ValueError(f'{member} of {path} is not stored plain')
    return np.memmap(path, dtype, 'r', f.tell(), shape)


def stamped_arrays(
  stamps: Stamps, folder: str, split: str, source_digest: str
) -> Arrays | None:
  """`split`'s arrays from its file in `folder`, if the file is as stamped
  (its digest known) and states that digest and `source_digest`."""
  path = arrays_file(folder, split)
  version = file_version(path)
  digest = stamps.digest(path, version)
  read = digest and read_arrays(path, source_digest)
  # The file read is the one stamped: any write since changed its version.
  if read and read[1] == digest and file_version(path) == version:
    return read[0]
  return None


class Stamps:
  """Digests of files, each with the version the file had when hashed.

  A digest is taken from here only while the file's version (`file_version`)
  is the one stamped: any write, replacement or `touch` changes its ctime,
  which no user can set back, so a changed file is hashed again (`prepare`
  hashes and stamps). The stamps live in the data dir, in one file written
  atomically; one that cannot be read or written is done without.
  """

  def __init__(self, data_dir: str):
    self.path = os.path.join(data_dir, STAMPS)
    self.entries: dict[str, list] = {}
    self.changed = False
    with contextlib.suppress(OSError, ValueError, AttributeError):
      with open(self.path) as f:
        entries = json.load(f)
      self.entries = {
        p: e
        for p, e in entries.items()
        if isinstance(e, list) and len(e) == 2 and isinstance(e[1], str)
      }

  def digest(self, path: str, version: list[int] | None = None) -> str | None:
    """`path`'s stamped digest, if `version` (by default, the file's now)
    is the one stamped; else None."""
    version = version or file_version(path)
    entry = self.entries.get(os.path.abspath(path))
    return entry[1] if version and entry and entry[0] == version else None

  def stamp(self, path: str, version: list[int], digest: str) -> None:
    self.entries[os.path.abspath(path)] = [version, digest]
    self.changed = True

  def save(self) -> None:
    """Writes the stamps if any is new, without those of files since
    changed or gone (a test's or a sweep's temporary folders); a folder's
    (`folder.digest`, its path ending in a separator) while it is there."""
    if not self.changed:
      return
    current = {
      p: e for p, e in self.entries.items()
      if e[0] == file_version(p) or p.endswith(os.sep) and os.path.isdir(p)
    }  # fmt: skip
    with contextlib.suppress(OSError):
      files.write_atomically(self.path, json.dumps(current))


def file_version(path: str) -> list[int] | None:
  """What of `path`'s stat tells the file's version (device, inode, size,
  mtime, ctime: any write changes the ctime); None if it has none."""
  try:
    s = os.stat(path)
  except OSError:
    return None
  return [s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns]
