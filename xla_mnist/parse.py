"""A run's recipe from the command line (train's and compare's one path): a
config file (a user's held to the recipe's fields by `user_config`), its
--config.x overrides, the flags that set fields. Every fault is one
UsageError (exit code 2) naming the file, field or flag, before TF's import
(seconds).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator

from absl import flags
from ml_collections import ConfigDict, config_flags

from xla_mnist import config as config_lib
from xla_mnist.configs import default
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError, UserError

# The repository's configs/, installed as xla_mnist.configs (pyproject.toml).
CONFIG_DIR = os.path.dirname(default.__file__)


def packaged() -> list[str]:
  """The names of the packaged configs."""
  return sorted(
    name.removesuffix('.py')
    for name in os.listdir(CONFIG_DIR)
    if name.endswith('.py') and not name.startswith('_')
  )


def config_path(name_or_path: str) -> str:
  """A packaged config's file, wherever installed; a path as it is."""
  if os.path.dirname(name_or_path) or name_or_path.endswith('.py'):
    return name_or_path
  if name_or_path not in packaged():
    raise UsageError(
      f'no packaged config {name_or_path!r}: pass {errors.arg("config")} with'
      f" one of {', '.join(packaged())}, or a config file's path"
    )
  return os.path.join(CONFIG_DIR, f'{name_or_path}.py')


def resolve_argv(argv: list[str]) -> tuple[list[str], str]:
  """argv without its --config flags, and the file the last one names (else
  the default's): train loads it (`load`), absl parses the rest."""
  name = value_of('--config', argv)
  path = config_path('default' if name is None else name)
  return without('--config', argv), path


def value_of(name: str, argv: list[str]) -> str | None:
  """The last value `argv` gives flag `name` (`--name=V` or `--name V`)."""
  found = None
  for i, arg in enumerate(argv):
    if arg.startswith(f'{name}='):
      found = arg.split('=', 1)[1]
    elif arg == name and i + 1 < len(argv):
      found = argv[i + 1]
  return found


def without(name: str, argv: list[str]) -> list[str]:
  """`argv` without flag `name` and its values, either spelling; a last
  `name` without a value stays, for the parser to refuse."""
  kept, skip = [], False
  for i, arg in enumerate(argv):
    if skip:
      skip = False
    elif arg == name and i + 1 < len(argv):
      skip = True
    elif not arg.startswith(f'{name}='):
      kept.append(arg)
  return kept


def loaded(path: str) -> ConfigDict:
  """Config file `path`'s recipe: a packaged one imported (the tests hold it
  to the recipe's fields), a user's read by `user_config`, loaded for it."""
  if os.path.dirname(path) == CONFIG_DIR:
    name = f'{default.__package__}.{config_name(path)}'
    return importlib.import_module(name).get_config()
  from xla_mnist import user_config  # noqa: PLC0415 - a user's file only.

  return user_config.load(path, packaged())


def config_name(path: str) -> str:
  """A config file's name, as default workdirs say it: `fashion_mnist`."""
  return os.path.splitext(os.path.basename(path))[0]


def define(fv: flags.FlagValues, argv: list[str]) -> list[str]:
  """Defines in `fv` --config (the file `argv` names, loaded) and the flags
  that set fields; returns the rest of `argv`, for `fv` to parse."""
  rest, path = resolve_argv(argv)
  choices = {
    'jit': (
      config_lib.JIT_MODES,
      'XLA mode: off = plain tf.function, on = jit_compile=True, auto ='
      ' auto-clustering.',
    ),
    'device': (config_lib.DEVICES, 'Where to run (auto: a GPU if any).'),
    'strategy': (
      config_lib.STRATEGIES,
      'tf.distribute strategy: default (one device), mirrored (local GPUs, or'
      ' --config.num_cpu_devices logical CPUs), multi_worker (from'
      ' TF_CONFIG), tpu.',
    ),
  }
  for name, (values, help_) in choices.items():
    help_ += f" Default: the config's {name} field."
    flags.DEFINE_enum(name, None, values, help_, flag_values=fv)
  flags.DEFINE_bool(
    'dump_hlo',
    None,
    'Write what XLA made of the step into the workdir: the HLO before and'
    ' after optimization with --jit=on, the clusters with --jit=auto.'
    " Default: the config's dump_hlo field.",
    flag_values=fv,
  )
  with _one_line():
    config_flags.DEFINE_config_dict(
      'config',
      loaded(path),
      'The recipe: a packaged config by name'
      f' ({", ".join(packaged())}) or a config file; override fields with'
      ' --config.x=value.',
      flag_values=fv,
      sys_argv=rest,
    )
  return rest


def parsed(
  fv: flags.FlagValues, argv: list[str], known_only: bool = False
) -> list[str]:
  """`fv(argv)`, a bad flag or override a UsageError; the arguments left."""
  with _one_line():
    return fv(argv, known_only=known_only)


def config_from(fv: flags.FlagValues) -> ConfigDict:
  """The config `fv` parsed, the field-setting flags applied, checked."""
  with _one_line():
    config = fv['config'].value  # Runs the overrides.
  with config.unlocked():
    for name in ('jit', 'device', 'strategy', 'dump_hlo'):
      if fv[name].value is not None:
        config[name] = fv[name].value
  config_lib.check(config)
  return config


def config_of(argv: list[str]) -> ConfigDict:
  """The config a train run of flags `argv` would take (others left alone):
  compare checks its runs' configs before the first starts."""
  fv = flags.FlagValues()
  parsed(fv, define(fv, ['train', *argv]), known_only=True)
  return config_from(fv)


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
  """Turns a fault of absl's or ml_collections' parse into a UsageError."""
  try:
    yield
  except UserError:
    raise  # A config file's own, already one line.
  except Exception as e:  # noqa: BLE001 - every parse failure is the user's.
    from xla_mnist import user_config  # noqa: PLC0415 - a fault only.

    raise UsageError(user_config.describe(e)) from None
