"""A user's model, `config.model = 'package.module:factory'`: imported and
called, each fault one line that names it (docs/models.md)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import keras

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError


def load(
  name: str, input_shape: tuple[int, ...], num_classes: int, fix: str
) -> keras.Model:
  """What `factory(input_shape, num_classes)` returns, which must be a Keras
  model; `fix` is the other way out for an import that fails."""
  call = _factory(name, fix)
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


def _factory(name: str, fix: str) -> Callable[..., object]:
  """The callable 'package.module:factory' names, imported."""
  module_name, _, attribute = name.partition(':')
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise UsageError(
      f'model {name}: cannot import {module_name}'
      f' ({errors.first_line(e, named=True)}): put its folder on PYTHONPATH,'
      f' {fix}'
    ) from None
  factory = getattr(module, attribute, None)
  if not callable(factory):
    problem = 'is not callable' if hasattr(module, attribute) else 'is missing'
    raise UsageError(
      f'model {name}: {module_name}.{attribute} {problem}: define'
      f' {attribute}(input_shape, num_classes) returning a Keras model there'
    )
  return factory
