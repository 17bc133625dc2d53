"""The recipe's fields: each choice's values, each number's range, and
`check`, which rejects a config that cannot train before any work starts,
from the command line (`parse`) and from Python alike. Imports no
TensorFlow: a usage error comes at once, not after TF's import."""

import re

import ml_collections

from xla_mnist.datasets import sources
from xla_mnist.runtime import errors, process
from xla_mnist.runtime.errors import UsageError

JIT_MODES = ('off', 'on', 'auto')
# docs/data.md, "In memory or streamed".
INPUTS = ('auto', 'resident', 'stream')
DEVICES = ('auto', 'cpu', 'gpu', 'tpu')
STRATEGIES = ('default', 'mirrored', 'multi_worker', 'tpu')
PRECISIONS = ('float32', 'mixed_bfloat16', 'mixed_float16')  # Keras's policies.
# config.model: a packaged model (model.py), or a user's factory.
PACKAGED_MODELS = ('softmax', 'mlp', 'cnn')
# 'module:function', or a function's qualified name ('f.<locals>.g'), as a
# run records a factory passed from Python (zoo/factory.py).
_FACTORY = re.compile(r'[A-Za-z_][\w.]*:[A-Za-z_<][\w.<>]*')
# Whole-number fields, from their least sensible value to the largest of the
# dtype TF holds them in (int32: index vectors, shapes, thread counts; int64:
# the step counter, summaries' steps, the shuffle's seed): a value beyond
# ends in a traceback, or wraps around.
INT_MAX = {'int32': 2**31 - 1, 'int64': 2**63 - 1}
INT_FIELDS = {  # field: (least value, dtype)
  'num_steps': (1, 'int64'),
  'batch_size': (1, 'int32'),
  'steps_per_loop': (0, 'int32'),
  'log_every': (1, 'int64'),
  'profile_steps': (0, 'int64'),
  'checkpoint_every': (0, 'int64'),
  'keep_checkpoints': (1, 'int64'),
  'cpu_threads': (0, 'int32'),
  'num_cpu_devices': (0, 'int32'),
  'seed': (-(2**63), 'int64'),
  'image_size': (0, 'int32'),
}
# The learning rate, a float32 in the optimizer: finite, and no smaller than
# float32's least normal number, below which XLA:CPU flushes it to 0.
LR_RANGE = (2.0**-126, (2 - 2.0**-23) * 2.0**127)
# steps_per_loop = 0: a fused call's K; the other modes' index blocks too.
DEFAULT_STEPS_PER_LOOP = 100


def steps_per_loop(config: ml_collections.ConfigDict) -> int:
  """K, the steps of one call, at most the run's: 0 picks
  DEFAULT_STEPS_PER_LOOP for jit 'on' on one device, else 1."""
  if config.steps_per_loop:
    return min(config.steps_per_loop, config.num_steps)
  fused = config.jit == 'on' and config.strategy == 'default'
  return min(DEFAULT_STEPS_PER_LOOP, config.num_steps) if fused else 1


def plain_sgd(config: ml_collections.ConfigDict) -> bool:
  """SGD at a constant rate and nothing else set, the TF1 program's: checked
  and built without loading `optimizers` (docs/training.md)."""
  groups = (*config.optimizer_args.values(), *config.schedule_args.values())
  named = (config.optimizer, config.schedule) == ('sgd', 'constant')
  return named and all(value is None for value in groups)


def check(config: ml_collections.ConfigDict) -> None:
  """Raises UsageError naming the first bad field and what it accepts."""
  sources.check(config)
  choices = {
    'jit': JIT_MODES,
    'input': INPUTS,
    'device': DEVICES,
    'strategy': STRATEGIES,
    'precision': PRECISIONS,
  }
  for field, allowed in choices.items():
    if config[field] not in allowed:
      raise UsageError(
        f'{field} {config[field]!r} is not one of {", ".join(allowed)}:'
        f' set {errors.field(field)} to one of them'
      )
  for field, (low, dtype) in INT_FIELDS.items():
    value = config[field]
    if type(value) is not int or not low <= value <= INT_MAX[dtype]:
      raise UsageError(
        f'{field} is {value!r}: set {errors.field(field)} to a whole number'
        f' from {low} to {INT_MAX[dtype]} ({dtype})'
      )
  lr = config.learning_rate
  if type(lr) not in (int, float) or not LR_RANGE[0] <= lr <= LR_RANGE[1]:
    raise UsageError(
      f'learning_rate is {lr!r}: set {errors.field("learning_rate")} to a'
      f' number from {LR_RANGE[0]:.4g} to {LR_RANGE[1]:.4g} (float32), e.g. 0.5'
    )
  if not plain_sgd(config):
    from xla_mnist import optimizers  # noqa: PLC0415 - beyond plain SGD only.

    optimizers.check(config)
  name = config.model  # A factory's import needs TF: the trainer's.
  if name not in PACKAGED_MODELS and not (
    isinstance(name, str) and _FACTORY.fullmatch(name)
  ):
    raise UsageError(
      f'model {name!r} is neither a packaged model nor a factory: set'
      f' {errors.field("model")} to one of {", ".join(PACKAGED_MODELS)}, or'
      " to 'package.module:factory' (docs/models.md)"
    )
  process.check_machine(config)
  process.check_memory(config, DEFAULT_STEPS_PER_LOOP)  # The data's: later.
  if type(config.dump_hlo) is not bool:
    raise UsageError(
      f'dump_hlo is {config.dump_hlo!r}: set {errors.field("dump_hlo")} to True'
      ' or False'
    )
  if config.strategy != 'default':
    if config.steps_per_loop > 1 or config.dump_hlo or config.input == 'stream':
      raise UsageError(
        f'{errors.field("strategy", config.strategy)} runs one step per call'
        ' with XLA on each replica, on resident data only: drop'
        f' {errors.field("steps_per_loop")}, {errors.field("dump_hlo")} and'
        f' {errors.field("input")}'
      )
    if config.device != 'auto':
      raise UsageError(
        f'{errors.field("device", config.device)} picks one device;'
        f' {errors.field("strategy", config.strategy)} picks its own: drop one'
        ' of the two'
      )
