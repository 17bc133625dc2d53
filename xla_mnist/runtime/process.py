"""The process a run trains in: readied before TF starts, set once it has,
tried again past a fault of TF's XLA cache, and held to what the machine
has (`check_machine`, part of `config.check`).

TF reads auto-clustering, the cluster dumps and its compilation cache once,
as it starts: `prepare` sets them, called by the command line after its
flags and by a notebook before importing TensorFlow (without it a run
compiles every time; docs/resume.md). `apply` sets what TF takes once
started. Imports no TensorFlow itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import TypeVar

import ml_collections

from xla_mnist.runtime import console, env, errors, layout, xla_cache
from xla_mnist.runtime.errors import UsageError

T = TypeVar('T')


def default_cache_dir() -> str:
  return layout.user_cache('xla_mnist')


def prepare(
  config: ml_collections.ConfigDict,
  workdir: str,
  xla_cache_dir: str | None = None,
) -> xla_cache.Cache:
  """Sets TF's start-up settings for `config`'s run in `workdir`, and checks
  TF_CONFIG for a `multi_worker` one; returns how the run uses the XLA
  cache. `xla_cache_dir` None: the user's cache folder; '': compile every
  time. The cache is unused where XLA never compiles or must compile to
  dump (docs/resume.md, "The XLA cache"). UsageError once TF has started:
  it would read none of them; UsageError for a broken TF_CONFIG or
  XLA_MNIST_WORKER_TIMEOUT (`tf_config.read`).
  """
  if 'tensorflow' in sys.modules:
    raise UsageError(
      'process.prepare sets what TensorFlow reads as it starts, and it has'
      ' started: call it before importing TensorFlow (or xla_mnist.trainer),'
      ' in a new process'
    )
  if config.strategy == 'multi_worker':  # A broken TF_CONFIG: at once.
    from xla_mnist.runtime import tf_config  # noqa: PLC0415 - workers only.

    tf_config.read()
  given = default_cache_dir() if xla_cache_dir is None else xla_cache_dir
  dumps = config.dump_hlo and config.jit == 'auto'
  if env.dumps_requested() and config.jit != 'off' and given:
    console.say(
      'XLA_FLAGS asks for --xla_dump_to: the XLA cache is skipped, so that'
      ' XLA compiles and dumps'
    )
  unused = config.jit == 'off' or dumps or env.dumps_requested()
  cache = xla_cache_in('' if unused else given)
  for note in cache.notes:
    console.say(note)
  if config.jit == 'auto':
    env.autocluster()
  if dumps:
    from xla_mnist.runtime import cluster_dumps  # noqa: PLC0415 - dumps only.

    cluster_dumps.request(os.path.join(workdir, layout.CLUSTER_DIR))
  if cache.directory:
    env.cache_compilations(cache.directory, read_only=not cache.writable)
  return cache


def xla_cache_in(directory: str) -> xla_cache.Cache:
  """How a run uses the XLA cache in `directory` ('': none): as it is when
  sound; otherwise made, repaired, read only or skipped, with a note for
  each fault (`cache_faults`, loaded only then)."""
  cache = xla_cache.sound(directory)
  if cache is None:
    from xla_mnist.runtime import cache_faults  # noqa: PLC0415 - faults only.

    cache = cache_faults.repaired(directory)
  return cache


def apply(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Sets the config's process-wide settings before TF compiles or starts its
  devices; UsageError for one TF fixed as it started, not recorded as run."""
  from xla_mnist.runtime import devices  # noqa: PLC0415 - imports TF.

  env.check_user_flags()  # Before TF's first compile, which they would end.
  _check_prepared(config, workdir)
  configure_jit(config.jit)
  devices.configure_threads(config.cpu_threads)
  if config.strategy == 'mirrored' and config.num_cpu_devices:
    from xla_mnist.runtime import strategies  # noqa: PLC0415 - mirrored only.

    strategies.split_cpu(config.num_cpu_devices)  # Before TF's devices start.


def configure_jit(mode: str) -> None:
  """Sets jit `mode`'s process-wide part before any `tf.function`, both ways
  for a process that trains several runs (a notebook's): `auto` turns on
  auto-clustering and its CPU flag (`env.cpu_clustering`: TF reads
  TF_XLA_FLAGS once), the other modes turn both off, so that an earlier
  `auto` run's clusters do not run in them."""
  import tensorflow as tf  # noqa: PLC0415 - its caller has imported it.

  auto = mode == 'auto'
  tf.config.optimizer.set_jit('autoclustering' if auto else False)
  env.cpu_clustering(auto)


def retry_on_cache_fault(
  attempt: Callable[[], T], *, finished: Callable[[], bool], workers: bool
) -> T:
  """`attempt()`, tried again past a fault of TF's XLA cache, with a note;
  a fault a second try cannot get past ends in one line
  (`cache_faults.after`). `finished()` says whether training had ended."""
  cache = env.cache_directory()
  cached = xla_cache.entries(cache)
  first_try = True
  while True:
    try:
      return attempt()
    except Exception as e:
      if not cache:
        raise
      from xla_mnist.runtime import cache_faults  # noqa: PLC0415 - rare.

      if not cache_faults.is_fault(e):
        raise
      retry = cache_faults.after(
        e, cache, cached, trained=finished(), workers=workers,
        first_try=first_try,
      )  # fmt: skip
      console.say(retry)
      first_try = False


def _check_prepared(config: ml_collections.ConfigDict, workdir: str) -> None:
  """UsageError for a config whose start-up settings this process lacks and
  can no longer take: cluster dumps, asked without `prepare`."""
  dumps = os.path.join(workdir, layout.CLUSTER_DIR)
  if config.dump_hlo and config.jit == 'auto' and not env.dumping_to(dumps):
    raise UsageError(
      f'{errors.field("dump_hlo", True)} with {errors.field("jit", "auto")}'
      ' needs its dump flags before TensorFlow starts, and none were set for'
      f' {dumps}: call xla_mnist.runtime.process.prepare(config,'
      f' {workdir!r}) before importing TensorFlow, in a new process'
    )


# Threads and logical CPUs beyond this many per core only wait for one
# another, and TF starts each at start-up: 100000 took minutes, silently.
PER_CORE = 4
# A call's int32 index block and a batch of float32 images with a few copies
# (activations, gradients) may take at most this share of the memory.
BATCH_COPIES = 4
CGROUP_LIMIT = '/sys/fs/cgroup/memory.max'  # A container's memory (v2).
MEMORY_SHARE = 0.5


def cores() -> int:
  """The cores this process may run on (its affinity, as a container's)."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def check_machine(config: ml_collections.ConfigDict) -> None:
  """Refuses threads or logical CPUs beyond the machine."""
  most = PER_CORE * cores()
  for field in ('cpu_threads', 'num_cpu_devices'):
    if config[field] > most:
      raise UsageError(
        f'{field} is {config[field]}, more than {PER_CORE} per core of the'
        f' {cores()} this process may use: set {errors.field(field)} to at'
        f' most {most}'
      )


def check_memory(
  config: ml_collections.ConfigDict, block: int, pixels: int = 0
) -> None:
  """Refuses a step's memory beyond the machine, for images of `pixels`
  values (0: the index block alone, before the data are known); `block` is
  the fewest steps of a call's index block."""
  # A call's index block: K steps, at least `block` (`program.make`).
  steps = max(min(config.steps_per_loop or block, config.num_steps), block)
  need = 4 * config.batch_size * (steps + BATCH_COPIES * pixels)
  if (memory := memory_bytes()) and need > MEMORY_SHARE * memory:
    raise UsageError(
      f'a call of {steps} steps of batch_size'
      f' {config.batch_size} needs {need / 2**30:.1f} GiB, more than half'
      f" of this machine's {memory / 2**30:.1f} GiB: lower"
      f' {errors.field("steps_per_loop")} or {errors.field("batch_size")}'
    )


def memory_bytes() -> int:
  """The memory this process may use: the machine's, or its container's
  cgroup v2 limit where lower; 0 where nothing says."""
  sizes = []
  with contextlib.suppress(ValueError, OSError):
    sizes.append(os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE'))
  with contextlib.suppress(ValueError, OSError), open(CGROUP_LIMIT) as f:
    sizes.append(int(f.read()))  # 'max', for no limit, is no number.
  return min(sizes, default=0)
