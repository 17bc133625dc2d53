"""What a user's config makes of the recipe, loaded for it only: their
config file, read and held to the recipe's fields (a misspelt field would
train at the default, silently), and a fault of their flags or overrides
(`parse`), each one UsageError naming the file, field or flag, before TF's
import."""

from __future__ import annotations

import difflib
import os
import sys
import types

from absl import flags
from ml_collections import ConfigDict

from xla_mnist.configs import default
from xla_mnist.runtime import cli, errors
from xla_mnist.runtime.errors import UsageError


def load(path: str, packaged: list[str]) -> ConfigDict:
  """Config file `path`'s `get_config()`, held to the recipe's fields; a
  missing file's line names the `packaged` configs."""
  try:
    with open(path, 'rb') as f:
      code = compile(f.read(), path, 'exec')
  except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
    problem = 'is a folder' if os.path.isdir(path) else 'does not exist'
    raise UsageError(
      f'config file {path} {problem}: pass {errors.arg("config", "NAME")}'
      f" with a packaged config ({', '.join(packaged)}) or a config file's"
      ' path'
    ) from None
  except OSError as e:
    raise UsageError(
      f'cannot read config file {path} ({e.strerror}): make it readable'
    ) from None
  except (SyntaxError, ValueError) as e:  # ValueError: null bytes, <3.11.
    where = f' line {e.lineno}' if getattr(e, 'lineno', None) else ''
    said = getattr(e, 'msg', e)
    raise UsageError(f'config file {path}{where}: {said}: fix it') from None
  module = types.ModuleType('xla_mnist_config')
  module.__file__ = path
  sys.modules[module.__name__] = module  # As an import would (dataclasses).
  try:
    exec(code, module.__dict__)  # noqa: S102 - a config file is Python.
    get_config = getattr(module, 'get_config', None)
    config = get_config() if callable(get_config) else None
  except Exception as e:  # noqa: BLE001 - the file's code: any fault is its.
    raise UsageError(
      f'config file {path} raised {errors.first_line(e, named=True)}: fix it'
    ) from None
  if not callable(get_config):
    raise UsageError(
      f'config file {path} defines no get_config(): define one that returns'
      ' the recipe (see configs/fashion_mnist.py)'
    )
  if not isinstance(config, ConfigDict):
    raise UsageError(
      f'config file {path}: get_config() returned a {type(config).__name__},'
      ' not an ml_collections.ConfigDict: return the recipe, e.g.'
      ' xla_mnist.configs.default.get_config() with fields changed'
    )
  return _with_recipe_fields(config, path)


def _with_recipe_fields(config: ConfigDict, path: str) -> ConfigDict:
  """`config`, if it has exactly the recipe's fields; an int where a float
  goes made one (`config.check` refuses other wrong types, with ranges)."""
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
    elif type(want) is str and type(value) is not str:
      raise UsageError(
        f'config file {path} sets config.{name} to {value!r}, a'
        f' {type(value).__name__}: make it a str, as {want!r}'
      )
  return ConfigDict(values)


def describe(error: Exception) -> str:
  """One line for an exception raised while reading flags or the config."""
  if isinstance(error, flags.Error):
    return cli.bad_flag(error)
  while error.args and isinstance(error.args[0], Exception):
    error = error.args[0]  # ml_collections' KeyError, in an AttributeError.
  if not isinstance(error, KeyError):
    return f'cannot load the config: {errors.first_line(error, named=True)}'
  # "'name'", then perhaps 'Did you mean ...?'.
  name, _, hint = str(error.args[0] if error.args else '').partition('\n')
  name, hint = name.strip('\'"'), hint.strip()
  fix = hint[:1].lower() + hint[1:] if hint else 'see configs/default.py'
  return f'config has no field {name}: {fix}'
