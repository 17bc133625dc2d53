"""Results recorded by earlier runs, read back: by a run that finds its
steps done, and by compare and its tools, from `result.json` files that an
older schema may have written. Not on a training run's path: `outputs`
writes. An older file reads with defaults for what it lacks, named; its NaN
(a figure it did not measure) reads as None."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from xla_mnist.runtime import errors, layout
from xla_mnist.workdir import outputs

LOGGER = logging.getLogger(__name__)
RENAMED = {'other_seconds': 'paused_seconds'}  # Older schemas' names: now.


def load_result(path: str) -> tuple[outputs.Result, list[str]]:
  """Reads a `result.json`; returns it and the later fields it lacks.

  Raises ValueError, naming them, when it lacks any field older files have.
  """
  with open(path) as f:
    stored = outputs.finite(json.load(f))
  if not isinstance(stored, dict):
    raise ValueError(f'{path} holds no JSON object')
  for old, new in RENAMED.items():
    if old in stored:
      stored.setdefault(new, stored.pop(old))
  fields = {f.name: f for f in dataclasses.fields(outputs.Result)}
  missing = [name for name in fields if name not in stored]
  required = [
    name
    for name in missing
    if fields[name].default is dataclasses.MISSING
    and fields[name].default_factory is dataclasses.MISSING
  ]
  if required:
    raise ValueError(f'{path} lacks {", ".join(required)}')
  return outputs.Result(
    **{k: v for k, v in stored.items() if k in fields}
  ), missing


def read_result(workdir: str) -> outputs.Result | None:
  """The `result.json` of a finished run in `workdir`, if it has one; a
  line says which fields an older file lacks, or why it is unreadable."""
  path = os.path.join(workdir, outputs.RESULT_FILE)
  try:
    result, missing = load_result(path)
  except FileNotFoundError:
    return None
  except (OSError, ValueError, TypeError) as e:
    LOGGER.info(
      f'note: {path} is unreadable ({e}): the run counts as unfinished'
    )
    return None
  if missing:
    LOGGER.info(
      f'note: {path} is schema {result.schema_version} (now'
      f' {outputs.SCHEMA_VERSION}): it has no {", ".join(missing)}'
    )
  return result


def finished(workdir: str, start: int, end: int) -> outputs.Result | None:
  """The stored result of the run whose newest checkpoint, of step `start`,
  is at or past `end`; None, with a note, when `result.json` is not that
  run's: the restored model is then evaluated, its speed not measured."""
  previous = read_result(workdir)
  if previous and previous.steps == start:  # Not an earlier run's.
    return previous
  checkpoints = os.path.join(workdir, layout.CHECKPOINT_DIR)
  LOGGER.info(
    f'note: {checkpoints} holds step {start} of {end}'
    f'{" asked" * (start > end)} but no {outputs.RESULT_FILE} of it:'
    ' evaluating the restored model; its speed was not measured'
  )
  return None


def finished_line(result: outputs.Result, workdir: str, num_steps: int) -> str:
  """What a run found finished says of its workdir, after its result."""
  held = result.steps
  if held == num_steps:
    return (
      f'{workdir} holds this finished run ({held} steps), left as it is:'
      f' pass {errors.arg("fresh", True)} to train again'
    )
  return (
    f'{workdir} holds a finished run of {held} steps, more than'
    f' {errors.field("num_steps", num_steps)} asks: the result above is'
    f" that run's, left as it is; pass {errors.arg('fresh', True)} to train"
    f' {num_steps} steps instead, or another'
    f' {errors.arg("workdir", "DIR")}'
  )
