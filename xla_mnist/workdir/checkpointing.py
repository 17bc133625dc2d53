"""Checkpoints that let an interrupted run resume exactly where it stopped.

Kill-safety is the write order: a save writes prefix `ckpt-<step>`, then
atomically replaces the pointer (TF's `checkpoint` state file), then sweeps
what nothing names. A resume trusts the checksums, not the pointer, and moves
a damaged prefix aside, never deleting it. The keeping is ours, not
`tf.train.CheckpointManager`'s (docs/resume.md says why).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
from collections.abc import Iterator

import ml_collections
import tensorflow as tf

from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import DataError, UsageError, UserError
from xla_mnist.workdir import files, reporting

LOGGER = logging.getLogger(__name__)
CHECKPOINT_DIR = layout.CHECKPOINT_DIR
_NAME = 'ckpt'
_STATE_FILE = 'checkpoint'  # TF's name for the file naming the latest.
# The files of a checkpoint prefix, and its temp folder while TF writes it.
_PREFIX_FILE = re.compile(rf'{_NAME}-(\d+)(\.index|\.data-\d+-of-\d+|_temp)$')
# Left by an interrupted state-file update: TF's temp files, and ours.
_STATE_TEMP = re.compile(rf'{_STATE_FILE}\.tmp[0-9a-f]+$|tmp\w+\.tmp$')
# Where the fingerprint lives in a checkpoint.
_FINGERPRINT_KEY = 'fingerprint/.ATTRIBUTES/VARIABLE_VALUE'
# An unnamed layer's number in a variable's path: `dense_2/` or `dense_2:`.
_LAYER_NUMBER = re.compile(r'_\d+(?=[/:])')


def fingerprint(
  model: tf.keras.Model,
  config: ml_collections.ConfigDict,
  device: str,
  data: dict[str, str | int],
) -> dict[str, str | int | float]:
  """The fields a checkpoint's weights are valid for only, each changing the
  trajectory bit for bit (docs/resume.md, "What a resume may change"); also
  `model_name`, as a user's factory may change its maths and keep its shapes,
  and `precision`, as the same weights trained in bfloat16 are another run."""
  return {
    'model_name': config.model,  # Named first: the line names the change.
    'model': shapes(model),
    'precision': model.dtype_policy.name,
    **recipe(config),
    'device': device,
    'cpu_threads': config.cpu_threads or len(os.sched_getaffinity(0)),
    **data,  # Its digest, image shape and class count (`data_facts`).
  }


def data_facts(digest: str, image_shape: tuple, num_classes: int) -> dict:
  """The data's part of the fingerprint: a model is rebuilt from it."""
  shape = 'x'.join(map(str, image_shape))
  return {'data': digest, 'image_shape': shape, 'num_classes': num_classes}


def shapes(model: tf.keras.Model) -> str:
  """Every variable's path and shape (`mlp/hidden1/kernel:784x300`), less
  the numbers Keras gives unnamed layers (`dense_2`): they count what the
  process built before, so they differ from one process to the next."""
  every = (f'{v.path}:{"x".join(map(str, v.shape))}' for v in model.variables)
  return _LAYER_NUMBER.sub('', ' '.join(every))


def recipe(config: ml_collections.ConfigDict) -> dict[str, str | int | float]:
  """The config fields that change the trajectory."""
  return {
    'dataset': config.dataset,
    'batch_size': config.batch_size,
    'seed': config.seed,
    'learning_rate': config.learning_rate,
    'jit': config.jit,
  }


class Checkpointer:
  """Saves into `save_workdir`, restores from `restore_workdir`: a worker
  that keeps no outputs saves (a collective) into scratch and restores the
  chief's. Only the process that saves into a folder repairs it."""

  def __init__(
    self,
    save_workdir: str,
    restore_workdir: str,
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    config: ml_collections.ConfigDict,
    device: str,
    data: dict[str, str | int],
  ):
    self.directory = os.path.join(save_workdir, CHECKPOINT_DIR)
    # The checkpoints users should see.
    self.restore_directory = os.path.join(restore_workdir, CHECKPOINT_DIR)
    self._keep = config.keep_checkpoints
    self._fingerprint = fingerprint(model, config, device, data)
    with tf.device('/cpu:0'):  # A string variable cannot live on a GPU.
      self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
      self._loss = tf.Variable(math.nan, dtype=tf.float32, trainable=False)
      stored = tf.Variable(json.dumps(self._fingerprint), trainable=False)
    # Keras keeps its layers' random seeds (Dropout's) in `variables` only,
    # which its own checkpoint tracking leaves out.
    weights = {id(v) for v in model.weights}
    state = [v for v in model.variables if id(v) not in weights]
    self._checkpoint = tf.train.Checkpoint(
      model=model,
      optimizer=optimizer,
      step=self._step,
      loss=self._loss,
      fingerprint=stored,
      **({'model_state': state} if state else {}),
    )
    # Made now, so that every save holds it: `restore` makes it, and its
    # `assert_consumed` wants every object it finds in the checkpoint.
    self._checkpoint.save_counter  # noqa: B018
    self._saved_step = 0  # The step of the latest checkpoint on disk.
    self._kept: list[str] | None = None  # Prefixes the state file names.
    self._replace_old = False
    self.restored_loss: float | None = None  # The restored last loss.

  def restore(self, fresh: bool) -> int:
    """The step of the newest whole checkpoint, restored (0: none, or
    `fresh`, whose old checkpoints stay until this run's first save, so a
    fresh run that fails early loses nothing)."""
    owner = os.path.abspath(self.directory) == os.path.abspath(
      self.restore_directory
    )
    if fresh:
      self._replace_old, self._kept = True, []
      return 0
    found = Scan(self.restore_directory)
    self._kept = found.kept(self._keep) if owner else []
    if found.wrong:
      from xla_mnist.workdir import checkpoint_repair  # noqa: PLC0415 - rare.
    if found.newest is None:
      if found.wrong:
        checkpoint_repair.nothing_whole(found)
      return 0
    path = found.path(found.newest)
    with restoring(path):
      check_compatible(
        stored_fingerprint(path), self._fingerprint, self.restore_directory
      )
      # `assert_consumed` is the check. `expect_partial` only silences TF's
      # own report at interpreter exit, which crashes with a traceback there.
      status = self._checkpoint.restore(literal(path))
      status.expect_partial().assert_consumed()
    if owner and found.wrong:
      checkpoint_repair.repair(found, self._kept)
    self._saved_step = int(self._step)
    loss = float(self._loss)
    self.restored_loss = loss if math.isfinite(loss) else None
    return self._saved_step

  def save_with_events(
    self, step: int, loss: float, events: reporting.Reporter
  ) -> None:
    """Flushes the events first, so a run killed after a save resumes with
    no gap in TensorBoard; a fresh run's first save drops the old events."""
    events.flush()
    replaces_old = self._replace_old
    self.save(step, loss)
    if replaces_old:
      events.discard_earlier_runs()

  def save(self, step: int, loss: float | None = None) -> str:
    """Saves the state after `step`, returns its prefix; a failed save
    removes what it wrote and leaves the earlier checkpoints as they were."""
    if self._kept is None:
      raise RuntimeError('restore() first: a save replaces what it found')
    name = f'{_NAME}-{step}'
    path = os.path.join(self.directory, name)
    if step == self._saved_step and self._kept and not self._replace_old:
      # Already saved; rewriting the latest prefix in place is not kill-safe.
      return os.path.join(self.directory, self._kept[-1])
    existed = os.path.exists(path + '.index')
    self._step.assign(step)
    self._loss.assign(math.nan if loss is None else loss)
    try:
      os.makedirs(self.directory, exist_ok=True)
      self._checkpoint.write(files.tf_path(path, 'workdir'))
      kept = [*[n for n in self._kept if n != name], name][-self._keep :]
      _write_state(self.directory, kept)
    except (tf.errors.OpError, OSError) as e:
      if not existed:
        _remove_prefix(self.directory, name)
      raise UserError(
        f'cannot save a checkpoint in {self.directory}'
        f' ({errors.first_line(e)}): free'
        f' space there, or pass another {errors.arg("workdir", "DIR")}'
      ) from None
    self._kept = kept
    self._replace_old = False
    _sweep(self.directory, self._kept)
    self._saved_step = step
    return path


class Scan:
  """What a checkpoint folder holds: the newest prefix whose every value
  reads back with its checksum, the newer damaged ones, and the pointer."""

  def __init__(self, directory: str):
    self.directory = directory
    self.state = os.path.join(directory, _STATE_FILE)  # The pointer.
    matches = [_PREFIX_FILE.match(n) for n in _listdir(directory)]
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
    newest = None if self.newest is None else f'{_NAME}-{self.newest}'
    # Damaged prefixes, or a pointer that names anything but the newest.
    self.wrong = bool(self.damaged) or self.named != newest

  def path(self, step: int) -> str:
    return os.path.join(self.directory, f'{_NAME}-{step}')

  def kept(self, keep: int) -> list[str]:
    """The prefixes a repaired state file names, oldest first."""
    return [f'{_NAME}-{s}' for s in sorted(self._whole)[-keep:]]

  def files(self, step: int) -> list[str]:
    """The names of prefix `step`'s files (and temp folder) here."""
    return [
      n
      for n in _listdir(self.directory)
      if (m := _PREFIX_FILE.match(n)) and int(m.group(1)) == step
    ]

  def point_at(self, kept: list[str]) -> None:
    _write_state(self.directory, kept)

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


def _listdir(directory: str) -> list[str]:
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


def _write_state(directory: str, kept: list[str]) -> None:
  """Atomically names `kept`'s last prefix as the latest, as TF writes it."""
  lines = [f'model_checkpoint_path: "{kept[-1]}"']
  lines += [f'all_model_checkpoint_paths: "{name}"' for name in kept]
  files.write_atomically(
    os.path.join(directory, _STATE_FILE), '\n'.join(lines) + '\n'
  )


def _remove_prefix(directory: str, name: str) -> None:
  """Removes what a failed save of `name` wrote: on a full disk, its space."""
  with contextlib.suppress(OSError):
    for entry in os.listdir(directory):
      match = _PREFIX_FILE.match(entry)
      if match and f'{_NAME}-{match.group(1)}' == name:
        _remove(os.path.join(directory, entry))


def _sweep(directory: str, kept: list[str]) -> None:
  """Removes the prefixes' files that the state file does not name, and the
  temp files of interrupted writes. Moved-aside folders never match."""
  for entry in _listdir(directory):
    match = _PREFIX_FILE.match(entry)
    stale = match and f'{_NAME}-{match.group(1)}' not in kept
    if stale or _STATE_TEMP.match(entry):
      _remove(os.path.join(directory, entry))


def _remove(path: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    if os.path.isdir(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


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


def newest_step(workdir: str) -> int | None:
  """The step of `workdir`'s newest complete checkpoint; None if none is."""
  return Scan(os.path.join(workdir, CHECKPOINT_DIR)).newest
