"""Training beyond one device: tf.distribute strategies, and the role each
process plays in a run.

Under `multi_worker` every worker computes the same global batch and, with
one replica per worker, worker w trains on rows [w * B/W, (w + 1) * B/W) of
it (see `replicated.make_step`). The role is decided once, here: code
below `Role` receives folders and booleans, never "is this the chief". What
only workers or a TPU need (TF_CONFIG, the wait for the workers, their
collectives) is `cluster`'s, loaded for such a run only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable, Iterator

import ml_collections
import tensorflow as tf

from xla_mnist.runtime import devices, errors
from xla_mnist.runtime.errors import UsageError


def make_strategy(
  name: str, num_cpu_devices: int = 0
) -> tf.distribute.Strategy:
  """Returns the strategy `name`; call it before TF runs any op.

  `num_cpu_devices` > 0 mirrors over that many logical CPUs instead of the
  local GPUs, to try `mirrored` on a machine without any.
  """
  if name == 'default':
    return tf.distribute.get_strategy()
  if name == 'mirrored':
    if num_cpu_devices > 0:
      return tf.distribute.MirroredStrategy(_logical_cpus(num_cpu_devices))
    return tf.distribute.MirroredStrategy()
  if name in ('multi_worker', 'tpu'):
    from xla_mnist.runtime import cluster  # noqa: PLC0415 - such a run only.

    return cluster.multi_worker() if name == 'multi_worker' else cluster.tpu()
  raise UsageError(f'unknown strategy {name!r}')  # config.check names them.


def _logical_cpus(count: int) -> list[str]:
  """The CPU split into `count` logical devices; see `split_cpu`."""
  split_cpu(count)
  return [d.name for d in tf.config.list_logical_devices('CPU')]


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


def has_workers(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` spans processes (a MultiWorkerMirroredStrategy can
  also run alone, without a cluster)."""
  return isinstance(
    strategy, tf.distribute.MultiWorkerMirroredStrategy
  ) and bool(strategy.cluster_resolver.task_type)


def placement(
  strategy: tf.distribute.Strategy, config: ml_collections.ConfigDict
) -> tuple[str, contextlib.AbstractContextManager]:
  """The run's device, as a label, and the scope that places its work.

  On one device, the one `config.device` names; a strategy places its
  replicas itself.
  """
  if config.strategy == 'default':
    device = devices.select(config.device)
    return device.removeprefix('/device:'), tf.device(device)
  replicas = f'{strategy.num_replicas_in_sync} replicas ({config.strategy})'
  return replicas, contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class Role:
  """Where this process writes and reads, and what it keeps."""

  write_dir: str  # Its checkpoints, event files and profile.
  restore_dir: str  # The workdir whose checkpoints it resumes from.
  keeps_outputs: bool  # result.json, report.md and a profile.

  @property
  def outputs_dir(self) -> str:
    """Where its events and profile go; '' for a process that keeps none."""
    return self.write_dir if self.keeps_outputs else ''


@contextlib.contextmanager
def role(strategy: tf.distribute.Strategy, workdir: str) -> Iterator[Role]:
  """The role of this process in a run whose outputs go to `workdir`.

  The process that checkpoints (every one but a non-chief worker, as Keras
  reads it from `should_checkpoint`) writes in `workdir`. Another worker
  writes its saves, which are collective, into a scratch folder deleted at
  the end (Keras's `write_dirpath` pattern), and resumes from the chief's
  checkpoints in the `workdir` that the workers share.
  """
  if strategy.extended.should_checkpoint:
    yield Role(workdir, workdir, keeps_outputs=True)
    return
  with tempfile.TemporaryDirectory(prefix='xla_mnist-worker-') as scratch:
    yield Role(scratch, workdir, keeps_outputs=False)


def check_same_start(strategy: tf.distribute.Strategy, start_step: int) -> None:
  """UserError on every worker unless they all start at the same step
  (`cluster.check_same_start`); nothing for a process that trains alone."""
  if has_workers(strategy):
    from xla_mnist.runtime import cluster  # noqa: PLC0415 - workers only.

    cluster.check_same_start(strategy, start_step)


def worker_max(strategy: tf.distribute.Strategy) -> Callable[[int], int] | None:
  """`largest(value)`: the largest `value` that the workers pass
  (`cluster.worker_max`, a collective), or None when this process trains
  alone."""
  if not has_workers(strategy):
    return None
  from xla_mnist.runtime import cluster  # noqa: PLC0415 - workers only.

  return cluster.worker_max(strategy)


def lost_workers_as_errors(
  strategy: tf.distribute.Strategy,
) -> contextlib.AbstractContextManager[None]:
  """Turns a collective that failed for want of another worker into a
  UserError (`cluster.lost_workers_as_errors`); nothing for a process that
  trains alone."""
  if not has_workers(strategy):
    return contextlib.nullcontext()
  from xla_mnist.runtime import cluster  # noqa: PLC0415 - workers only.

  return cluster.lost_workers_as_errors()
