"""A user's model: `config.model = 'package.module:factory'`, imported and
called, or from Python the factory function itself, and checked to take
the data's images, give a score per class for each and train; each fault
one line that names it (docs/models.md). Loaded only for a user's model:
the packaged ones are known good."""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError


def name_of(factory: str | Callable[..., object]) -> str:
  """A factory's name as a run records it: the string as given, or a
  function's `module:qualified_name` (`__main__:my_model` in a notebook)."""
  if isinstance(factory, str):
    return factory
  module = getattr(factory, '__module__', None) or '__main__'
  return f'{module}:{getattr(factory, "__qualname__", type(factory).__name__)}'


# The model's own input handling (`model.input_shape`, `model.inputs`),
# passed in: the zoo sits below the model module.
ShapeOf = Callable[[keras.Model], tuple[int, ...]]
Inputs = Callable[[keras.Model, tf.Tensor], tf.Tensor]
# How TF names each op XLA has no kernel for, when jit_compile=True fails.
_UNSUPPORTED = re.compile(r"No registered '(\w+)' OpKernel for XLA_")
# The names TF takes for a name scope in a tf.function, the outermost (the
# model's) and the others. Keras opens one of each layer's name as it calls
# it, and a name TF refuses fails after Keras has pushed it: that scope then
# stays open, a prefix on every variable the process makes after (Keras
# 3.15), so the check comes before any trace.
_OUTER_SCOPE = re.compile(r'[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*\Z')
_SCOPE = re.compile(r'[A-Za-z0-9_.\\/>-]*\Z')


def load(
  factory: str | Callable[..., object],
  input_shape: tuple[int, ...],
  num_classes: int,
  fix: str,
  *,
  shape_of: ShapeOf,
  inputs: Inputs,
) -> keras.Model:
  """What `factory(input_shape, num_classes)` returns, checked to be a Keras
  model that takes one image and gives `num_classes` float scores for each
  (`shape_of` and `inputs` say how it takes them); a name is imported first,
  and `fix` is the other way out for an import that fails."""
  name = name_of(factory)
  if isinstance(factory, keras.Model):
    raise UsageError(
      f'model {name} is a built Keras model, not a factory: pass a function'
      ' f(input_shape, num_classes) that builds it, so that each run builds'
      " it anew from the config's seed"
    )
  call = imported(name, fix) if isinstance(factory, str) else factory
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
  _check_names(name, net)
  # Its first call builds what the factory left unbuilt: under its policy.
  _check_scores(name, net, input_shape, num_classes, shape_of(net), inputs)
  return net


def _check_names(name: str, net: keras.Model) -> None:
  """UsageError for a model or layer name TF refuses as a name scope in a
  tf.function (`fit` fails on it too), before anything traces it."""
  layers = [net]
  while layers:
    layer = layers.pop()
    outer = layer is net
    if not (_OUTER_SCOPE if outer else _SCOPE).match(layer.name):
      what = 'is named' if outer else 'has a layer named'
      raise UsageError(
        f'model {name} {what} {layer.name!r}, which TF refuses as a name'
        ' scope in a tf.function (fit fails on it too): name it with letters,'
        " digits and . _ - only, the model's own not starting with _"
      )
    layers.extend(getattr(layer, 'layers', ()))


def imported(name: str, fix: str) -> Callable[..., object]:
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


def _check_scores(
  name: str,
  net: keras.Model,
  image_shape: tuple[int, ...],
  num_classes: int,
  shape: tuple[int, ...],
  inputs: Inputs,
) -> None:
  """The model takes one image (as `shape`) and gives `num_classes` float
  scores for each."""
  pixels = math.prod(image_shape)
  given = getattr(net, 'inputs', None) or ()
  if len(given) > 1:
    raise UsageError(
      f'model {name} takes {len(given)} inputs'
      f' ({", ".join(str(tuple(i.shape)) for i in given)}): give it'
      f' one, keras.Input(shape={image_shape}) or ({pixels},)'
    )
  if None in shape or math.prod(shape) != pixels:
    raise UsageError(
      f'model {name} takes inputs of shape {shape}, which do not hold a'
      f' {"x".join(map(str, image_shape))} image: build it on'
      f' keras.Input(shape={image_shape}) or ({pixels},)'
    )
  try:
    images = tf.zeros((2, *image_shape), tf.uint8)
    scores = net(inputs(net, images), training=False)
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise _fails(name, 'on a batch of images', e) from None
  fix = (
    f'end it with one keras.layers.Dense({num_classes}) (logits, or with'
    " activation='softmax')"
  )
  if not tf.is_tensor(scores):
    flat = tf.nest.flatten(scores)
    shapes = ', '.join(str(tuple(getattr(t, 'shape', ()))) for t in flat)
    if len(flat) == 1:
      fix = 'give the model its output tensor itself, not in a list'
    raise UsageError(
      f'model {name} gives {len(flat)} outputs ({shapes}) in a'
      f' {type(scores).__name__} for 2 images, not one tensor of shape'
      f' (2, {num_classes}): {fix}'
    )
  got = tuple(scores.shape)
  if got != (2, num_classes) or not scores.dtype.is_floating:
    raise UsageError(
      f'model {name} gives outputs of shape {got} ({scores.dtype.name}) for'
      f' 2 images, not (2, {num_classes}) floats: {fix}'
    )


def outputs(
  factory: str | Callable[..., object],
  net: keras.Model,
  inputs: Inputs,
  image_shape: tuple[int, ...],
) -> tuple[bool, str | None]:
  """Whether `net` gives probabilities rather than logits, as Keras's losses
  see it, and a note saying so: an output that a Softmax op makes, or that a
  Keras activation marks as holding its logits (`softmax`, `sigmoid`), read
  from one trace of the model; or, for a softmax written some other way,
  scores that are non-negative and sum to 1 on every image."""
  name = name_of(factory)
  marked = []

  def probe(images: tf.Tensor) -> tf.Tensor:
    scores = net(inputs(net, images), training=False)
    op = getattr(scores, 'op', None)
    marked.append(
      hasattr(scores, '_keras_logits') or getattr(op, 'type', '') == 'Softmax'
    )
    return tf.cast(scores, tf.float32)

  images = np.random.default_rng(0).integers(0, 256, (8, *image_shape))
  try:
    scores = tf.function(probe, autograph=False)(images.astype(np.uint8))
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise _fails(name, 'in a tf.function', e) from None
  scores = scores.numpy()
  sums_to_one = np.all(scores >= 0) and np.allclose(
    scores.sum(-1), 1, atol=1e-2
  )
  if not (marked[0] or sums_to_one):
    return False, None
  layer = net.layers[-1].name if getattr(net, 'layers', None) else net.name
  return True, (
    f'note: model {name} gives probabilities (its layer {layer!r}), not'
    " logits: it trains on them with Keras's sparse categorical"
    " cross-entropy, as fit does with loss='sparse_categorical_crossentropy'"
    ' (docs/models.md)'
  )


def check_gradients(
  name: str,
  net: keras.Model,
  grads: Callable[[], list[tf.Tensor | None]],
) -> str | None:
  """One training step's gradients, `grads()`, computed as the run's jit
  mode compiles them: each fault is one UsageError. Returns a note when
  some trainable weights get no gradient (fit warns and leaves them as they
  are; so does the run)."""
  if not net.trainable_variables:
    frozen = f' ({len(net.weights)} frozen)' if net.weights else ''
    raise UsageError(
      f'model {name} has no trainable weights{frozen}: nothing would'
      ' train; set trainable = True on the layers to train'
    )
  try:
    gradients = grads()
  except tf.errors.InvalidArgumentError as e:
    ops = _UNSUPPORTED.findall(str(e))
    if not ops:
      raise _fails(name, 'in a training step', e, try_jit=True) from None
    raise UsageError(
      f'model {name} holds ops XLA cannot compile'
      f' ({", ".join(dict.fromkeys(ops))}): {errors.field("jit", "off")} or'
      f' {errors.field("jit", "auto")} trains it'
    ) from None
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise _fails(name, 'in a training step', e, try_jit=True) from None
  variables = net.trainable_variables
  none = [
    v.path for v, g in zip(variables, gradients, strict=True) if g is None
  ]
  if len(none) == len(variables):
    raise UsageError(
      f'model {name}: no gradient reaches any trainable weight from'
      ' the loss (an op without a gradient, or outputs that do not depend on'
      ' the weights): nothing would train; make the outputs differentiable'
    )
  if none:
    return (
      f'note: model {name}: {len(none)} trainable weights get no'
      f' gradient and stay as they are, as fit leaves them: {", ".join(none)}'
    )
  return None


def _fails(
  name: str, where: str, error: Exception, try_jit: bool = False
) -> UsageError:
  fix = f'fix it, or try another {errors.field("jit")}' if try_jit else 'fix it'
  return UsageError(
    f'model {name} fails {where} ({errors.first_line(error, named=True)}):'
    f' {fix}'
  )
