"""What a config may hold: the values of its choice fields, and a check that
rejects values that cannot train, before any work starts.

Imports no TensorFlow: the CLI checks its flags and config before TF's import
(about 5 s), so that a usage error comes at once.
"""

import math

import ml_collections

from xla_mnist.errors import UsageError

DATASETS = ('mnist', 'fashion_mnist')
JIT_MODES = ('off', 'on', 'auto')
DEVICES = ('auto', 'cpu', 'gpu', 'tpu')
STRATEGIES = ('default', 'mirrored', 'multi_worker', 'tpu')


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
        f' set --config.{field} (or --{field}) to one of them'
      )
  for field in ('num_steps', 'batch_size', 'log_every', 'keep_checkpoints'):
    if config[field] <= 0:
      raise UsageError(
        f'{field} is {config[field]}: set --config.{field} to a whole'
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
        f'{field} is {config[field]}: set --config.{field} to 0 or more'
      )
  lr = config.learning_rate
  if not (math.isfinite(lr) and lr > 0):
    raise UsageError(
      f'learning_rate is {lr}: set --config.learning_rate to a finite'
      ' number above 0, e.g. 0.5'
    )
  if config.strategy != 'default':
    if config.steps_per_loop > 1 or config.dump_hlo:
      raise UsageError(
        f'--strategy={config.strategy} runs one step per call with XLA on'
        ' each replica only: drop --config.steps_per_loop and --dump_hlo'
      )
    if config.device != 'auto':
      raise UsageError(
        f'--device={config.device} picks one device; --strategy='
        f'{config.strategy} picks its own: drop one of the two flags'
      )
