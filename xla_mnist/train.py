r"""Trains the TF1 `mnist_softmax_xla.py` recipe in TF2 with XLA.

  python -m xla_mnist.train --config=fashion_mnist --jit=on \
      --config.num_steps=2000

Hyperparameters live in the config file (`--config.x=...` overrides them);
flags choose where the run happens and where its outputs go.
"""

from __future__ import annotations

# First: catches stop signals before the imports below (see `cli`).
from xla_mnist.runtime import cli  # isort: skip

cli.catch_stop_signals()

import os
import sys
import types

import ml_collections
from absl import flags, logging
from ml_collections import config_flags

# No TensorFlow yet: `main` imports it once the flags and the config have
# passed their checks, so that a usage error comes at once, not after TF's
# import (seconds).
from xla_mnist import config as config_lib
from xla_mnist.runtime import console, env, layout, xla_cache
from xla_mnist.runtime.errors import Interrupted, Stopped, UsageError, UserError
from xla_mnist.workdir import files, outputs

# Defined by `_define_flags` as `parse_flags` runs (see `cli`).
_JIT: flags.FlagHolder
_DEVICE: flags.FlagHolder
_STRATEGY: flags.FlagHolder
_WORKDIR: flags.FlagHolder
_DATA_DIR: flags.FlagHolder
_FRESH: flags.FlagHolder
_DUMP_HLO: flags.FlagHolder
_XLA_CACHE_DIR: flags.FlagHolder
_PROFILER_PORT: flags.FlagHolder
_CONFIG: flags.FlagHolder
_CACHE = xla_cache.Cache('')  # As `parse_flags` prepared it.
_CONFIG_FILE = ''  # The recipe's file, as --config names it.


def _define_flags(argv: list[str]) -> None:
  """train's flags; --config's overrides are read from `argv` as it is
  defined, so a bad one is raised here, in `parse_flags`."""
  _define_recipe_flags()
  _define_output_flags(argv)


def _define_recipe_flags() -> None:
  """The flags that set a config field of their name."""
  global _JIT, _DEVICE, _STRATEGY, _DUMP_HLO
  _JIT, _DEVICE, _STRATEGY, _DUMP_HLO = _recipe_flags(flags.FLAGS)


def _recipe_flags(fv: flags.FlagValues) -> tuple[flags.FlagHolder, ...]:
  """Defines --jit, --device, --strategy and --dump_hlo in `fv`."""
  jit = flags.DEFINE_enum(
    'jit',
    None,
    config_lib.JIT_MODES,
    'XLA mode: off = plain tf.function, on = jit_compile=True, auto ='
    " auto-clustering. Default: the config's jit field.",
    flag_values=fv,
  )
  device = flags.DEFINE_enum(
    'device',
    None,
    config_lib.DEVICES,
    "Where to run. Default: the config's device field (auto: a GPU if any).",
    flag_values=fv,
  )
  strategy = flags.DEFINE_enum(
    'strategy',
    None,
    config_lib.STRATEGIES,
    'tf.distribute strategy: default (one device), mirrored (local GPUs, or'
    ' --config.num_cpu_devices logical CPUs), multi_worker (from TF_CONFIG),'
    " tpu. Default: the config's strategy field.",
    flag_values=fv,
  )
  dump_hlo = flags.DEFINE_bool(
    'dump_hlo',
    None,
    'Write what XLA made of the step into the workdir: the HLO before and'
    ' after optimization with --jit=on, the clusters with --jit=auto.'
    " Default: the config's dump_hlo field.",
    flag_values=fv,
  )
  return jit, device, strategy, dump_hlo


def _define_output_flags(argv: list[str]) -> None:
  """Where the run's outputs, data and caches go, and the recipe's file."""
  global _WORKDIR, _DATA_DIR, _FRESH, _XLA_CACHE_DIR, _PROFILER_PORT, _CONFIG
  _WORKDIR = flags.DEFINE_string(
    'workdir',
    None,
    'Output folder (TensorBoard logs, result.json). Default:'
    ' ./logs/<config name>-<jit>.',
  )
  _DATA_DIR = flags.DEFINE_string(
    'data_dir', './data', 'TFDS data dir, where the dataset is prepared once.'
  )
  _FRESH = flags.DEFINE_bool(
    'fresh',
    False,
    "Start over instead of resuming from the workdir's latest checkpoint.",
  )
  _XLA_CACHE_DIR = flags.DEFINE_string(
    'xla_cache_dir',
    os.path.join(
      os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'),
      'xla_mnist',
    ),
    "Keeps XLA's compiled programs here (TF's persistent compilation cache), so"
    ' that a later run of the same program loads them instead of compiling;'
    ' empty: compile every time. Unused with --jit=off, with --dump_hlo'
    ' --jit=auto, and when XLA_FLAGS has --xla_dump_to: dumps need compiles.',
  )

  _PROFILER_PORT = flags.DEFINE_integer(
    'profiler_port',
    0,
    "Starts TF's profiler server on this port before training, so that"
    " TensorBoard's Profile tab (Capture profile, localhost:PORT) can profile"
    ' the run while it trains; it listens on every interface, without'
    ' authentication (docs/profiling.md); 0: no server.',
    lower_bound=0,
    upper_bound=65535,
  )
  _CONFIG = config_flags.DEFINE_config_dict(
    'config',
    config_lib.load(_CONFIG_FILE),
    'The recipe: a packaged config by name'
    f' ({", ".join(config_lib.packaged())}) or a config file; override'
    ' fields with --config.x=value.',
    sys_argv=argv,
  )


def _describe(error: Exception) -> str:
  """One line for an exception raised while reading flags or the config."""
  if isinstance(error, flags.Error):
    return cli.bad_flag(error)
  if isinstance(error, SyntaxError):
    return f'config file {error.filename} line {error.lineno}: {error.msg}'
  if isinstance(error, (AttributeError, KeyError)):
    return f'config has no field {error}: check the --config.x=... overrides'
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return (
    f'cannot load the config: {lines[-1] if lines else type(error).__name__}'
  )


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag or config is one line and exit code 2."""
  global _CACHE, _CONFIG_FILE
  env.quiet_by_default()
  # Loaded by `_define_flags`; a bad name or file: `cli.run` says it.
  argv, _CONFIG_FILE = config_lib.split_argv(argv)
  try:
    _define_flags(argv)
    rest = flags.FLAGS(argv)
    config = _apply_flags(_CONFIG.value)  # Loads the config file.
  except UserError:
    raise  # A config file's own: `cli.run` says it.
  except Exception as e:  # noqa: BLE001 - every parse failure is the user's.
    cli.fail(_describe(e), 2)
  config_lib.check(config)
  _check_places()
  if env.dumps_requested() and config.jit != 'off' and _XLA_CACHE_DIR.value:
    console.say(
      'XLA_FLAGS asks for --xla_dump_to: the XLA cache is skipped, so that'
      ' XLA compiles and dumps'
    )
  _CACHE = xla_cache.prepare(_cache_dir(config))
  for note in _CACHE.notes:
    console.say(note)
  # XLA's process-wide settings: here, before TF starts and reads them.
  if config.jit == 'auto':
    env.autocluster()
  if config.dump_hlo and config.jit == 'auto':
    env.dump_clusters(os.path.join(_workdir(config), layout.CLUSTER_DIR))
  if _CACHE.directory:
    env.cache_compilations(_CACHE.directory, read_only=not _CACHE.writable)
  return rest


def _apply_flags(
  config: ml_collections.ConfigDict, fv: flags.FlagValues = flags.FLAGS
) -> ml_collections.ConfigDict:
  """The config with the values of --jit, --device, --strategy, --dump_hlo."""
  with config.unlocked():
    config.jit = fv['jit'].value or config.jit
    config.device = fv['device'].value or config.device
    config.strategy = fv['strategy'].value or config.strategy
    if fv['dump_hlo'].value is not None:
      config.dump_hlo = fv['dump_hlo'].value
  return config


def config_of(argv: list[str]) -> ml_collections.ConfigDict:
  """The config a train run of flags `argv` would take, through the same
  parse and check; UsageError otherwise. Flags other than the recipe's are
  left alone: compare checks its runs' configs before the first starts."""
  argv, config_file = config_lib.resolve_argv(argv)
  fv = flags.FlagValues()
  _recipe_flags(fv)
  try:
    config_flags.DEFINE_config_file(
      'config', config_file, flag_values=fv, sys_argv=['train', *argv]
    )
    fv(['train', *argv], known_only=True)
    config = _apply_flags(fv['config'].value, fv)
  except UserError:
    raise
  except Exception as e:  # noqa: BLE001 - as `parse_flags`.
    raise UsageError(_describe(e)) from None
  config_lib.check(config)
  return config


def _cache_dir(config: ml_collections.ConfigDict) -> str:
  """--xla_cache_dir, or '' where XLA never compiles (--jit=off) or must
  compile: for cluster dumps, or for the dumps XLA_FLAGS asks for (a program
  loaded from the cache is never compiled, so it would dump nothing)."""
  unused = (
    config.jit == 'off'
    or (config.dump_hlo and config.jit == 'auto')
    or env.dumps_requested()
  )
  return '' if unused else _XLA_CACHE_DIR.value


def _cache_entries(directory: str) -> set[str]:
  return xla_cache.entries(directory) if directory else set()


def _workdir(config: ml_collections.ConfigDict) -> str:
  if _WORKDIR.value:
    return _WORKDIR.value
  return os.path.join(
    'logs', f'{config_lib.config_name(_CONFIG_FILE)}-{config.jit}'
  )


def main(argv: list[str]) -> None:
  if not flags.FLAGS['verbosity'].present:  # TF and TFDS log chatter.
    logging.set_verbosity(logging.ERROR)
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {" ".join(argv[1:])}: flags only', 2)
  config = _CONFIG.value
  cache_dir = _CACHE.directory
  cached = _cache_entries(cache_dir)
  if _PROFILER_PORT.value:
    console.say(profiler_exposure(_PROFILER_PORT.value))
  with env.importing_tensorflow():
    from xla_mnist import trainer  # noqa: PLC0415 - imports TF: see the top.

  # From here on files are written: a signal unwinds, removing temporary
  # files and the workdir's lock, until the trainer's StopRequest keeps it
  # for a save.
  cli.unwind_on_signals()
  workdir = _workdir(config)
  trained = _trained(trainer, config, workdir, cache_dir, cached)
  if trained.was_finished:
    console.say(
      trained.result.summary(),
      outputs.finished_line(trained.result, workdir, config.num_steps),
    )
    return
  if cache_dir and _CACHE.writable:
    stored = len(_cache_entries(cache_dir) - cached)
    console.say(
      f'XLA cache {cache_dir}: '
      + (f'{stored} compiled now, stored' if stored else 'all loaded from it')
    )
  console.say(trained.result.summary())


def _trained(
  trainer: types.ModuleType,
  config: ml_collections.ConfigDict,
  workdir: str,
  cache_dir: str,
  cached: set[str],
):
  """`trainer.train_and_evaluate` with the flags; a stop and a signal end
  the run as the exit codes say, and so does an XLA cache that fails in TF,
  but for the fault a second try gets past (below)."""
  from xla_mnist.workdir import checkpointing  # noqa: PLC0415 - TF's loaded.

  try:
    for first_try in (True, False):
      try:
        return trainer.train_and_evaluate(
          config,
          workdir,
          _DATA_DIR.value,
          fresh=_FRESH.value,
          # The first try's server still listens during the second.
          profiler_port=_PROFILER_PORT.value if first_try else 0,
        )
      except Exception as e:
        if not (cache_dir and xla_cache.is_fault(e)):
          raise
        fault = e
      reason = xla_cache.reason(fault)
      # The last save is the loop's last act: a checkpoint of the last step
      # means the fault came after training (evaluation, the report). Tried
      # again, the run would find its steps done and report a loss it never
      # measured.
      if checkpointing.newest_step(workdir) == config.num_steps:
        cli.fail(
          f'XLA cache {cache_dir} failed in TF after training ({reason}): the'
          ' checkpoint is saved; pass --fresh --xla_cache_dir= to train again'
          ' without the cache',
          1,
        )
      removed = xla_cache.forget_loaded(fault, cache_dir, cached)
      failed = f'XLA cache {cache_dir} failed in TF ({reason})'
      failed += f': {removed};' if removed else ':'
      # A load TF refused fails that program for the whole process, but a
      # second try traces its programs anew, under keys of their own. TF
      # reads its cache flags once per process and fails every compile it
      # cannot store: past a write fault only a new run goes, which finds
      # the cache full or read-only and only reads it. Workers end together:
      # one trying again alone would look lost to the others.
      workers = config.strategy == 'multi_worker'
      if first_try and not (workers or xla_cache.is_write_fault(fault)):
        console.say(f'note: {failed} training again, compiling anew')
        continue
      then = (
        'train from the start again (--fresh)'
        if _FRESH.value
        else 'resume from the last checkpoint'
      )
      cli.fail(
        f'{failed} run the same command{" on every worker" * workers} again'
        ' (--xla_cache_dir= compiles without the cache):'
        f' {"they" if workers else "it will"} {then}',
        1,
      )
  except Stopped as e:
    console.say(str(e))
    sys.exit(e.exit_code)
  except Interrupted as e:  # Before training began, or a second signal.
    raise Interrupted(
      e.signum,
      'stopped before a checkpoint was saved: run the same command to resume'
      ' from the last one, if any',
    ) from None


def _check_places() -> None:
  """What the flags name that TF or TFDS could not use, refused before TF
  starts and anything is written: a profiler port taken, a data dir that
  TFDS cannot take as a path."""
  env.check_port_free(_PROFILER_PORT.value)
  files.check_utf8(_DATA_DIR.value, 'data dir', 'data_dir')


def profiler_exposure(port: int) -> str:
  """The start line of a run with a profiler server: who can reach it.

  TF 2.21's Python API takes a port only; its server listens on every
  interface (`[::]:PORT`), without authentication.
  """
  return (
    f'profiler port {port} is open to the network: on every interface, without'
    ' authentication; on a shared machine, close it to others with a firewall'
    ' (docs/profiling.md)'
  )


def run() -> None:
  """The `xla-mnist-train` console script."""
  cli.run(main, parse_flags)


if __name__ == '__main__':
  run()
