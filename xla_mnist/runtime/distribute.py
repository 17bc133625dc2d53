"""Training beyond one device: tf.distribute strategies, and the role each
process plays in a run (docs/distributed.md).

The role is decided once, here: code below `Role` receives folders and
booleans, never "is this the chief". A strategy other than the default is
made by `strategies`; what only workers or a TPU need (TF_CONFIG, the wait
for the workers, their collectives) is `cluster`'s; each is loaded for such
a run only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import types
from collections.abc import Callable, Iterator

import ml_collections
import tensorflow as tf

from xla_mnist.runtime import devices


def make_strategy(
  name: str, num_cpu_devices: int = 0
) -> tf.distribute.Strategy:
  """The strategy `name`, made before TF runs any op; `num_cpu_devices` > 0
  mirrors over that many logical CPUs, to try `mirrored` without GPUs."""
  if name == 'default':
    return tf.distribute.get_strategy()
  from xla_mnist.runtime import strategies  # noqa: PLC0415 - such a run only.

  return strategies.make(name, num_cpu_devices)


def has_workers(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` spans processes (a MultiWorkerMirroredStrategy can
  also run alone, without a cluster)."""
  return isinstance(
    strategy, tf.distribute.MultiWorkerMirroredStrategy
  ) and bool(strategy.cluster_resolver.task_type)


def placement(
  strategy: tf.distribute.Strategy, config: ml_collections.ConfigDict
) -> tuple[str, contextlib.AbstractContextManager]:
  """The run's device, as a label, and the scope that places its work: the
  device `config.device` names; none for a strategy, which places its own."""
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
  """The role of this process in a run whose outputs go to `workdir`: the
  process that checkpoints (all but a non-chief worker, as Keras's
  `should_checkpoint` says) writes there; another worker writes its saves,
  which are collective, into a scratch folder deleted at the end (Keras's
  `write_dirpath` pattern) and resumes from the chief's in `workdir`."""
  if strategy.extended.should_checkpoint:
    yield Role(workdir, workdir, keeps_outputs=True)
    return
  with tempfile.TemporaryDirectory(prefix='xla_mnist-worker-') as scratch:
    yield Role(scratch, workdir, keeps_outputs=False)


def _cluster(strategy: tf.distribute.Strategy) -> types.ModuleType | None:
  """`cluster`, for a process that trains with workers; None alone."""
  if not has_workers(strategy):
    return None
  from xla_mnist.runtime import cluster  # noqa: PLC0415 - workers only.

  return cluster


def check_same_start(strategy: tf.distribute.Strategy, start_step: int) -> None:
  """UserError on every worker unless they all start at the same step
  (`cluster.check_same_start`)."""
  if cluster := _cluster(strategy):
    cluster.check_same_start(strategy, start_step)


def worker_max(strategy: tf.distribute.Strategy) -> Callable[[int], int] | None:
  """`largest(value)`: the largest `value` that the workers pass
  (`cluster.worker_max`, a collective)."""
  cluster = _cluster(strategy)
  return cluster.worker_max(strategy) if cluster else None


def lost_workers_as_errors(
  strategy: tf.distribute.Strategy,
) -> contextlib.AbstractContextManager[None]:
  """Turns a collective that failed for want of another worker into a
  UserError (`cluster.lost_workers_as_errors`)."""
  if cluster := _cluster(strategy):
    return cluster.lost_workers_as_errors()
  return contextlib.nullcontext()
