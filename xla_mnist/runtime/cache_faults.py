"""What to make of TF's XLA cache failing inside a run, and what to remove.

`xla_cache.prepare` removes what it can see is wrong before TF starts; what
still fails inside TF comes here, loaded only then: `is_fault` tells the
cache's faults from the run's own, and `after` decides: a second try with a
note, or one line that ends the run. `reason` says a fault in a line,
`forget_loaded` removes what a read fault may have come from, and
`is_write_fault` tells the fault that only a new run gets past (a disk that
fills during the run: TF reads its cache flags once per process).
"""

from __future__ import annotations

import re

from xla_mnist.runtime import errors, xla_cache

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
  xla_cache.remove(directory, sorted(loaded))
  return f'removed {xla_cache.counted(loaded, "entry")} it held'


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
