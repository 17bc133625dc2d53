"""Chooses the device a run uses, or says plainly which ones exist."""

import tensorflow as tf

from xla_mnist.errors import UserError

DEVICES = ('auto', 'cpu', 'gpu', 'tpu')


def select(name: str) -> str:
  """Returns the TF device name for `--device=name`, e.g. '/device:GPU:0'."""
  if name == 'auto':
    kinds = ('GPU', 'CPU')
  else:
    kinds = (name.upper(),)
  found = [d for k in kinds for d in tf.config.list_logical_devices(k)]
  if not found:
    seen = ', '.join(
      d.name.removeprefix('/device:') for d in tf.config.list_logical_devices()
    )
    raise UserError(
      f'--device={name}: TensorFlow sees no {name.upper()} here, only'
      f' {seen}: use --device=auto or --device=cpu'
    )
  return found[0].name
