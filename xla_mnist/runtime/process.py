"""The one call that readies a process for a run, before TF starts.

TF reads its XLA settings once, as it starts: auto-clustering (`jit='auto'`),
the cluster dumps of `dump_hlo` with `jit='auto'`, and the persistent
compilation cache. `prepare` sets them from a run's config, so the command
line calls it after its flags and a notebook calls it first, before
importing TensorFlow; without it a run compiles every time, and
`dump_hlo` with `jit='auto'` is refused.

Imports no TensorFlow.
"""

from __future__ import annotations

import os
import sys

import ml_collections

from xla_mnist.runtime import console, env, errors, layout, xla_cache
from xla_mnist.runtime.errors import UsageError


def default_cache_dir() -> str:
  """Where the XLA cache lives unless told: the user's cache folder."""
  home = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
  return os.path.join(home, 'xla_mnist')


def prepare(
  config: ml_collections.ConfigDict,
  workdir: str,
  xla_cache_dir: str | None = None,
) -> xla_cache.Cache:
  """Sets TF's start-up settings for `config`'s run in `workdir`, and
  returns how the run uses the XLA cache (its notes said).

  `xla_cache_dir`: where XLA's compiled programs are kept, so that a later
  run of the same program loads them instead of compiling; None: the
  user's cache folder; '': compile every time. The cache is unused where
  XLA never compiles (`jit='off'`) or must compile to dump: for cluster
  dumps, and for the dumps XLA_FLAGS asks for (a program loaded from the
  cache is never compiled, so it would dump nothing).

  Raises UsageError once TF has started: it would read none of them.
  """
  if 'tensorflow' in sys.modules:
    raise UsageError(
      'process.prepare sets what TensorFlow reads as it starts, and it has'
      ' started: call it before importing TensorFlow (or xla_mnist.trainer),'
      ' in a new process'
    )
  given = default_cache_dir() if xla_cache_dir is None else xla_cache_dir
  dumps = config.dump_hlo and config.jit == 'auto'
  if env.dumps_requested() and config.jit != 'off' and given:
    console.say(
      'XLA_FLAGS asks for --xla_dump_to: the XLA cache is skipped, so that'
      ' XLA compiles and dumps'
    )
  unused = config.jit == 'off' or dumps or env.dumps_requested()
  cache = xla_cache.prepare('' if unused else given)
  for note in cache.notes:
    console.say(note)
  if config.jit == 'auto':
    env.autocluster()
  if dumps:
    env.dump_clusters(os.path.join(workdir, layout.CLUSTER_DIR))
  if cache.directory:
    env.cache_compilations(cache.directory, read_only=not cache.writable)
  return cache


def check_prepared(config: ml_collections.ConfigDict, workdir: str) -> None:
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
