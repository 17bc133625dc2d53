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
import math
import os
import re
import shutil
import signal
import threading
import types
from collections.abc import Callable

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
# What `signal.signal` returns: a function, SIG_DFL/SIG_IGN, or None.
_Handler = Callable[[int, types.FrameType | None], object] | int | None


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
  """Saves and restores a run's state in `<workdir>/checkpoints`.

  With `resume_from`, it restores from that workdir's checkpoints instead, and
  names them in its messages: a non-chief worker saves into a folder of its
  own but resumes from the chief's.
  """

  def __init__(
    self,
    workdir: str,
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    config: ml_collections.ConfigDict,
    resume_from: str = '',
  ):
    self.directory = os.path.join(workdir, CHECKPOINT_DIR)
    # The checkpoints this run resumes from, and the ones users should see.
    self.resume_directory = os.path.join(resume_from or workdir, CHECKPOINT_DIR)
    self._every = config.checkpoint_every
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

  @property
  def resumes_from_own(self) -> bool:
    """False on a non-chief worker, whose checkpoints are thrown away."""
    return self.resume_directory == self.directory

  def restore(self, fresh: bool) -> int:
    """Restores the latest checkpoint; returns its step, 0 if none or `fresh`.

    With `fresh`, the old checkpoints stay until this run saves its first
    one, so a fresh run that fails early (say on a NaN loss) loses nothing.
    """
    if fresh:
      self._replace_old = True
      return 0
    # What a CheckpointManager reads at its start, for any folder.
    state = tf.train.get_checkpoint_state(self.resume_directory)
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
        f'checkpoint {path} cannot be restored ({_reason(e)}): pass --fresh'
        ' to start over, or another --workdir'
      ) from None
    self._saved_step = int(self._step)
    return self._saved_step

  def _check_compatible(self, stored: dict[str, str | int | float]) -> None:
    """Raises UsageError naming the first field the checkpoint disagrees on."""
    for field, value in self._fingerprint.items():
      if stored.get(field) != value:
        raise UsageError(
          f'{self.resume_directory} holds a run with {field}'
          f' {stored.get(field)!r},'
          f' this config has {value!r}: pass --fresh to replace that run, or'
          ' another --workdir'
        )

  def should_save(self, step: int) -> bool:
    """Whether a multiple of `checkpoint_every` was reached since the last save.

    "Reached", not "equal to": a fused call of K steps may jump over it.
    """
    every = self._every
    return every > 0 and step // every > self._saved_step // every

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
        ' space there, or pass another --workdir'
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


class StopRequest:
  """Turns the first SIGINT or SIGTERM into a request to stop cleanly.

  The loop polls `requested` at each call boundary, saves a checkpoint and
  stops. The handlers are removed at the first signal, so a later one acts
  as usual (Ctrl-C raises KeyboardInterrupt). CPython runs handlers between
  bytecodes, in the main thread only: signals that arrive during a compiled
  call are seen, merged into one, when it returns; outside the main thread
  this does nothing and `requested` stays None.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self._signum = 0
    self._previous: dict[int, _Handler] = {}

  def __enter__(self) -> StopRequest:
    if threading.current_thread() is threading.main_thread():
      for signum in self.SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(
    self,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    traceback: types.TracebackType | None,
  ) -> None:
    self._uninstall()

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame  # Unused.
    self._signum = signum
    self._uninstall()

  def _uninstall(self) -> None:
    for signum, handler in self._previous.items():
      # None: the old handler was not set from Python and cannot be put back.
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    self._previous = {}

  @property
  def requested(self) -> str | None:
    """The name of the signal that asked to stop, e.g. 'SIGTERM'."""
    return signal.Signals(self._signum).name if self._signum else None

  @property
  def signum(self) -> int:
    """The number of the signal that asked to stop; 0 if none did."""
    return self._signum


def check_finite(loss: float, step: int, learning_rate: float) -> None:
  """Stops a diverged run with the fix, instead of training on NaN."""
  if not math.isfinite(loss):
    raise UserError(
      f'loss is {loss} at step {step}: lower --config.learning_rate'
      f' (now {learning_rate})'
    )
