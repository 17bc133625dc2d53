"""A user's model: `config.model = 'package.module:factory'`, imported and
called, or from Python the factory function itself; each fault one line that
names it (docs/models.md)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

import keras

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError


def name_of(factory: str | Callable[..., object]) -> str:
  """A factory's name as a run records it: the string as given, or a
  function's `module:qualified_name` (`__main__:my_model` in a notebook)."""
  if isinstance(factory, str):
    return factory
  module = getattr(factory, '__module__', None) or '__main__'
  return f'{module}:{getattr(factory, "__qualname__", type(factory).__name__)}'


def load(
  factory: str | Callable[..., object],
  input_shape: tuple[int, ...],
  num_classes: int,
  fix: str,
) -> keras.Model:
  """What `factory(input_shape, num_classes)` returns, which must be a Keras
  model; a name is imported first, and `fix` is the other way out for an
  import that fails."""
  name = name_of(factory)
  if isinstance(factory, keras.Model):
    raise UsageError(
      f'model {name} is a built Keras model, not a factory: pass a function'
      ' f(input_shape, num_classes) that builds it, so that each run builds'
      " it anew from the config's seed"
    )
  call = _imported(name, fix) if isinstance(factory, str) else factory
  if not callable(call):
    raise UsageError(
      f'model {name} is a {type(call).__name__}, not a function: pass'
      ' factory(input_shape, num_classes) returning a Keras model'
    )
  try:
    net = call(input_shape, num_classes)
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise UsageError(
      f'model {name}: {name.partition(":")[2]}{(input_shape, num_classes)}'
      f' raised {errors.first_line(e, named=True)}: fix it'
    ) from None
  if not isinstance(net, keras.Model):
    raise UsageError(
      f'model {name} returned a {type(net).__name__}, not a Keras model:'
      ' return a keras.Model (e.g. keras.Sequential) from the factory'
    )
  return net


def _imported(name: str, fix: str) -> Callable[..., object]:
  """The callable 'package.module:factory' names, imported as `python -m`
  would: from the current directory first, then PYTHONPATH, however the
  command was started (a console script's sys.path lacks the directory)."""
  module_name, _, attribute = name.partition(':')
  if module_name == '__main__' and not hasattr(
    sys.modules.get('__main__'), attribute.partition('.')[0]
  ):
    raise UsageError(
      f'model {name} is a function of another program (a notebook, a'
      ' script), which this process cannot import: put it in a module on'
      f' PYTHONPATH and name it module:{attribute}'
    )
  if os.getcwd() not in sys.path and '' not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise UsageError(
      f'model {name}: cannot import {module_name}'
      f' ({errors.first_line(e, named=True)}): put its folder on PYTHONPATH,'
      f' {fix}'
    ) from None
  found: object = module
  for part in attribute.split('.'):
    found = getattr(found, part, None)
  if not callable(found):
    problem = 'is not callable' if found is not None else 'is missing'
    raise UsageError(
      f'model {name}: {module_name}.{attribute} {problem}: define'
      f' {attribute}(input_shape, num_classes) returning a Keras model there'
    )
  return found
