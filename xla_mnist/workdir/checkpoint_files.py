"""A checkpoint folder's files: prefixes `ckpt-<step>` and TF's state file,
the pointer to the latest, as a save writes and sweeps them (`checkpointing`)
and a resume lists them (`resuming`)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files

NAME = 'ckpt'
STATE_FILE = 'checkpoint'  # TF's name for the file naming the latest.
# The files of a checkpoint prefix, and its temp folder while TF writes it.
PREFIX_FILE = re.compile(rf'{NAME}-(\d+)(\.index|\.data-\d+-of-\d+|_temp)$')
# Left by an interrupted state-file update: TF's temp files, and ours.
_STATE_TEMP = re.compile(rf'{STATE_FILE}\.tmp[0-9a-f]+$|tmp\w+\.tmp$')


def listdir(directory: str) -> list[str]:
  """The names in `directory`, none if it does not exist yet."""
  try:
    return os.listdir(directory)
  except FileNotFoundError:
    return []
  except OSError as e:
    raise UserError(
      f'cannot read the checkpoints in {directory} ({e.strerror}): pass'
      f' another {errors.arg("workdir", "DIR")}'
    ) from None


def write_state(directory: str, kept: list[str]) -> None:
  """Atomically names `kept`'s last prefix as the latest, as TF writes it."""
  lines = [f'model_checkpoint_path: "{kept[-1]}"']
  lines += [f'all_model_checkpoint_paths: "{name}"' for name in kept]
  files.write_atomically(
    os.path.join(directory, STATE_FILE), '\n'.join(lines) + '\n'
  )


def remove_prefix(directory: str, name: str) -> None:
  """Removes what a failed save of `name` wrote: on a full disk, its space."""
  with contextlib.suppress(OSError):
    for entry in os.listdir(directory):
      match = PREFIX_FILE.match(entry)
      if match and f'{NAME}-{match.group(1)}' == name:
        _remove(os.path.join(directory, entry))


def sweep(directory: str, kept: list[str]) -> None:
  """Removes the prefixes' files that the state file does not name, and the
  temp files of interrupted writes. Moved-aside folders never match."""
  for entry in listdir(directory):
    match = PREFIX_FILE.match(entry)
    stale = match and f'{NAME}-{match.group(1)}' not in kept
    if stale or _STATE_TEMP.match(entry):
      _remove(os.path.join(directory, entry))


def _remove(path: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    if os.path.isdir(path):
      shutil.rmtree(path)
    else:
      os.remove(path)
