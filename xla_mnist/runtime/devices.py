"""Chooses the device a run uses, or says plainly which ones exist."""

import tensorflow as tf

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError, UserError


def configure_threads(threads: int) -> None:
  """Sizes TF's CPU thread pools; 0 keeps TF's default, a thread per core.
  One is fastest here: a step's ops are too small to split (docs/speed.md).
  TF takes it only before it initialises: a later run of the process that
  asks for another count is refused, as it would record threads it does not
  run."""
  current = tf.config.threading.get_intra_op_parallelism_threads()
  if current == threads:
    return
  try:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
  except RuntimeError:
    runs = f'{current} per pool' if current else "TF's default, one per core"
    raise UsageError(
      f'{errors.field("cpu_threads", threads)} cannot apply: TensorFlow'
      f' already started in this process with {runs}, and its threads never'
      f' change: pass {errors.field("cpu_threads", current)}, or train in a'
      ' new process'
    ) from None


def select(name: str) -> str:
  """The TF device name for `config.device=name`, e.g. '/device:GPU:0'."""
  kinds = ('GPU', 'CPU') if name == 'auto' else (name.upper(),)
  found = [d for k in kinds for d in tf.config.list_logical_devices(k)]
  if not found:
    seen = ', '.join(
      d.name.removeprefix('/device:') for d in tf.config.list_logical_devices()
    )
    raise UserError(
      f'{errors.field("device", name)}: TensorFlow sees no {name.upper()}'
      f' here, only {seen}: use {errors.field("device", "auto")} or'
      f' {errors.field("device", "cpu")}'
      + (
        f' (on a TPU VM: {errors.field("strategy", "tpu")})'
        if name == 'tpu'
        else ''
      )
      + ', or run with TF_CPP_MIN_LOG_LEVEL=0 to see why TF found none'
    )
  return found[0].name


def peak_mib(device: str) -> float | None:
  """The device allocator's peak, where TF tracks one (GPU, TPU)."""
  if not device.startswith(('GPU', 'TPU')):
    return None  # CPU:0, or a strategy's replicas: no one allocator.
  try:
    info = tf.config.experimental.get_memory_info(device)
  except (ValueError, tf.errors.OpError):
    return None
  return info['peak'] / 2**20
