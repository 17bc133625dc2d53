"""Strategies that reach past this process's own devices: workers that
TF_CONFIG names, or the TPU system, and the collectives the workers agree
through.

Loaded by `distribute` only for such a run (`multi_worker`, `tpu`): a run on
one device or mirrored never needs it. TF's own start of a cluster waits
forever and fails in long tracebacks; here each fault is one line.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from xla_mnist.runtime import errors, tf_config
from xla_mnist.runtime.errors import UserError

# How long a collective (one all-reduce) may take before the step fails.
COLLECTIVE_TIMEOUT = 120.0
# How TF reports a collective whose peer went away or never answered.
_LOST_PEER_ERRORS = (
  tf.errors.UnavailableError,
  tf.errors.DeadlineExceededError,
  tf.errors.AbortedError,
  tf.errors.CancelledError,
)


def multi_worker() -> tf.distribute.Strategy:
  """MultiWorkerMirroredStrategy over the workers of TF_CONFIG, once they
  all listen; UsageError for a TF_CONFIG that names no cluster or not this
  worker (`tf_config.read`), UserError for a worker that did not start in
  time (`tf_config.STARTUP_TIMEOUT`)."""
  cluster, timeout = tf_config.read()
  _wait_for_workers(cluster, json.loads(os.environ['TF_CONFIG']), timeout)
  return _bounded_start(sum(map(len, cluster.values())), timeout)


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
            f' longer ({tf_config.STARTUP_TIMEOUT_VARIABLE}=SECONDS)'
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


def _bounded_start(
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


def tpu() -> tf.distribute.Strategy:
  """TPUStrategy over the TPU of this TPU VM; UserError where there is none."""
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


def check_same_start(strategy: tf.distribute.Strategy, start_step: int) -> None:
  """UserError on every worker unless they all start at the same step.

  Every worker resumes from the chief's checkpoints, in the `workdir` that
  they share. A worker that cannot see them starts at 0, and would silently
  train other weights on other batches than a chief that resumed. The check is
  a collective, so that every worker takes the same decision.
  """
  steps = sorted(set(_gatherer(strategy)(start_step).tolist()))
  if len(steps) > 1:
    raise UserError(
      'the workers would start at different steps'
      f' ({", ".join(map(str, steps))}):'
      " they resume from the chief's checkpoints in the workdir, so give"
      f' every worker the same {errors.arg("workdir", "DIR")} on storage they'
      f' all reach, or pass {errors.arg("fresh", True)} to every worker'
    )


def worker_max(strategy: tf.distribute.Strategy) -> Callable[[int], int]:
  """`largest(value)`: the largest `value` that the workers pass.

  A collective: every worker must call it at the same point of the run (the
  same step), or the calls pair up wrongly and time out. Making it is one
  too: it traces and runs the gather once, so that no call in the timed loop
  traces.
  """
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
def lost_workers_as_errors() -> Iterator[None]:
  """Turns a collective that failed for want of another worker into a
  UserError: TF's traceback names this worker's op, not the cause, which is
  in the other worker's output."""
  try:
    yield
  except _LOST_PEER_ERRORS as e:
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
