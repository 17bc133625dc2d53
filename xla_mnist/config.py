"""Configs: the packaged ones by name, the values of the choice fields, and a
check that rejects values that cannot train, before any work starts.

Imports no TensorFlow: the CLI checks its flags and config before TF's import
(seconds), so that a usage error comes at once.
"""

import difflib
import importlib.util
import os
import re
import sys
import types

import ml_collections

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError

DATASETS = ('mnist', 'fashion_mnist')
JIT_MODES = ('off', 'on', 'auto')
DEVICES = ('auto', 'cpu', 'gpu', 'tpu')
STRATEGIES = ('default', 'mirrored', 'multi_worker', 'tpu')
# config.model: a packaged model (model.py), or a user's factory.
PACKAGED_MODELS = ('softmax', 'mlp', 'cnn')
# 'module:function', or a function's qualified name ('f.<locals>.g'), as a
# run records a factory passed from Python (zoo/factory.py).
_FACTORY = re.compile(r'[A-Za-z_][\w.]*:[A-Za-z_<][\w.<>]*')
# Whole-number fields: from their least sensible value to the largest of the
# dtype TF holds them in: int32 for a batch's index vectors and shapes
# (batch_size, steps_per_loop) and thread and device counts; int64 for the
# step counter and summaries' steps (num_steps and the step cadences) and the
# stateless shuffle's seed. A value TF cannot hold ends in a traceback, or
# wraps around.
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
}
# The learning rate is a float32 in the optimizer: finite there, and no
# smaller than float32's least normal number, below which XLA's CPU code
# flushes it to 0 (no training at all).
LR_RANGE = (2.0**-126, (2 - 2.0**-23) * 2.0**127)
# Threads and logical CPUs beyond this many per core the process may run on
# only wait for one another, and TF starts each at start-up: 100000 threads
# took minutes, without a word.
PER_CORE = 4
# What one step may allocate, against the machine's memory: its block of
# int32 indices (steps per call x batch) and a batch of float32 images, with
# their activations and gradients (a few copies); at most half the memory.
IMAGE_FLOATS = 28 * 28
# steps_per_loop = 0: a fused call's steps (jit 'on'); other modes take index
# blocks of this many steps too (program.py).
DEFAULT_STEPS_PER_LOOP = 100
BATCH_COPIES = 4
MEMORY_SHARE = 0.5

# The packaged configs: the repository's top-level `configs/`, installed as
# `xla_mnist.configs` (pyproject.toml's package-dir).
CONFIG_DIR = os.path.dirname(
  importlib.util.find_spec('xla_mnist.configs').origin
)


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
      f'no packaged config {name_or_path!r}: pass {errors.arg("config")} with'
      f" one of {', '.join(packaged())}, or a config file's path"
    )
  return os.path.join(CONFIG_DIR, f'{name_or_path}.py')


def resolve_argv(argv: list[str]) -> tuple[list[str], str]:
  """argv with its `--config=NAME` (or `--config NAME`) made the file's
  path, and the file the last one names (the default config's without one).

  The one reading of --config: train parses the result, compare names its
  workdir after the file.
  """
  resolved, path = list(argv), config_path('default')
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      path = config_path(arg.split('=', 1)[1])
      resolved[i] = f'--config={path}'
    elif arg == '--config' and i + 1 < len(argv):
      path = resolved[i + 1] = config_path(argv[i + 1])
  return resolved, path


def steps_per_loop(config: ml_collections.ConfigDict) -> int:
  """K, the steps of one call: 0 picks DEFAULT_STEPS_PER_LOOP for jit 'on'
  on one device, 1 otherwise; never more than the run's steps."""
  if config.steps_per_loop:
    return min(config.steps_per_loop, config.num_steps)
  fused = config.jit == 'on' and config.strategy == 'default'
  return min(DEFAULT_STEPS_PER_LOOP, config.num_steps) if fused else 1


def split_argv(argv: list[str]) -> tuple[list[str], str]:
  """argv without its `--config=NAME` (or `--config NAME`) arguments, and
  the file the last one names (`resolve_argv`): train loads that file itself
  (`load`), and absl parses the rest."""
  resolved, path = resolve_argv(argv)
  rest, skip = [], False
  for i, arg in enumerate(resolved):
    if skip:
      skip = False
    elif arg.startswith('--config='):
      continue
    elif arg == '--config' and i + 1 < len(resolved):
      skip = True
    else:
      rest.append(arg)
  return rest, path


def load(path: str) -> ml_collections.ConfigDict:
  """Config file `path`'s `get_config()`, which must hold exactly the
  recipe's fields (those of configs/default.py), each of its type.

  Raises UsageError naming the file and what is wrong in it: a misspelt
  field would otherwise train at the default, without a word.
  """
  module = _run(path)
  get_config = getattr(module, 'get_config', None)
  if not callable(get_config):
    raise UsageError(
      f'config file {path} defines no get_config(): define one that returns'
      ' the recipe (see configs/fashion_mnist.py)'
    )
  try:
    config = get_config()
  except Exception as e:  # noqa: BLE001 - the file's code: any fault is its.
    raise UsageError(
      f'config file {path}: get_config() raised'
      f' {errors.first_line(e, named=True)}: fix it'
    ) from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise UsageError(
      f'config file {path}: get_config() returned a {type(config).__name__},'
      ' not an ml_collections.ConfigDict: return the recipe, e.g.'
      ' xla_mnist.configs.default.get_config() with fields changed'
    )
  return _with_recipe_fields(config, path)


def _run(path: str) -> types.ModuleType:
  """The config file run as a module; its faults are one UsageError."""
  try:
    with open(path, 'rb') as f:
      code = compile(f.read(), path, 'exec')
  except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
    problem = 'is a folder' if os.path.isdir(path) else 'does not exist'
    raise UsageError(
      f'config file {path} {problem}: pass {errors.arg("config", "NAME")}'
      f" with a packaged config ({', '.join(packaged())}) or a config file's"
      ' path'
    ) from None
  except OSError as e:
    raise UsageError(
      f'cannot read config file {path} ({e.strerror}): make it readable'
    ) from None
  except SyntaxError as e:  # Null bytes too, without a line.
    where = f' line {e.lineno}' if e.lineno else ''
    raise UsageError(f'config file {path}{where}: {e.msg}: fix it') from None
  except ValueError as e:  # Null bytes: not a Python file.
    raise UsageError(
      f'config file {path} is not Python ({e}): fix it'
    ) from None
  module = types.ModuleType('xla_mnist_config')
  module.__file__ = path
  sys.modules[module.__name__] = module  # As an import would (dataclasses).
  try:
    exec(code, module.__dict__)  # noqa: S102 - a config file is Python.
  except Exception as e:  # noqa: BLE001 - the file's code: any fault is its.
    raise UsageError(
      f'config file {path} failed as it ran'
      f' ({errors.first_line(e, named=True)}): fix it'
    ) from None
  return module


# Fields whose type `check` refuses with their range (a whole number, a
# float32, True or False, one of the choices): the others are typed here.
_CHECKED_BY_VALUE = {
  *INT_FIELDS,
  *('learning_rate', 'dump_hlo', 'dataset', 'jit', 'device', 'strategy'),
}


def _with_recipe_fields(
  config: ml_collections.ConfigDict, path: str
) -> ml_collections.ConfigDict:
  """`config`, if it has exactly the recipe's fields, each of its type (a
  whole number where a float goes is made one)."""
  from xla_mnist.configs import default  # noqa: PLC0415 - the recipe.

  recipe = default.get_config()
  for name in config:
    if name not in recipe:
      near = difflib.get_close_matches(name, list(recipe), 1)
      fix = f'rename it {near[0]}' if near else 'remove it'
      raise UsageError(
        f'config file {path} sets config.{name}, which is no field of the'
        f' recipe: {fix} (the fields: configs/default.py)'
      )
  values = {}
  for name, want in recipe.items():
    if name not in config:
      raise UsageError(
        f'config file {path} has no field config.{name}: set it (the'
        f' default recipe has {want!r}), or start from'
        ' xla_mnist.configs.default.get_config()'
      )
    value = values[name] = config[name]
    if type(want) is float and type(value) is int:
      values[name] = float(value)
    elif type(value) is not type(want) and name not in _CHECKED_BY_VALUE:
      raise UsageError(
        f'config file {path} sets config.{name} to {value!r}, a'
        f' {type(value).__name__}: make it a {type(want).__name__}, as'
        f' {want!r}'
      )
  return ml_collections.ConfigDict(values)


def config_name(path: str) -> str:
  """A config file's name, as default workdirs say it: `fashion_mnist`."""
  return os.path.splitext(os.path.basename(path))[0]


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
      ' number from'
      f' {LR_RANGE[0]:.4g} to {LR_RANGE[1]:.4g} (float32), e.g. 0.5'
    )
  _check_model(config.model)
  _check_machine(config)
  if type(config.dump_hlo) is not bool:
    raise UsageError(
      f'dump_hlo is {config.dump_hlo!r}: set {errors.field("dump_hlo")} to True'
      ' or False'
    )
  if config.strategy != 'default':
    if config.steps_per_loop > 1 or config.dump_hlo:
      raise UsageError(
        f'{errors.field("strategy", config.strategy)} runs one step per call'
        ' with XLA on each replica only: drop'
        f' {errors.field("steps_per_loop")} and {errors.field("dump_hlo")}'
      )
    if config.device != 'auto':
      raise UsageError(
        f'{errors.field("device", config.device)} picks one device;'
        f' {errors.field("strategy", config.strategy)} picks its own: drop one'
        ' of the two'
      )


def _check_model(name: object) -> None:
  """A packaged model's name, or the form of a factory's: its import is
  TF's side (model.create_model)."""
  if name in PACKAGED_MODELS or (
    isinstance(name, str) and _FACTORY.fullmatch(name)
  ):
    return
  raise UsageError(
    f'model {name!r} is neither a packaged model nor a factory: set'
    f' {errors.field("model")} to one of {", ".join(PACKAGED_MODELS)}, or'
    " to 'package.module:factory' (docs/models.md)"
  )


def cores() -> int:
  """The cores this process may run on (its affinity, as a container's)."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def _check_machine(config: ml_collections.ConfigDict) -> None:
  """Raises UsageError for a number that would make the run allocate more
  than this machine has: threads, logical CPUs, a step's memory."""
  most = PER_CORE * cores()
  for field in ('cpu_threads', 'num_cpu_devices'):
    if config[field] > most:
      raise UsageError(
        f'{field} is {config[field]}, more than {PER_CORE} per core of the'
        f' {cores()} this process may use: set {errors.field(field)} to at'
        f' most {most}'
      )
  need, memory = step_bytes(config), _memory_bytes()
  if memory and need > MEMORY_SHARE * memory:
    raise UsageError(
      f'a call of {_calls_steps(config)} steps of batch_size'
      f' {config.batch_size} needs {need / 2**30:.1f} GiB, more than half'
      f" of this machine's {memory / 2**30:.1f} GiB: lower"
      f' {errors.field("steps_per_loop")} or {errors.field("batch_size")}'
    )


def step_bytes(config: ml_collections.ConfigDict) -> int:
  """What a call of the training program allocates for its batches."""
  indices = 4 * _calls_steps(config) * config.batch_size
  return indices + BATCH_COPIES * 4 * IMAGE_FLOATS * config.batch_size


def _calls_steps(config: ml_collections.ConfigDict) -> int:
  """The steps of an index block, as `program.make` takes them."""
  steps = config.steps_per_loop or DEFAULT_STEPS_PER_LOOP
  return max(min(steps, config.num_steps), DEFAULT_STEPS_PER_LOOP)


def _memory_bytes() -> int:
  """The machine's physical memory; 0 where the system does not say."""
  try:
    return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError):
    return 0
