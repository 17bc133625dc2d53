"""Configs: the packaged ones by name, the values of the choice fields, and a
check that rejects values that cannot train, before any work starts.

Imports no TensorFlow: the CLI checks its flags and config before TF's import
(seconds), so that a usage error comes at once.
"""

import math
import os

import ml_collections

from xla_mnist.errors import UsageError

DATASETS = ('mnist', 'fashion_mnist')
JIT_MODES = ('off', 'on', 'auto')
DEVICES = ('auto', 'cpu', 'gpu', 'tpu')
STRATEGIES = ('default', 'mirrored', 'multi_worker', 'tpu')
# The packaged configs: `--config=fashion_mnist` names configs/fashion_mnist.py.
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs')


def packaged() -> list[str]:
  """The names of the configs that ship with the package."""
  return sorted(
    name.removesuffix('.py')
    for name in os.listdir(CONFIG_DIR)
    if name.endswith('.py') and not name.startswith('_')
  )


def config_path(name_or_path: str) -> str:
  """The file of a packaged config's name; a path is returned as it is.

  A bare name (no folder, no `.py`) is a packaged config, so that
  `--config=fashion_mnist` works wherever the package is installed.
  """
  if os.path.dirname(name_or_path) or name_or_path.endswith('.py'):
    return name_or_path
  if name_or_path not in packaged():
    raise UsageError(
      f'no packaged config {name_or_path!r}: pass --config with one of'
      f" {', '.join(packaged())}, or a config file's path"
    )
  return os.path.join(CONFIG_DIR, f'{name_or_path}.py')


def check(config: ml_collections.ConfigDict) -> None:
  """Raises UsageError naming the first bad field and what it accepts."""
  choices = {
    'dataset': DATASETS,
    'jit': JIT_MODES,
    'device': DEVICES,
    'strategy': STRATEGIES,
  }
  for field, allowed in choices.items():
    if config[field] not in allowed:
      raise UsageError(
        f'{field} {config[field]!r} is not one of {", ".join(allowed)}:'
        f' set config.{field} to one of them'
      )
  for field in ('num_steps', 'batch_size', 'log_every', 'keep_checkpoints'):
    if config[field] <= 0:
      raise UsageError(
        f'{field} is {config[field]}: set config.{field} to a whole'
        ' number above 0'
      )
  for field in (
    'steps_per_loop',
    'profile_steps',
    'cpu_threads',
    'checkpoint_every',
    'num_cpu_devices',
  ):
    if config[field] < 0:
      raise UsageError(
        f'{field} is {config[field]}: set config.{field} to 0 or more'
      )
  lr = config.learning_rate
  if not (math.isfinite(lr) and lr > 0):
    raise UsageError(
      f'learning_rate is {lr}: set config.learning_rate to a finite'
      ' number above 0, e.g. 0.5'
    )
  if config.strategy != 'default':
    if config.steps_per_loop > 1 or config.dump_hlo:
      raise UsageError(
        f'config.strategy={config.strategy} runs one step per call with XLA on'
        ' each replica only: drop config.steps_per_loop and config.dump_hlo'
      )
    if config.device != 'auto':
      raise UsageError(
        f'config.device={config.device} picks one device; config.strategy='
        f'{config.strategy} picks its own: drop one of the two flags'
      )
