"""A checkpoint folder that a kill or a bad disk left wrong, said in one
line and set right: newer damaged prefixes moved aside (never deleted), the
state file rewritten to name the newest complete checkpoint. Loaded only
when `resuming`'s scan finds something wrong."""

from __future__ import annotations

import logging
import os
from typing import Protocol

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UserError

LOGGER = logging.getLogger('xla_mnist.workdir.checkpointing')
_SET_ASIDE = 'damaged-'  # A damaged prefix's folder: `damaged-ckpt-<step>`.


class Scan(Protocol):
  """What `resuming`'s scan found in `directory`."""

  directory: str
  newest: int | None
  damaged: list[tuple[int, str]]  # (step, why), newer than `newest`.
  state: str  # The state file, the pointer to the latest.
  named: str | None  # What the state file names; None: no state file.

  def path(self, step: int) -> str: ...
  def files(self, step: int) -> list[str]: ...
  def point_at(self, kept: list[str]) -> None: ...


def pointer_problem(found: Scan) -> str:
  """What is wrong with the state file, '' when it names the newest."""
  state = found.state
  newest = (
    None if found.newest is None else os.path.basename(found.path(found.newest))
  )
  if found.named is None:
    return f'{state} is missing' if newest else ''
  if not found.named:
    return f'{state} names no checkpoint (empty or garbled)'
  if found.named == newest:
    return ''
  by_name = {os.path.basename(found.path(s)): s for s, _ in found.damaged}
  if found.named in by_name:
    return f'{state} names {found.named}, which is damaged'
  named = os.path.join(found.directory, found.named)
  if not os.path.exists(named + '.index'):
    return f'{state} names {found.named}, which has no files'
  return f'{state} names {found.named}, not the newest complete checkpoint'


def what_is_wrong(found: Scan) -> str:
  """The damaged prefixes and the pointer's problem, in words."""
  said = [
    f'{os.path.basename(found.path(step))} is damaged ({why})'
    for step, why in found.damaged
  ]
  return '; '.join([*said, *filter(None, [pointer_problem(found)])])


def repair(found: Scan, kept: list[str]) -> None:
  """Moves the damaged prefixes aside and rewrites the state file to name
  `kept`, and says so in one line."""
  problem = pointer_problem(found)
  try:
    said = [
      f'{os.path.basename(found.path(step))} is damaged ({why}), moved to'
      f' {_set_aside(found, step)} (delete it once you have looked)'
      for step, why in found.damaged
    ]
    if problem:
      found.point_at(kept)
      said.append(f'{problem}: it now names {kept[-1]}')
  except OSError as e:
    raise UserError(
      f'cannot repair the checkpoints in {found.directory} ({e.strerror}):'
      f' make it writable, or pass another {errors.arg("workdir", "DIR")}'
    ) from None
  LOGGER.info(
    f'note: resuming from {kept[-1]}, the newest complete checkpoint in'
    f' {found.directory}: {"; ".join(said)}'
  )


def nothing_whole(found: Scan) -> None:
  """Starting from step 0, for want of a whole checkpoint: only when none
  was damaged (those are never written over)."""
  if found.damaged:
    step, reason = found.damaged[0]
    raise UserError(
      f'checkpoint {found.path(step)} cannot be restored ({reason}) and no'
      f' older one is complete: pass {errors.arg("fresh", True)} to start'
      f' over, or another {errors.arg("workdir", "DIR")}'
    )
  if problem := pointer_problem(found):
    LOGGER.info(
      f'note: {problem}, and no checkpoint is there: starting from step 0'
    )


def _set_aside(found: Scan, step: int) -> str:
  """Moves prefix `step`'s files into a new folder `damaged-<prefix>[-k]`,
  which no sweep and no scan matches; returns the folder's path."""
  aside = os.path.join(
    found.directory, _SET_ASIDE + os.path.basename(found.path(step))
  )
  candidate, k = aside, 1
  while os.path.exists(candidate):
    candidate, k = f'{aside}-{k}', k + 1
  os.mkdir(candidate)
  for entry in found.files(step):
    os.replace(
      os.path.join(found.directory, entry), os.path.join(candidate, entry)
    )
  return candidate
