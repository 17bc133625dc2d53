"""Resuming from a checkpoint folder: the newest prefix whose every value
reads back with its checksum (whatever the pointer says), refused unless its
fingerprint is this run's recipe, then restored. Loaded only for a folder
that holds something: a new run's has nothing to resume."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import tensorflow as tf

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import DataError, UsageError
from xla_mnist.workdir import files
from xla_mnist.workdir.checkpoint_files import (
  NAME,
  PREFIX_FILE,
  STATE_FILE,
  listdir,
  write_state,
)

# Where `checkpointing.Checkpointer` keeps the fingerprint in a checkpoint.
_FINGERPRINT_KEY = 'fingerprint/.ATTRIBUTES/VARIABLE_VALUE'


def restore_newest(
  checkpoint: tf.train.Checkpoint,
  fingerprint: dict[str, str | int | float],
  directory: str,
  keep: int,
  owner: bool,
) -> list[str]:
  """Restores into `checkpoint` the newest whole checkpoint in `directory`,
  if any, refused unless made with `fingerprint`; returns the prefixes a
  save keeps. Only the `owner`, who saves there, repairs a folder found
  wrong."""
  found = Scan(directory)
  kept = found.kept(keep) if owner else []
  if found.wrong:
    from xla_mnist.workdir import checkpoint_repair  # noqa: PLC0415 - rare.
  if found.newest is None:
    if found.wrong:
      checkpoint_repair.nothing_whole(found)
    return kept
  path = found.path(found.newest)
  with restoring(path):
    stored = stored_fingerprint(path)
    # A group's field (`optimizer_args.X`) that one of the two lacks is
    # unset there (None): set now or then only, it differs.
    unset = {k: None for k in (*stored, *fingerprint) if '.' in k}
    check_compatible(
      stored | {k: v for k, v in unset.items() if k not in stored},
      fingerprint | {k: v for k, v in unset.items() if k not in fingerprint},
      directory,
    )
    # `assert_consumed` is the check. `expect_partial` only silences TF's
    # own report at interpreter exit, which crashes with a traceback there.
    status = checkpoint.restore(literal(path))
    status.expect_partial().assert_consumed()
  if owner and found.wrong:
    checkpoint_repair.repair(found, kept)
  return kept


class Scan:
  """What a checkpoint folder holds: the newest prefix whose every value
  reads back with its checksum, the newer damaged ones, and the pointer."""

  def __init__(self, directory: str):
    self.directory = directory
    self.state = os.path.join(directory, STATE_FILE)
    matches = [PREFIX_FILE.match(n) for n in listdir(directory)]
    found = {int(m.group(1)) for m in matches if m and m.group(2) != '_temp'}
    steps = sorted(found, reverse=True)
    self.newest: int | None = None
    self.damaged: list[tuple[int, str]] = []  # Newer than `newest`.
    for step in steps:
      if (reason := _damage(self.path(step))) is None:
        self.newest = step
        break
      self.damaged.append((step, reason))
    self._whole = steps[len(self.damaged) :]  # `newest` and older.
    self.named = self._named()
    newest = None if self.newest is None else f'{NAME}-{self.newest}'
    # Damaged prefixes, or a pointer that names anything but the newest.
    self.wrong = bool(self.damaged) or self.named != newest

  def path(self, step: int) -> str:
    return os.path.join(self.directory, f'{NAME}-{step}')

  def kept(self, keep: int) -> list[str]:
    """The prefixes a repaired state file names, oldest first."""
    return [f'{NAME}-{s}' for s in sorted(self._whole)[-keep:]]

  def files(self, step: int) -> list[str]:
    """The names of prefix `step`'s files (and temp folder) here."""
    return [
      n
      for n in listdir(self.directory)
      if (m := PREFIX_FILE.match(n)) and int(m.group(1)) == step
    ]

  def point_at(self, kept: list[str]) -> None:
    write_state(self.directory, kept)

  def _named(self) -> str | None:
    """The prefix the state file names; '' if it names none (empty or
    garbled), None if there is no state file."""
    if not os.path.exists(self.state):
      return None
    try:
      state = tf.train.get_checkpoint_state(
        files.tf_path(self.directory, 'workdir')
      )
    except ValueError:  # It parses, but names no checkpoint (say, empty).
      state = None
    return os.path.basename(state.model_checkpoint_path) if state else ''


def literal(prefix: str) -> str:
  """`prefix` as a path TF's glob matches only literally, and TF takes at
  all (a workdir whose name is not UTF-8): see `files.tf_path`."""
  return files.tf_path(prefix, 'workdir', literal=True)


def _damage(prefix: str) -> str | None:
  """Why checkpoint `prefix` cannot be restored, None if every value reads
  back whole (TF checks each value's checksum as it reads it)."""
  if not os.path.exists(prefix + '.index'):
    return 'its .index file is missing'
  try:
    reader = tf.train.load_checkpoint(literal(prefix))
    for key in reader.get_variable_to_shape_map():
      reader.get_tensor(key)
  # TF reports a damaged file as any of these (IndexError when truncated).
  except (tf.errors.OpError, IndexError, ValueError) as e:
    return errors.first_line(e)
  return None


def check_compatible(
  stored: dict[str, str | int | float],
  expected: dict[str, str | int | float],
  directory: str,
  fix: str = '',
) -> None:
  """UsageError naming the first field the checkpoint disagrees on; `fix`
  replaces a resume's way out."""
  for field, value in expected.items():
    if field in stored and stored[field] == value:
      continue
    held = (
      f'a run with {field} {stored[field]!r}'
      if field in stored
      else f'a checkpoint written before checkpoints recorded {field}'
    )
    raise UsageError(
      f'{directory} holds {held}, this config has {value!r}: '
      + (
        fix
        or f'pass {errors.arg("fresh", True)} to replace that run, or'
        f' another {errors.arg("workdir", "DIR")}'
      )
    )


def stored_fingerprint(path: str) -> dict[str, str | int | float]:
  reader = tf.train.load_checkpoint(literal(path))
  return json.loads(reader.get_tensor(_FINGERPRINT_KEY))


@contextlib.contextmanager
def restoring(path: str, fix: str = '') -> Iterator[None]:
  """TF's ways of reporting a damaged checkpoint, as one line to act on."""
  try:
    yield
  # TF reports a damaged file as any of these (IndexError when truncated,
  # NotFoundError without a fingerprint; json a fingerprint that is not).
  except (tf.errors.OpError, IndexError, ValueError, AssertionError) as e:
    fix = fix or (
      f'pass {errors.arg("fresh", True)} to start over, or another'
      f' {errors.arg("workdir", "DIR")}'
    )
    raise DataError(
      f'checkpoint {path} cannot be restored ({errors.first_line(e)}): {fix}'
    ) from None
