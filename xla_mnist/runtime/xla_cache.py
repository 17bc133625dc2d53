"""Makes TF's XLA compilation cache safe to use, or sets it aside.

The cache only saves compile time, yet TF 2.21 fails the run on its faults,
each with a traceback and again on every later run: an entry it cannot
write (a full disk, a read-only folder) fails the compile that made it, and
an entry it cannot read whole (truncated, garbage, another entry's bytes)
fails every call that would load it. So, before TF starts, `prepare` checks
the folder and its entries: an entry that is not whole is removed, a folder
TF could not write to is used read-only (TF's own flag), one that cannot be
used is skipped, each with one note. What still fails inside TF is
`cache_faults`' (loaded only then): the command removes what was loaded and
tries its training once more (new traces, new keys), unless the fault was a
write's (a disk that fills during the run): TF reads its cache flags once
per process, so only a new run, which finds the cache full and only reads
it, gets past that.

The entries are machine code that TF runs: the cache must be the user's own,
as ssh treats ~/.ssh (`_distrust`). The folder belongs to the user and no
one else can write it; each folder above it belongs to the user or root and
no one else can write it, unless it is sticky (/tmp): else the cache is not
used. An entry another user owns, a symlink, or one that others can reach
and write is removed before TF could read it. TF is given the resolved path,
so that no symlink can be swapped between the check and TF's reads. What
`prepare` creates is created 0700.

Imports no TensorFlow: the CLI prepares the cache while it reads its flags.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import stat
import tempfile
import time
from collections.abc import Collection, Iterable
from typing import BinaryIO

from xla_mnist.runtime import errors

# TF's entry: <prefix>__<signature>__<cluster>__<device>.pb, the prefix
# `xla_compile_cache` unless --tf_xla_persistent_cache_prefix says otherwise.
# TF writes it to `<entry><host>-<thread>-<pid>-<time>.tmp`, then renames
# it: a temp file left behind is from a process killed while writing.
ENTRY_NAME = r'__\d+__\d+__\w+\.pb'
_ENTRY = re.compile(rf'.*{ENTRY_NAME}')
_TEMP = re.compile(rf'.*{ENTRY_NAME}.+\.tmp')
# A temp file older than this is no live write's: a write takes well under
# a second, and a paused process (SIGSTOP, a suspended laptop) may still
# rename its own. Age, not a lock: it needs no file of ours in the folder,
# and it holds for runs on other machines sharing the folder and for other
# TF programs, which take no lock of ours.
STALE_TEMP_SECONDS = 3600
# Below this much free space the cache is read-only: TF fails the compile
# whose entry does not fit. Many times an entry of this project's programs.
MIN_FREE_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Cache:
  """How the run uses the cache: `directory` '' for not at all."""

  directory: str
  writable: bool = True
  notes: tuple[str, ...] = ()  # One line per fault found, and what it did.


def prepare(directory: str) -> Cache:
  """Checks and repairs the cache in `directory`; says how to use it."""
  if not directory:
    return Cache('')
  where = f'note: XLA cache {directory}'
  if any(c.isspace() for c in os.path.realpath(directory)):
    # TF reads the folder from TF_XLA_FLAGS, which it splits at white space:
    # the cache would silently be another folder.
    return Cache(
      '',
      notes=(
        f'{where} has white space in its path, which TF_XLA_FLAGS cannot'
        ' carry: not used; pass a folder whose path has none as'
        ' --xla_cache_dir',
      ),
    )
  if os.path.exists(directory) and not os.path.isdir(directory):
    return Cache('', notes=(f'{where} is not a folder: compiling without it',))
  try:
    _make_own(directory)
    real = os.path.realpath(directory)
    why, fix = _distrust(real)
    names = [] if why else os.listdir(real)
  except OSError as e:
    return Cache('', notes=(f'{where}: {e.strerror}: compiling without it',))
  if why:
    return Cache('', notes=(f'{where} {why}: not used; {fix}',))
  foreign = _foreign(real, names)
  if foreign and not remove(real, foreign):
    return Cache(
      '',
      notes=(
        f'{where} holds {counted(foreign, "entry")} not only yours (another'
        " user's, writable by others, or a symlink) that cannot be removed:"
        ' compiling without it; remove them',
      ),
    )
  notes = []
  if foreign:
    notes.append(
      f'{where}: removed {counted(foreign, "entry")} not only yours (another'
      " user's, writable by others, or a symlink), unread: compiling again"
    )
  return _repaired(real, where, set(names) - set(foreign), notes)


def _repaired(
  directory: str, where: str, names: set[str], notes: list[str]
) -> Cache:
  """The rest of `prepare`, in the user's own `directory`: damaged entries
  and stale temp files removed, read-only when it cannot be written."""
  unwritable = _unwritable(directory)
  damaged = [
    n for n in sorted(names) if _ENTRY.fullmatch(n) and not _whole(directory, n)
  ]
  if unwritable and damaged:
    return Cache(
      '',
      notes=(
        f'{where} holds {counted(damaged, "damaged entry")} and cannot be'
        f' written ({unwritable}): compiling without it',
      ),
    )
  stale = [] if unwritable else _stale_temps(directory, sorted(names))
  if stale:
    remove(directory, stale)
    notes.append(
      f'{where}: removed {counted(stale, "temp file")} of a killed run'
    )
  if damaged:
    remove(directory, damaged)
    notes.append(
      f'{where}: removed {counted(damaged, "damaged entry")}: compiling again'
    )
  free = _free_bytes(directory)
  if not unwritable and free < MIN_FREE_BYTES:
    unwritable = f'only {free >> 10} KiB free'
  if unwritable:
    notes.append(
      f'{where} cannot be written ({unwritable}): loading from it, storing'
      ' nothing'
    )
  return Cache(directory, writable=not unwritable, notes=tuple(notes))


def _make_own(directory: str) -> None:
  """Creates `directory` and the missing folders above it, each 0700."""
  missing = []
  path = os.path.abspath(directory)
  while not os.path.lexists(path):
    missing.append(path)
    path = os.path.dirname(path)
  for path in reversed(missing):
    with contextlib.suppress(FileExistsError):  # Another run made it.
      os.mkdir(path, 0o700)


def _distrust(real: str) -> tuple[str, str]:
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


def _foreign(directory: str, names: Iterable[str]) -> list[str]:
  """The entries of `directory` that are not only the user's: another
  user's, not a plain file (a symlink), or writable by a group or others
  that the folder lets in."""
  me = os.geteuid()
  folder = os.stat(directory).st_mode
  # Write bits that matter: those of a class the folder lets through.
  reach = (0o020 if folder & 0o010 else 0) | (0o002 if folder & 0o001 else 0)
  foreign = []
  for name in names:
    if not (_ENTRY.fullmatch(name) or _TEMP.fullmatch(name)):
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
      foreign.append(name)
  return sorted(foreign)


def entries(directory: str) -> set[str]:
  """The names of TF's entries in `directory` (none if it cannot be read)."""
  try:
    return {n for n in os.listdir(directory) if _ENTRY.fullmatch(n)}
  except OSError:
    return set()


def _unwritable(directory: str) -> str:
  """Why a file cannot be made in `directory`, or '' when it can."""
  try:
    with tempfile.TemporaryFile(dir=directory):
      return ''
  except OSError as e:
    return e.strerror or type(e).__name__


def _free_bytes(directory: str) -> int:
  stats = os.statvfs(directory)
  return stats.f_bavail * stats.f_frsize


def _stale_temps(directory: str, names: list[str]) -> list[str]:
  now = time.time()
  stale = []
  for name in names:
    if _TEMP.fullmatch(name):
      try:
        age = now - os.stat(os.path.join(directory, name)).st_mtime
      except OSError:  # Renamed by its writer since the listing.
        continue
      if age > STALE_TEMP_SECONDS:
        stale.append(name)
  return stale


def remove(directory: str, names: Iterable[str]) -> bool:
  """Removes `names` from `directory`; whether none is left."""
  left = False
  for name in names:
    # Gone already (another run removed it), or left: TF then fails on it,
    # and the command's second try traces anew, under other keys.
    try:
      os.remove(os.path.join(directory, name))
    except FileNotFoundError:
      pass
    except OSError:
      left = True
  return not left


def counted(names: Collection[str], what: str) -> str:
  """`names` counted as `what`: '1 entry', '2 entries'."""
  if len(names) == 1:
    return f'1 {what}'
  plural = what[:-1] + 'ies' if what.endswith('y') else what + 's'
  return f'{len(names)} {plural}'


def _whole(directory: str, name: str) -> bool:
  """Whether entry `name` holds what TF wrote there, as far as its framing
  can say: an XlaSerializedCacheEntry whose fields 1 (key), 2 (HLO) and 3
  (executable, not empty) fill the file exactly, in the order protobuf
  writes them, so that any truncation breaks it; and a key naming this
  file. The HLO and the executable themselves are not read.
  """
  try:
    with open(os.path.join(directory, name), 'rb') as f:
      size = os.fstat(f.fileno()).st_size
      fields = []
      key = b''
      while f.tell() < size:
        tag, length = _varint(f), _varint(f)
        if tag is None or length is None or f.tell() + length > size:
          return False
        fields.append((tag, length))
        if tag == _field_tag(1):
          key = f.read(length)
        else:
          f.seek(length, os.SEEK_CUR)
  except OSError:
    return False
  tags = [tag for tag, _ in fields]
  return (
    tags == [_field_tag(n) for n in (1, 2, 3)]
    and fields[-1][1] > 0
    and _key_name(key) == name
  )


def _field_tag(field: int) -> int:
  """The tag of a length-delimited (wire type 2) field `field`."""
  return field << 3 | 2


def _key_name(key: bytes) -> str:
  """The file name TF gives the entry of XlaSerializedCacheKey `key`, or ''
  if `key` does not parse: <prefix>__<signature>__<cluster>__<device>.pb."""
  f = io.BytesIO(key)
  found: dict[int, int | bytes] = {}
  while f.tell() < len(key):
    tag = _varint(f)
    if tag is None or tag & 7 not in (0, 2):
      return ''
    value = _varint(f)
    if value is None:
      return ''
    if tag & 7 == 2:
      value = f.read(value)
    found[tag >> 3] = value
  try:
    device, prefix = (found.get(n, b'').decode() for n in (3, 4))
  except (AttributeError, UnicodeDecodeError):  # A number, or not UTF-8.
    return ''
  numbers = [found.get(n, 0) for n in (1, 2)]
  if not all(isinstance(n, int) for n in numbers):
    return ''
  return (
    '__'.join([*([prefix] if prefix else []), *map(str, numbers), device])
    + '.pb'
  )


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
