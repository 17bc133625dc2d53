"""Checkpoints that let an interrupted run resume exactly where it stopped.

Kill-safety is the write order: a save writes prefix `ckpt-<step>`, then
atomically replaces the pointer (TF's `checkpoint` state file), then sweeps
what nothing names. A resume trusts the checksums, not the pointer, and moves
a damaged prefix aside, never deleting it (`resuming`, loaded only for a
folder that holds something). The keeping is ours, not
`tf.train.CheckpointManager`'s (docs/resume.md says why).
"""

from __future__ import annotations

import json
import math
import os
import re

import ml_collections
import tensorflow as tf

from xla_mnist import config as config_lib
from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import checkpoint_files, files, reporting

CHECKPOINT_DIR = layout.CHECKPOINT_DIR
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
    **recipe(config, model),
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


def recipe(
  config: ml_collections.ConfigDict, net: tf.keras.Model | None = None
) -> dict[str, str | int | float]:
  """The config fields that change the trajectory, the optimizer's as
  `optimizers.recipe` flattens them (plain SGD's two without loading it),
  or as `net`'s own, compile()'s, holds them (`optimizers.recipe_of`)."""
  found = {
    'dataset': config.dataset,
    'batch_size': config.batch_size,
    'seed': config.seed,
    'learning_rate': config.learning_rate,
    'jit': config.jit,
  }
  own = getattr(net, 'optimizer', None)
  if own is None and config_lib.plain_sgd(config):
    return found | {'optimizer': config.optimizer, 'schedule': config.schedule}
  from xla_mnist import optimizers  # noqa: PLC0415 - beyond plain SGD only.

  return found | (
    optimizers.recipe_of(own) if own else optimizers.recipe(config)
  )


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
    if fresh:
      self._replace_old, self._kept = True, []
      return 0
    self._kept = []
    if checkpoint_files.listdir(self.restore_directory):  # Else a new run's.
      from xla_mnist.workdir import resuming  # noqa: PLC0415 - a resume only.

      owner = os.path.abspath(self.directory) == os.path.abspath(
        self.restore_directory
      )
      self._kept = resuming.restore_newest(
        self._checkpoint, self._fingerprint, self.restore_directory,
        self._keep, owner,
      )  # fmt: skip
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
    name = f'{checkpoint_files.NAME}-{step}'
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
      checkpoint_files.write_state(self.directory, kept)
    except (tf.errors.OpError, OSError) as e:
      if not existed:
        checkpoint_files.remove_prefix(self.directory, name)
      raise UserError(
        f'cannot save a checkpoint in {self.directory}'
        f' ({errors.first_line(e)}): free'
        f' space there, or pass another {errors.arg("workdir", "DIR")}'
      ) from None
    self._kept = kept
    self._replace_old = False
    checkpoint_files.sweep(self.directory, self._kept)
    self._saved_step = step
    return path


def newest_step(workdir: str) -> int | None:
  """The step of `workdir`'s newest complete checkpoint; None if none is."""
  from xla_mnist.workdir import resuming  # noqa: PLC0415 - after a fault.

  return resuming.Scan(os.path.join(workdir, CHECKPOINT_DIR)).newest
