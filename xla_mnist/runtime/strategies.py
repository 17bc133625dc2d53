"""The strategies beyond one device, made for a run that asks for one:
`mirrored` over the local GPUs or over logical CPUs split from the one (to
try it without GPUs), `multi_worker` and `tpu` through `cluster`. Loaded
only for such a run: the default strategy is TF's own."""

from __future__ import annotations

import tensorflow as tf

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError


def make(name: str, num_cpu_devices: int = 0) -> tf.distribute.Strategy:
  """The strategy `name` (not 'default'), made before TF runs any op;
  `num_cpu_devices` > 0 mirrors over that many logical CPUs."""
  if name == 'mirrored':
    if num_cpu_devices > 0:
      split_cpu(num_cpu_devices)
      cpus = [d.name for d in tf.config.list_logical_devices('CPU')]
      return tf.distribute.MirroredStrategy(cpus)
    return tf.distribute.MirroredStrategy()
  if name in ('multi_worker', 'tpu'):
    from xla_mnist.runtime import cluster  # noqa: PLC0415 - such a run only.

    return cluster.multi_worker() if name == 'multi_worker' else cluster.tpu()
  raise UsageError(f'unknown strategy {name!r}')  # config.check names them.


def split_cpu(count: int) -> None:
  """Splits the CPU into `count` logical devices; TF allows it only before
  its devices start, once a process: another count is then a UsageError."""
  cpu = tf.config.list_physical_devices('CPU')[0]
  if len(tf.config.get_logical_device_configuration(cpu) or ()) == count:
    return
  try:
    tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * count
    )
  except RuntimeError:
    runs = len(tf.config.list_logical_devices('CPU'))
    if runs == count:
      return
    raise UsageError(
      f'{errors.field("num_cpu_devices", count)} cannot apply: TensorFlow'
      f' already started its devices in this process, with {runs} logical'
      ' CPU(s), and they never change: train in a new process, or pass'
      f' {errors.field("num_cpu_devices", runs)}'
    ) from None
