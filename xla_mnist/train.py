r"""Trains the TF1 `mnist_softmax_xla.py` recipe in TF2 with XLA.

  python -m xla_mnist.train --config=configs/fashion_mnist.py --jit=on \
      --config.num_steps=2000

Hyperparameters live in the config file (`--config.x=...` overrides them);
flags choose where the run happens and where its outputs go.
"""

from __future__ import annotations

import os
import sys

# TF's C++ log has nothing for this CLI's users unless asked for: on a CPU
# machine it reports a failed CUDA probe, and on a compilation cache hit an
# error from TF trying to read the binary entry as text first. Must precede
# the TF import; TF_CPP_MIN_LOG_LEVEL=0 shows it all.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import ml_collections  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

# No TensorFlow yet: `main` imports it once the flags and the config have
# passed their checks, so that a usage error comes at once, not after TF's
# import (about 5 s).
from xla_mnist import config_check, hlo, outputs, xla_flags  # noqa: E402
from xla_mnist.errors import Stopped, UserError  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_JIT = flags.DEFINE_enum(
  'jit',
  None,
  config_check.JIT_MODES,
  'XLA mode: off = plain tf.function, on = jit_compile=True, auto ='
  " auto-clustering. Default: the config's jit field.",
)
_DEVICE = flags.DEFINE_enum(
  'device',
  None,
  config_check.DEVICES,
  "Where to run. Default: the config's device field (auto: a GPU if any).",
)
_STRATEGY = flags.DEFINE_enum(
  'strategy',
  None,
  config_check.STRATEGIES,
  'tf.distribute strategy: default (one device), mirrored (local GPUs, or'
  ' --config.num_cpu_devices logical CPUs), multi_worker (from TF_CONFIG),'
  " tpu. Default: the config's strategy field.",
)
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
_DUMP_HLO = flags.DEFINE_bool(
  'dump_hlo',
  None,
  'Write what XLA made of the step into the workdir: the HLO before and'
  ' after optimization with --jit=on, the clusters with --jit=auto.'
  " Default: the config's dump_hlo field.",
)
_XLA_CACHE_DIR = flags.DEFINE_string(
  'xla_cache_dir',
  os.path.join(
    os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'),
    'xla_mnist',
  ),
  "Keeps XLA's compiled programs here (TF's persistent compilation cache), so"
  ' that a later run of the same program loads them instead of compiling;'
  ' empty: compile every time. Unused with --jit=off, and with --dump_hlo'
  ' --jit=auto, whose cluster dumps need compiles.',
)

_CONFIG: flags.FlagHolder | None = None


def _fail(message: str, exit_code: int = 2) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(exit_code)


def _describe(error: Exception) -> str:
  """One line for an exception raised while reading flags or the config."""
  if isinstance(error, flags.Error):
    return f'{str(error).splitlines()[0]} (see --helpshort)'
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
  global _CONFIG
  try:
    # Defined here, not at import: config_flags reads the overrides in argv
    # as it is defined, and a bad one must end in a one-line error.
    _CONFIG = config_flags.DEFINE_config_file(
      'config',
      os.path.join(_REPO, 'configs', 'default.py'),
      'Config file with the recipe; override fields with --config.x=value.',
      sys_argv=argv,
    )
    rest = flags.FLAGS(argv)
    config = _apply_flags(_CONFIG.value)  # Loads the config file.
  except Exception as e:  # noqa: BLE001 - every parse failure is the user's.
    _fail(_describe(e))
  try:
    config_check.check(config)
    if cache_dir := _cache_dir(config):
      outputs.ensure_writable_dir(cache_dir, 'XLA cache dir', '--xla_cache_dir')
  except UserError as e:
    _fail(str(e), e.exit_code)
  # XLA's process-wide settings: here, before TF starts and reads them.
  if config.jit == 'auto':
    xla_flags.autocluster()
  if config.dump_hlo and config.jit == 'auto':
    cluster_dir = os.path.join(_workdir(config), hlo.CLUSTER_DIR)
    os.environ.update(hlo.auto_dump_env(cluster_dir))
  if cache_dir:
    xla_flags.cache_compilations(cache_dir)
  return rest


def _apply_flags(
  config: ml_collections.ConfigDict,
) -> ml_collections.ConfigDict:
  """The config with the values of --jit, --device, --strategy, --dump_hlo."""
  with config.unlocked():
    config.jit = _JIT.value or config.jit
    config.device = _DEVICE.value or config.device
    config.strategy = _STRATEGY.value or config.strategy
    if _DUMP_HLO.value is not None:
      config.dump_hlo = _DUMP_HLO.value
  return config


def _cache_dir(config: ml_collections.ConfigDict) -> str:
  """--xla_cache_dir, or '' where XLA never compiles (--jit=off) or must
  compile (for cluster dumps)."""
  unused = config.jit == 'off' or (config.dump_hlo and config.jit == 'auto')
  return '' if unused else _XLA_CACHE_DIR.value


def _cache_entries(directory: str) -> set[str]:
  return set(os.listdir(directory)) if directory else set()


def _workdir(config: ml_collections.ConfigDict) -> str:
  if _WORKDIR.value:
    return _WORKDIR.value
  config_file = config_flags.get_config_filename(flags.FLAGS['config'])
  name = os.path.splitext(os.path.basename(config_file))[0]
  return os.path.join('logs', f'{name}-{config.jit}')


def main(argv: list[str]) -> None:
  if not flags.FLAGS['verbosity'].present:  # TF and TFDS log INFO chatter.
    logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    _fail(f'unexpected arguments {" ".join(argv[1:])}: flags only')
  config = _CONFIG.value
  cache_dir = _cache_dir(config)
  cached = _cache_entries(cache_dir)
  from xla_mnist import trainer  # noqa: PLC0415 - imports TF: see the top.

  try:
    result = trainer.train_and_evaluate(
      config, _workdir(config), _DATA_DIR.value, fresh=_FRESH.value
    )
  except UserError as e:
    _fail(str(e), e.exit_code)
  except Stopped as e:
    print(e)
    sys.exit(e.exit_code)
  except KeyboardInterrupt:  # A second Ctrl-C: no save, no traceback.
    print('error: interrupted before a checkpoint was saved', file=sys.stderr)
    sys.exit(130)
  if cache_dir:
    stored = len(_cache_entries(cache_dir) - cached)
    print(
      f'XLA cache {cache_dir}: '
      + (f'{stored} compiled now, stored' if stored else 'all loaded from it')
    )
  print(result.summary())


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
