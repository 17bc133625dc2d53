"""Makes TF's XLA compilation cache safe to use, or sets it aside.

The cache only saves compile time, yet TF 2.21 fails the run on its faults,
each with a traceback and again on every later run: an entry it cannot
write fails the compile that made it, and an entry it cannot read whole
fails every call that would load it. So, before TF starts, `prepare` checks
the folder and its entries and hands TF one that needs nothing as it is;
the rest (a folder to make, repair, read only or skip) is `cache_faults`',
loaded only then (docs/resume.md, "The XLA cache").

The entries are machine code that TF runs, so the cache must be the user's
own (`distrust`, `foreign`; the rule: docs/resume.md). TF gets the resolved
path: no symlink can be swapped between the check and TF. Imports no
TensorFlow: the CLI prepares the cache while it reads its flags.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from typing import BinaryIO

from xla_mnist.runtime import errors

# TF's entry: <prefix>__<signature>__<cluster>__<device>.pb, the prefix
# `xla_compile_cache` unless --tf_xla_persistent_cache_prefix says otherwise.
# TF writes it to `<entry><host>-<thread>-<pid>-<time>.tmp`, then renames
# it: a temp file is a live write's, or left by a process killed writing.
ENTRY_NAME = r'__\d+__\d+__\w+\.pb'
ENTRY = re.compile(rf'.*{ENTRY_NAME}')
TEMP = re.compile(rf'.*{ENTRY_NAME}.+\.tmp')
# Below this much free space the cache is read-only: TF fails the compile
# whose entry does not fit. Many times an entry of this project's programs.
MIN_FREE_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Cache:
  """How the run uses the cache: `directory` '' for not at all."""

  directory: str
  writable: bool = True
  notes: tuple[str, ...] = ()  # One line per fault found, and what it did.


def sound(directory: str) -> Cache | None:
  """The cache in `directory` as TF may use it as it is ('': none); None
  when it is not sound (`cache_faults.repaired` sets it right)."""
  if not directory:
    return Cache('')
  real = os.path.realpath(directory)
  with contextlib.suppress(OSError):  # Missing, or not a folder.
    if _sound(real):
      return Cache(real)
  return None


def _sound(real: str) -> bool:
  """Whether the folder `real` can go to TF as it is: a path TF_XLA_FLAGS
  can carry (no white space), the user's own, its entries only theirs and
  whole, no temp file (a killed run's?), and room to store more."""
  if any(c.isspace() for c in real) or distrust(real)[0]:
    return False
  names = os.listdir(real)
  return (
    not foreign(real, names)
    and not any(TEMP.fullmatch(n) for n in names)
    and all(whole(real, n) for n in names if ENTRY.fullmatch(n))
    and not unwritable(real)
    and free_bytes(real) >= MIN_FREE_BYTES
  )


def distrust(real: str) -> tuple[str, str]:
  """Why the resolved folder `real` is not the user's own to run code
  from, and the fix; ('', '') when it is."""
  me = os.geteuid()
  info = os.stat(real)
  elsewhere = f'pass a folder of yours as {errors.arg("xla_cache_dir")}'
  if info.st_uid != me:
    return f'belongs to another user (uid {info.st_uid})', elsewhere
  if info.st_mode & 0o022:
    return (
      f'can be written by others (mode {stat.S_IMODE(info.st_mode):04o})',
      f'make it yours alone (chmod go-w), or {elsewhere}',
    )
  above = os.path.dirname(real)
  while True:
    info = os.stat(above)
    if info.st_uid not in (me, 0):
      return (
        f'is in {above}, which belongs to another user (uid {info.st_uid})',
        elsewhere,
      )
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
      return f'is in {above}, which others can write', elsewhere
    if above == os.path.dirname(above):
      return '', ''
    above = os.path.dirname(above)


def foreign(directory: str, names: Iterable[str]) -> list[str]:
  """The entries and temp files of `directory` that are not only the
  user's: another user's, not a plain file (a symlink), or writable by a
  group or others that the folder lets in."""
  me = os.geteuid()
  folder = os.stat(directory).st_mode
  # Write bits that matter: those of a class the folder lets through.
  reach = (0o020 if folder & 0o010 else 0) | (0o002 if folder & 0o001 else 0)
  found = []
  for name in names:
    if not (ENTRY.fullmatch(name) or TEMP.fullmatch(name)):
      continue
    try:
      info = os.lstat(os.path.join(directory, name))
    except OSError:  # Gone since the listing.
      continue
    if (
      not stat.S_ISREG(info.st_mode)
      or info.st_uid != me
      or info.st_mode & reach
    ):
      found.append(name)
  return sorted(found)


def entries(directory: str) -> set[str]:
  """The names of TF's entries in `directory` (none if it cannot be read)."""
  try:
    return {n for n in os.listdir(directory) if ENTRY.fullmatch(n)}
  except OSError:
    return set()


def unwritable(directory: str) -> str:
  """Why a file cannot be made in `directory`, or '' when it can."""
  try:
    with tempfile.TemporaryFile(dir=directory):
      return ''
  except OSError as e:
    return e.strerror or type(e).__name__


def free_bytes(directory: str) -> int:
  stats = os.statvfs(directory)
  return stats.f_bavail * stats.f_frsize


def whole(directory: str, name: str) -> bool:
  """Whether entry `name` holds what TF wrote there, as far as its framing
  can say: an XlaSerializedCacheEntry whose fields 1 (key), 2 (HLO) and 3
  (executable, not empty) fill the file exactly in protobuf's order, so any
  truncation breaks it, and whose key names this file. The HLO and the
  executable are not read."""
  try:
    with open(os.path.join(directory, name), 'rb') as f:
      size, key = os.fstat(f.fileno()).st_size, b''
      for field in (1, 2, 3):
        tag, length = _varint(f), _varint(f)
        # The field, in its place, length-delimited (wire type 2), in the file.
        if tag != field << 3 | 2 or length is None or f.tell() + length > size:
          return False
        if field == 1:
          key = f.read(length)
        else:
          f.seek(length, os.SEEK_CUR)
      return length > 0 and f.tell() == size and _key_name(key) == name
  except OSError:
    return False


def _key_name(key: bytes) -> str:
  """The file name TF gives the entry of XlaSerializedCacheKey `key`, or ''
  if `key` does not parse: <prefix>__<signature>__<cluster>__<device>.pb."""
  f = io.BytesIO(key)
  found: dict[int, int | bytes] = {}
  while f.tell() < len(key):
    tag, value = _varint(f), _varint(f)
    if tag is None or value is None or tag & 7 not in (0, 2):
      return ''
    found[tag >> 3] = f.read(value) if tag & 7 == 2 else value
  try:  # Numbers 1 and 2, texts 3 and 4 in UTF-8: else ''.
    numbers = [f'{found.get(n, 0):d}' for n in (1, 2)]
    device, prefix = (found.get(n, b'').decode() for n in (3, 4))
  except (AttributeError, TypeError, UnicodeDecodeError):
    return ''
  return '__'.join([*([prefix] if prefix else []), *numbers, device]) + '.pb'


def _varint(f: BinaryIO) -> int | None:
  """Protobuf's base-128 integer at `f`'s position; None if cut short."""
  value = 0
  for shift in range(0, 70, 7):
    byte = f.read(1)
    if not byte:
      return None
    value |= (byte[0] & 0x7F) << shift
    if byte[0] < 0x80:
      return value
  return None
