"""What to do about an XLA cache that is not sound, loaded only then.

Before TF starts, `process.xla_cache_in` hands TF a cache that needs nothing;
anything else comes to `repaired`, which says what it found in one note
each: a folder to make (0700), one not the user's own or unusable (set
aside), entries not only the user's, damaged or left by a killed run
(removed), a folder TF could not store in (read-only, TF's own flag).

What still fails inside TF comes to `after`: `is_fault` tells the cache's
faults from the run's own, and `after` decides: a second try with a note
(the entries that were there removed: `forget_loaded`), or one line that
ends the run. `reason` says a fault in a line, and `is_write_fault` tells
the fault only a new run gets past (a disk that fills during the run: TF
reads its cache flags once per process, so only a new run, which finds the
cache full and only reads it, gets past that).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Collection, Iterable

from xla_mnist.runtime import errors, xla_cache
from xla_mnist.runtime.xla_cache import Cache

_NAMED = re.compile(xla_cache.ENTRY_NAME)  # In a message of TF's.
# A 'Graph execution error:' line of one device's cause: '(0) INTERNAL: '.
_DEVICE_ERROR = re.compile(r'^\(\d+\) [A-Z_]+: ')
# Errors of TF's cache whose message names no file (device_executable_
# persistor.h): an entry whole but not of the program that asked for it.
_TF_FAULTS = (
  'Serialized cache key does not match',
  'Serialized HLO does not match',
  'No binary found in serialized entry',
)
# A temp file older than this is no live write's: a write takes well under
# a second, and a paused process (SIGSTOP, a suspended laptop) may still
# rename its own. Age, not a lock: it needs no file of ours in the folder,
# and it holds for runs on other machines sharing the folder and for other
# TF programs, which take no lock of ours.
STALE_TEMP_SECONDS = 3600


def repaired(directory: str) -> Cache:
  """`process.xla_cache_in` for a cache that is not sound as it is: makes,
  repairs or sets aside the one in `directory`, with a note for each fault."""
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
    why, fix = xla_cache.distrust(real)
    names = [] if why else os.listdir(real)
  except OSError as e:
    return Cache('', notes=(f'{where}: {e.strerror}: compiling without it',))
  if why:
    return Cache('', notes=(f'{where} {why}: not used; {fix}',))
  foreign = xla_cache.foreign(real, names)
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
  return _cleaned(real, where, set(names) - set(foreign), notes)


def _cleaned(
  directory: str, where: str, names: set[str], notes: list[str]
) -> Cache:
  """The rest of `repaired`, in the user's own `directory`: damaged entries
  and stale temp files removed, read-only when it cannot be written."""
  unwritable = xla_cache.unwritable(directory)
  damaged = [
    n
    for n in sorted(names)
    if xla_cache.ENTRY.fullmatch(n) and not xla_cache.whole(directory, n)
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
  free = xla_cache.free_bytes(directory)
  if not unwritable and free < xla_cache.MIN_FREE_BYTES:
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


def _stale_temps(directory: str, names: list[str]) -> list[str]:
  now = time.time()
  stale = []
  for name in names:
    if xla_cache.TEMP.fullmatch(name):
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


def is_fault(error: BaseException) -> bool:
  """Whether TF's `error` came from its cache: it names an entry or its
  temp file, or is one of the faults of an entry whose name it omits."""
  return _names_fault(str(error))


def after(
  fault: BaseException,
  directory: str,
  loaded: set[str],
  *,
  trained: bool,
  workers: bool,
  first_try: bool,
) -> str:
  """The note of a second try past `fault`, or the UserError that ends the
  run where a second try cannot get past it.

  `trained`: the run's last checkpoint is of its last step, so the fault
  came after training (evaluation, the report): tried again, the run would
  find its steps done and report a loss it never measured. `loaded`: the
  entries there before the run (`xla_cache.entries`).
  """
  why = reason(fault)
  without = f'{errors.arg("xla_cache_dir", "")} compiles without the cache'
  if trained:
    raise errors.UserError(
      f'XLA cache {directory} failed in TF after training ({why}): the'
      f' checkpoint is saved; train again with {errors.arg("fresh", True)}'
      f' ({without})'
    )
  removed = forget_loaded(fault, directory, loaded)
  failed = f'XLA cache {directory} failed in TF ({why})'
  failed += f': {removed};' if removed else ':'
  # A load TF refused fails that program for the whole process, but a second
  # try traces its programs anew, under keys of their own. TF reads its cache
  # flags once per process and fails every compile it cannot store: past a
  # write fault only a new run goes, which finds the cache full or read-only
  # and only reads it. Workers end together: one trying again alone would
  # look lost to the others.
  if first_try and not (workers or is_write_fault(fault)):
    return f'note: {failed} training again, compiling anew'
  raise errors.UserError(
    f'{failed} run the same command{" on every worker" * workers} again'
    f' ({without}): {"they" if workers else "it will"} resume from the last'
    ' checkpoint'
  )


def is_write_fault(error: BaseException) -> bool:
  """Whether TF's cache `error` came from storing an entry: its message
  names the temp file TF writes before renaming it."""
  return '.tmp' in str(error)


def forget_loaded(
  error: BaseException, directory: str, loaded: set[str]
) -> str:
  """Removes what a read fault may have come from; says what it removed.

  A fault in reading an entry that looked whole would come back in every
  later run, and TF does not say which entry it was: the entries that were
  there to load (`loaded`, `xla_cache.entries` before the run) are removed,
  to be compiled and stored again. Returns '' when there was nothing to
  remove or the fault was a write's.
  """
  if is_write_fault(error) or not loaded:
    return ''
  remove(directory, sorted(loaded))
  return f'removed {counted(loaded, "entry")} it held'


def reason(error: BaseException) -> str:
  """What went wrong, from TF's message: 'PATH; No space left on device
  [Op:NAME]' says 'No space left on device'. A function's 'Graph execution
  error:' (as a strategy's step raises it) holds one cause per failed
  device, each '(N) KIND: text', among lines that name nodes and count
  derived errors: the first that names the cache's fault is the one."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  line = next((line for line in lines if _names_fault(line)), lines[0])
  line = _DEVICE_ERROR.sub('', line)
  return line.split(' [Op:')[0].rsplit('; ', 1)[-1].strip()


def _names_fault(message: str) -> bool:
  return bool(_NAMED.search(message)) or any(
    fault in message for fault in _TF_FAULTS
  )
