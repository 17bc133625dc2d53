"""Checkpoints that let an interrupted run resume exactly where it stopped.

A checkpoint holds the model, the optimizer, the step and a fingerprint of the
config fields that give the weights their meaning. The batch order is a pure
function of (seed, step), so the step is the whole data position.

Kill-safety comes from TF's write order: `CheckpointManager.save` writes the
files of a new prefix `ckpt-<step>`, then atomically replaces the `checkpoint`
state file that names the latest prefix. A process killed mid-write leaves the
previous checkpoint named as the latest; `save` never rewrites that prefix,
and sweeps the files a killed write left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import ml_collections
import tensorflow as tf

from xla_mnist.errors import UsageError, UserError

CHECKPOINT_DIR = 'checkpoints'
_NAME = 'ckpt'
_STATE_FILE = 'checkpoint'  # TF's name for the file naming the latest.
# Files of a checkpoint prefix, a killed write's temp folder, and the temp
# file of an interrupted state-file update.
_FILE_PATTERN = re.compile(
  rf'({_NAME}-\d+)(\.index|\.data-\d+-of-\d+|_temp)$'
  rf'|{_STATE_FILE}\.tmp[0-9a-f]+$'
)
# Where the fingerprint lives in a checkpoint written by `Checkpointer`.
_FINGERPRINT_KEY = 'fingerprint/.ATTRIBUTES/VARIABLE_VALUE'


def fingerprint(
  model: tf.keras.Model, config: ml_collections.ConfigDict
) -> dict[str, str | int | float]:
  """The config fields a checkpoint's weights are only valid for.

  `learning_rate` is among them because the optimizer's checkpoint holds it:
  a resumed run would otherwise silently keep the old rate.
  """
  shapes = ' '.join(
    f'{v.path}:{"x".join(map(str, v.shape))}' for v in model.weights
  )
  return {
    'dataset': config.dataset,
    'model': shapes,
    'batch_size': config.batch_size,
    'seed': config.seed,
    'learning_rate': config.learning_rate,
  }


class Checkpointer:
  """Saves a run's state in `save_dir`, restores it from `restore_dir`.

  The two differ on a worker that does not keep outputs: it saves (saving is
  collective) into a scratch folder, and restores from the chief's.
  """

  def __init__(
    self,
    save_dir: str,
    restore_dir: str,
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    config: ml_collections.ConfigDict,
  ):
    self.directory = save_dir
    self.restore_directory = restore_dir  # The checkpoints users should see.
    self._keep = config.keep_checkpoints
    self._fingerprint = fingerprint(model, config)
    with tf.device('/cpu:0'):  # A string variable cannot live on a GPU.
      self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
      stored = tf.Variable(json.dumps(self._fingerprint), trainable=False)
    self._checkpoint = tf.train.Checkpoint(
      model=model, optimizer=optimizer, step=self._step, fingerprint=stored
    )
    self._manager = self._new_manager()
    self._saved_step = 0  # The step of the latest checkpoint on disk.
    self._replace_old = False

  def _new_manager(self) -> tf.train.CheckpointManager:
    return tf.train.CheckpointManager(
      self._checkpoint,
      self.directory,
      max_to_keep=self._keep,
      checkpoint_name=_NAME,
    )

  def restore(self, fresh: bool) -> int:
    """Restores the latest checkpoint; returns its step, 0 if none or `fresh`.

    With `fresh`, the old checkpoints stay until this run saves its first
    checkpoint, so a fresh run that fails early (say on a NaN loss) loses
    nothing.
    """
    if fresh:
      self._replace_old = True
      return 0
    # What a CheckpointManager reads at its start, for any folder.
    state = tf.train.get_checkpoint_state(self.restore_directory)
    if state is None:
      return 0
    path = state.model_checkpoint_path
    try:
      stored = tf.train.load_checkpoint(path).get_tensor(_FINGERPRINT_KEY)
      self._check_compatible(json.loads(stored))
      # `assert_consumed` is the check. `expect_partial` only silences TF's
      # own report at interpreter exit, which crashes with a traceback there.
      self._checkpoint.restore(path).expect_partial().assert_consumed()
    # TF reports a damaged file as any of these (IndexError when truncated).
    except (tf.errors.OpError, IndexError, ValueError, AssertionError) as e:
      raise UserError(
        f'checkpoint {path} cannot be restored ({_reason(e)}): pass'
        ' fresh=True to start over, or another workdir=DIR'
      ) from None
    self._saved_step = int(self._step)
    return self._saved_step

  def _check_compatible(self, stored: dict[str, str | int | float]) -> None:
    """Raises UsageError naming the first field the checkpoint disagrees on."""
    for field, value in self._fingerprint.items():
      if stored.get(field) != value:
        raise UsageError(
          f'{self.restore_directory} holds a run with {field}'
          f' {stored.get(field)!r},'
          f' this config has {value!r}: pass fresh=True to replace that run,'
          ' or another workdir=DIR'
        )

  def save(self, step: int) -> str:
    """Saves the state after `step` steps; returns the checkpoint's prefix."""
    if self._replace_old:
      # The state file goes first: from then on nothing names the old files,
      # and the sweep below removes them.
      state = os.path.join(self.directory, _STATE_FILE)
      if os.path.exists(state):
        os.remove(state)
      self._manager = self._new_manager()
      self._replace_old = False
    elif step == self._saved_step and self._manager.latest_checkpoint:
      # Already saved; rewriting the latest prefix in place is not kill-safe.
      return self._manager.latest_checkpoint
    self._step.assign(step)
    try:
      path = self._manager.save(checkpoint_number=step)
      self._sweep()
    except (tf.errors.OpError, OSError) as e:
      raise UserError(
        f'cannot save a checkpoint in {self.directory} ({_reason(e)}): free'
        ' space there, or pass another workdir=DIR'
      ) from None
    self._saved_step = step
    return path

  def _sweep(self) -> None:
    """Removes checkpoint files that the state file does not name."""
    kept = {os.path.basename(p) for p in self._manager.checkpoints}
    for name in os.listdir(self.directory):
      match = _FILE_PATTERN.match(name)
      if match and match.group(1) not in kept:
        path = os.path.join(self.directory, name)
        if os.path.isdir(path):
          shutil.rmtree(path)
        else:
          os.remove(path)


def _reason(error: Exception) -> str:
  """The first line of an error, without TF's `{{function_node ...}}` tag."""
  text = str(error).rpartition('}}')[2].strip()
  return text.splitlines()[0] if text else type(error).__name__
