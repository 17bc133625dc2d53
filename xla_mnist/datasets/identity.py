"""What a prepared dataset is tied to: the digest of its exact source.

Every run names its IDX source by the files' contents and checks that the
dataset prepared under that name is the source's (the manifest its
preparation wrote, the digests of the arrays it yields). Defined here, apart
from `idx_builder`, so that a run whose data is prepared checks it without
loading what reads IDX files and writes records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable

import numpy as np

from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import DataError

# Our own version of what is prepared from a source (the records, the
# manifest, the arrays files): part of every digest, so changing the format
# prepares anew instead of trusting files of the old one.
FORMAT_VERSION = 1
MANIFEST = 'xla_mnist-source.json'  # In the prepared folder.

FILES = layout.IDX_FILES


def check_folder(
  folder: str, names: list[str] | None = None, other: str = ''
) -> None:
  """DataError naming the IDX files (all four by default) `folder` lacks,
  and the caller's fix: put the files it reads there, or `other` (by
  default, training's: point config.idx_dir at the folder that holds them).
  """
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


def locate(folder: str, name: str) -> str | None:
  """The path of `name` in `folder`, gzipped or not; None if neither."""
  for candidate in (name, name.removesuffix('.gz')):
    path = os.path.join(folder, candidate)
    if os.path.isfile(path):
      return path
  return None


@dataclasses.dataclass(frozen=True)
class SourceFile:
  path: str
  size: int
  mtime_ns: int  # Recorded for people; the key is the content's hash.
  sha256: str  # Of the file's bytes as stored (gzipped or not).


@dataclasses.dataclass(frozen=True)
class Source:
  """The exact IDX files a dataset is prepared from."""

  folder: str
  files: tuple[SourceFile, ...]  # In the order of `FILES`.
  digest: str  # sha256 of FORMAT_VERSION and the files' names and hashes.


def identify(
  folder: str, hashed: Callable[[str], tuple[int, int, str]]
) -> Source:
  """Hashes the four IDX files of `folder`: DataError if one is missing.

  By content, not by size and mtime: a copy that kept the mtime (cp -p,
  rsync -t) but not the bytes must not pass for the old files, and a
  touched file with the same bytes needs no new preparation. `hashed`
  gives a file's size, mtime and sha256 (`idx_builder.hash_file`, which
  checks its header first; or what an earlier hash of the same, unchanged
  file gave). The files' paths are absolute, as `read_split` finds them
  from the source's folder: a relative one would never match (issue 39).
  """
  folder = os.path.abspath(folder)
  check_folder(folder)
  found = []
  for name in (name for pair in FILES.values() for name in pair):
    path = locate(folder, name)
    found.append(SourceFile(path, *hashed(path)))
  lines = [f'xla_mnist idx source {FORMAT_VERSION}']
  lines += [f'{os.path.basename(f.path)} {f.sha256}' for f in found]
  digest = hashlib.sha256('\n'.join(lines).encode()).hexdigest()
  return Source(folder, tuple(found), digest)


def arrays_digest(images: np.ndarray, labels: np.ndarray) -> str:
  """sha256 of a split as loaded: uint8 images and int64 labels, and shapes.

  What a prepared split or an arrays file must hash to, to be used.
  """
  h = hashlib.sha256(f'{FORMAT_VERSION} {images.shape}'.encode())
  h.update(np.ascontiguousarray(images, np.uint8))
  h.update(np.ascontiguousarray(labels, '<i8'))
  return h.hexdigest()


def read_manifest(prepared_dir: str) -> dict | None:
  """The manifest of a prepared folder; None if missing or not whole."""
  try:
    with open(os.path.join(prepared_dir, MANIFEST)) as f:
      manifest = json.load(f)
    digests = [manifest['source'], *(manifest['arrays'][s] for s in FILES)]
  # Missing, cut, not JSON, or JSON of another shape.
  except (OSError, ValueError, KeyError, TypeError):
    return None
  return manifest if all(isinstance(d, str) for d in digests) else None
