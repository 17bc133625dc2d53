"""A user's model: `config.model = 'package.module:factory'`, imported and
called, or from Python the factory function itself, and checked to take
the data's images, give a score per class for each and train; each fault
one line that names it (docs/models.md). Loaded only for a user's model:
the packaged ones are known good."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
import sys
import weakref
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from xla_mnist.runtime import errors, streams
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
  _check_hooks(name, net)
  _check_names(name, net)
  # Its first call builds what the factory left unbuilt: under its policy.
  _check_scores(name, net, input_shape, num_classes, shape_of(net), inputs)
  _check_loss(name, net, input_shape, num_classes, inputs)
  return net


def _check_hooks(name: str, net: keras.Model) -> None:
  """UsageError for a `train_step` of the model's own: the loop computes
  each step's loss and gradients itself, to log the step's loss and to
  compile the gradients apart from the update under a tf.distribute
  strategy, so it cannot hand the step to a method that does all three."""
  if _overrides(net, 'train_step'):
    raise UsageError(
      f'model {name} overrides train_step, which the loop cannot call: it'
      " computes each step's loss and gradients itself (the loss it logs,"
      ' the gradients it compiles apart from the update under a strategy);'
      ' put the loss in an override of compute_loss, which it trains with as'
      ' fit does, and the update in compile(optimizer=...)'
    )


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


# Models whose own loss takes the labels one-hot (`_check_loss`), by model:
# each run builds its own, so nothing of one run's stays for the next.
_ONE_HOT: weakref.WeakSet[keras.Model] = weakref.WeakSet()


def own_loss(net: keras.Model) -> bool:
  """Whether `net` brings `fit`'s loss itself: compiled, or overriding
  `compute_loss` (`step.make_grads` asks the same, without this module)."""
  return net.compiled or _overrides(net, 'compute_loss')


def _overrides(net: keras.Model, method: str) -> bool:
  return getattr(type(net), method) is not getattr(keras.Model, method)


def _check_loss(
  name: str,
  net: keras.Model,
  image_shape: tuple[int, ...],
  num_classes: int,
  inputs: Inputs,
) -> None:
  """A model's own loss (`own_loss`) takes the data's integer labels, as
  `fit` is given them, or else only their one-hot rows, as a Keras user
  gives `fit` labels for a categorical loss (`keras.utils.to_categorical`):
  those the step gives it then. Probed on `num_classes + 1` images, so that
  labels [B] cannot broadcast against outputs [B, classes]. A loss that
  takes neither, or a compiled model without one (`fit` would train on
  `model.losses` alone), is one UsageError."""
  if not own_loss(net):
    return
  if getattr(net, 'loss', None) is None and not _overrides(net, 'compute_loss'):
    raise UsageError(
      f'model {name} is compiled without a loss, so fit would train it on'
      ' model.losses alone, or refuse: compile it with one (loss='
      "'sparse_categorical_crossentropy' for logits of integer labels), or"
      ' leave it uncompiled'
    )
  count = num_classes + 1
  x = inputs(net, tf.zeros((count, *image_shape), tf.uint8))
  scores = net(x, training=False)
  labels = tf.zeros(count, tf.int64)
  with streams.quiet_stderr():  # TF's C++ logs of a failure, said below.
    try:
      compute_loss(net, x, labels, scores)
      return
    except Exception as e:  # noqa: BLE001 - the user's loss: any fault is its.
      error = e
    try:
      compute_loss(net, x, tf.one_hot(labels, num_classes), scores)
    except Exception:  # noqa: BLE001 - said as the integer labels' fault.
      raise UsageError(
        f'model {name}: its {_loss_name(net)} fails on the integer labels'
        f' ({errors.first_line(error, named=True)}), and on them one-hot:'
        ' fix it'
      ) from None
  _ONE_HOT.add(net)


def compute_loss(
  net: keras.Model, x: tf.Tensor, y: tf.Tensor, y_pred: tf.Tensor
) -> tf.Tensor:
  """`net.compute_loss` as `fit`'s step calls it: `training=True` where it
  takes `training` (an override may not: Keras 3.3 added it)."""
  training = 'training' in inspect.signature(net.compute_loss).parameters
  return net.compute_loss(
    x=x, y=y, y_pred=y_pred, sample_weight=None,
    **({'training': True} if training else {}),
  )  # fmt: skip


def takes_one_hot(net: keras.Model) -> bool:
  """Whether `net`'s own loss takes the labels one-hot (`outputs` found)."""
  return net in _ONE_HOT


def fit_loss(
  net: keras.Model,
) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]:
  """`loss(x, labels, outputs)` as `fit` computes it for `net`, which
  brings its own (`own_loss`): its compiled loss plus `model.losses`, each
  divided among replicas as Keras divides them, or its `compute_loss`
  override; on the labels one-hot where its loss takes them so."""
  one_hot = net in _ONE_HOT

  def loss(x: tf.Tensor, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    if one_hot:
      labels = tf.one_hot(labels, outputs.shape[-1])
    return tf.cast(compute_loss(net, x, labels, outputs), tf.float32)

  return loss


def _loss_name(net: keras.Model) -> str:
  """The loss as the user gave it: their `compute_loss`, or compile()'s loss
  (a name, a Loss and its `from_logits`, a function)."""
  if _overrides(net, 'compute_loss'):
    return 'compute_loss'
  loss = net.loss
  if isinstance(loss, str):
    return f'loss {loss!r}'
  if isinstance(loss, keras.losses.Loss):
    logits = loss.get_config().get('from_logits')
    given = '' if logits is None else f'from_logits={logits}'
    return f'loss {type(loss).__name__}({given})'
  return f'loss {getattr(loss, "__name__", type(loss).__name__)}'


def optimizer_name(optimizer: keras.optimizers.Optimizer) -> str:
  """`Adam (learning rate 0.001)`: the class and its rate, or its schedule's
  class, and whether a LossScaleOptimizer wraps it."""
  inner = getattr(optimizer, 'inner_optimizer', optimizer)
  rate = inner.get_config()['learning_rate']
  rate = rate['class_name'] if isinstance(rate, dict) else f'{rate:.7g}'
  scaled = ', loss-scaled' if inner is not optimizer else ''
  return f'{type(inner).__name__} (learning rate {rate}{scaled})'


def _own_note(name: str, net: keras.Model) -> str:
  """The line that says what `net` trains with where it brings its own."""
  loss = _loss_name(net)
  if net in _ONE_HOT:
    loss += ', on the labels one-hot as it takes them'
  if getattr(net, 'optimizer', None) is None:
    return (
      f'note: model {name} trains with its own {loss}, as fit does, and the'
      " config's optimizer"
    )
  return (
    f'note: model {name} is compiled: it trains with its own'
    f' {optimizer_name(net.optimizer)} and its {loss}, as fit does'
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
  scores that are non-negative and sum to 1 on every image. A model with its
  own loss (`own_loss`) gets the note of what it trains with instead."""
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
  probabilities = bool(marked[0] or sums_to_one)
  if own_loss(net):  # Its own loss, not the loop's, takes the scores.
    return probabilities, _own_note(name, net)
  if not probabilities:
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
