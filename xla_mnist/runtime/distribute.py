"""Training beyond one device: tf.distribute strategies, and the role each
process plays in a run.

Under `multi_worker` every worker computes the same global batch and, with
one replica per worker, worker w trains on rows [w * B/W, (w + 1) * B/W) of
it (see `step.make_distributed_step`). The role is decided once, here: code
below `Role` receives folders and booleans, never "is this the chief".
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator

import ml_collections
import numpy as np
import tensorflow as tf

from xla_mnist.runtime import devices, errors
from xla_mnist.runtime.errors import UsageError, UserError

# How long a worker waits for the others in TF_CONFIG before giving up: TF's
# own wait, in the strategy's constructor, never ends. The environment
# variable sets another wait, in seconds.
STARTUP_TIMEOUT = 300.0
STARTUP_TIMEOUT_VARIABLE = 'XLA_MNIST_WORKER_TIMEOUT'
# How long a collective (one all-reduce) may take before the step fails.
COLLECTIVE_TIMEOUT = 120.0
# How TF reports a collective whose peer went away or never answered.
_LOST_PEER_ERRORS = (
  tf.errors.UnavailableError,
  tf.errors.DeadlineExceededError,
  tf.errors.AbortedError,
  tf.errors.CancelledError,
)
_TF_CONFIG_EXAMPLE = (
  '{"cluster": {"worker": ["host0:12345", "host1:12345"]},'
  ' "task": {"type": "worker", "index": 0}}'
)


def make_strategy(
  name: str, num_cpu_devices: int = 0, startup_timeout: float = STARTUP_TIMEOUT
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
  if name == 'multi_worker':
    cluster = check_tf_config(os.environ.get('TF_CONFIG', ''))
    timeout = _startup_timeout(startup_timeout)
    _wait_for_workers(cluster, json.loads(os.environ['TF_CONFIG']), timeout)
    return _multi_worker(sum(map(len, cluster.values())), timeout)
  if name == 'tpu':
    return _tpu()
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


def check_tf_config(text: str) -> dict[str, list[str]]:
  """Returns TF_CONFIG's cluster; UsageError unless it names this worker.

  TF accepts a TF_CONFIG without a cluster and then trains alone, silently.
  """
  fix = f"export TF_CONFIG='{_TF_CONFIG_EXAMPLE}' with this host's index"
  if not text:
    raise UsageError(
      f'{errors.field("strategy", "multi_worker")} needs TF_CONFIG: {fix}'
    )
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise UsageError(f'TF_CONFIG is not JSON ({e.msg}): {fix}') from None
  cluster = config.get('cluster') if isinstance(config, dict) else None
  if not cluster or not isinstance(cluster, dict):
    raise UsageError(f'TF_CONFIG has no "cluster": {fix}')
  for job, addresses in cluster.items():
    if job not in ('chief', 'worker') or not _addresses(addresses):
      raise UsageError(
        f'TF_CONFIG cluster job {job!r} must be "chief" or "worker" with a'
        f' list of "host:port" addresses: {fix}'
      )
  task = config.get('task')
  if not isinstance(task, dict) or task.get('type') not in cluster:
    raise UsageError(
      f'TF_CONFIG "task" must name a job of the cluster'
      f' ({", ".join(cluster)}): {fix}'
    )
  index, size = task.get('index'), len(cluster[task['type']])
  if not isinstance(index, int) or not 0 <= index < size:
    raise UsageError(
      f'TF_CONFIG task index {index!r} is not one of the {size}'
      f' {task["type"]} addresses: set "index" from 0 to {size - 1}'
    )
  return cluster


def _addresses(value: object) -> bool:
  return (
    isinstance(value, list)
    and bool(value)
    and all(isinstance(a, str) and ':' in a for a in value)
  )


def _startup_timeout(default: float) -> float:
  """`STARTUP_TIMEOUT_VARIABLE`'s seconds, or `default` where it is unset."""
  text = os.environ.get(STARTUP_TIMEOUT_VARIABLE, '')
  if not text:
    return default
  try:
    seconds = float(text)
  except ValueError:
    seconds = 0.0
  if not 0 < seconds < 1e6:
    raise UsageError(
      f'{STARTUP_TIMEOUT_VARIABLE}={text!r} is not a number of seconds'
      f' above 0: set it to the wait for the other workers, or unset it'
      f' for {STARTUP_TIMEOUT:.0f} s'
    )
  return seconds


def _wait_for_workers(
  cluster: dict[str, list[str]], config: dict, timeout: float
) -> None:
  """Waits in Python, where a signal is obeyed at once, until every other
  worker of `cluster` listens; UserError naming the first that never did.

  Meanwhile this worker holds its own port, so that the others see it come
  and a port that another program holds is one line before TF starts (TF's
  own bind failure is a long traceback). The port is let go just before
  TF's server binds it.
  """
  task = config['task']
  own = cluster[task['type']][task['index']]
  others = [a for job in cluster.values() for a in job if a != own]
  with _holding(own):
    deadline = time.monotonic() + timeout
    for address in others:
      while not _listening(address):
        if time.monotonic() > deadline:
          raise UserError(
            f'worker {address} of TF_CONFIG did not start within'
            f' {timeout:.0f} s: start the same command there with its'
            f' "index", check that this host reaches that address, or wait'
            f' longer ({STARTUP_TIMEOUT_VARIABLE}=SECONDS)'
          )
        time.sleep(0.2)


@contextlib.contextmanager
def _holding(address: str) -> Iterator[None]:
  """Listens on `address`'s port, as TF's server will (on every interface)."""
  port = int(address.rpartition(':')[2])
  with socket.socket(socket.AF_INET) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(('', port))
    except OSError as e:
      raise UserError(
        f'port {port} of this worker ({address} in TF_CONFIG) is in use'
        f' ({e.strerror}): stop what holds it, or give this worker another'
        " port in every worker's TF_CONFIG"
      ) from None
    s.listen(16)
    yield


def _listening(address: str) -> bool:
  host, _, port = address.rpartition(':')
  try:
    with socket.create_connection((host.strip('[]'), int(port)), timeout=1):
      return True
  except OSError:
    return False


def _multi_worker(
  workers: int, startup_timeout: float
) -> tf.distribute.Strategy:
  """MultiWorkerMirroredStrategy over RING all-reduces, its start bounded.

  The constructor waits in C++ for every worker, holding the GIL and ignoring
  SIGTERM, so only faulthandler's C watchdog can end the wait: it exits with
  code 1, after the notice printed here.
  """
  logging.getLogger(__name__).info(
    f'waiting for the {workers} workers in TF_CONFIG; exits with code 1 if'
    f' they have not all started in {startup_timeout:.0f} s'
  )
  with open(os.devnull, 'w') as quiet:  # One line, not a thread dump.
    faulthandler.dump_traceback_later(startup_timeout, exit=True, file=quiet)
    try:
      return _constructed()
    except tf.errors.UnknownError as e:  # Its server could not start.
      said = [line for line in str(e).splitlines() if line.strip()]
      raise UserError(
        f'this worker could not start its TF server ({said[0] if said else e}'
        '): check that its port in TF_CONFIG is free and of this host'
      ) from None
    finally:
      faulthandler.cancel_dump_traceback_later()


def _constructed() -> tf.distribute.Strategy:
  return tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(
      implementation=tf.distribute.experimental.CommunicationImplementation.RING,
      timeout_seconds=COLLECTIVE_TIMEOUT,
    )
  )


def _tpu() -> tf.distribute.Strategy:
  """TPUStrategy over the TPU of this TPU VM."""
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu='local')
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, RuntimeError, tf.errors.OpError) as e:
    reason = errors.first_line(e, named=True).split('. ')[0]
    raise UserError(
      f'{errors.field("strategy", "tpu")} found no TPU'
      f' ({reason}): run on a TPU VM, or use'
      f' {errors.field("strategy", "default")} or mirrored'
    ) from None
  return tf.distribute.TPUStrategy(resolver)


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
  """UserError on every worker unless they all start at the same step.

  Every worker resumes from the chief's checkpoints, in the `workdir` that
  they share. A worker that cannot see them starts at 0, and would silently
  train other weights on other batches than a chief that resumed. The check is
  a collective, so that every worker takes the same decision.
  """
  if not has_workers(strategy):
    return
  steps = sorted(set(_gatherer(strategy)(start_step).tolist()))
  if len(steps) > 1:
    raise UserError(
      'the workers would start at different steps'
      f' ({", ".join(map(str, steps))}):'
      " they resume from the chief's checkpoints in the workdir, so give"
      f' every worker the same {errors.arg("workdir", "DIR")} on storage they'
      f' all reach, or pass {errors.arg("fresh", True)} to every worker'
    )


def worker_max(strategy: tf.distribute.Strategy) -> Callable[[int], int] | None:
  """`largest(value)`: the largest `value` that the workers pass, or None
  when this process trains alone.

  A collective: every worker must call it at the same point of the run (the
  same step), or the calls pair up wrongly and time out. Making it is one
  too: it traces and runs the gather once, so that no call in the timed loop
  traces.
  """
  if not has_workers(strategy):
    return None
  gather = _gatherer(strategy)
  gather(0)
  return lambda value: int(gather(value).max())


def _gatherer(strategy: tf.distribute.Strategy) -> Callable[[int], np.ndarray]:
  """`gather(value)`: every replica's `value`, as one traced collective.

  Traced once: an eager `strategy.gather` retraces at every call, which
  costs many times the gather itself.
  """

  @tf.function
  def gather(value: tf.Tensor) -> tf.Tensor:
    # One value per replica, and a worker may hold several.
    local = strategy.experimental_distribute_values_from_function(
      lambda _: value
    )
    return strategy.gather(local, axis=0)

  return lambda value: gather(tf.constant([value], tf.int64)).numpy()


@contextlib.contextmanager
def lost_workers_as_errors(strategy: tf.distribute.Strategy) -> Iterator[None]:
  """Turns a collective that failed for want of another worker into a
  UserError: TF's traceback names this worker's op, not the cause, which is
  in the other worker's output."""
  try:
    yield
  except _LOST_PEER_ERRORS as e:
    if not has_workers(strategy):
      raise
    raise UserError(
      f'lost contact with another worker ({type(e).__name__}:'
      f' {collective_failure(str(e))}):'
      ' it stopped or cannot be reached, and its own output says why. Start'
      ' every worker again: with a workdir they share, they resume from the'
      " chief's last checkpoint"
    ) from None


def collective_failure(message: str) -> str:
  """The line of a failed collective's TF error that says what happened.

  The message of an error raised in a `tf.function` starts with "Graph
  execution error:" and the Python stack of the op; the cause comes after.
  """
  lines = [line.strip() for line in message.splitlines()]
  for line in lines:
    if 'aborted by:' in line:
      return line.split('aborted by:', 1)[1].strip()
  noise = ('Graph execution error', 'Detected at node', 'File ', '[[', ':')
  said = [line for line in lines if line and not line.startswith(noise)]
  return said[0] if said else '?'
