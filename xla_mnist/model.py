"""The models, each a Keras model from an image's pixels in [0, 1] to 10
scores per image: the seed's softmax regression, the packaged MLP and CNN,
and a user's own, `config.model = 'package.module:factory'` or the factory
itself from Python (docs/models.md). A user's model may end in logits or in
probabilities (a softmax), as a model given to Keras's `fit` may.

The data stay uint8 [N, 28, 28, 1] in memory; the step casts a batch and
reshapes it to the model's input shape inside the compiled program, so that
XLA fuses the cast with the first layer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import keras
import tensorflow as tf

from xla_mnist.config import PACKAGED_MODELS
from xla_mnist.runtime import errors

NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28, 1)
NUM_FEATURES = 28 * 28  # A flattened (Fashion-)MNIST image.
# What a factory that cannot be loaded should do instead.
_FIX = f'or set {errors.field("model")} to one of {", ".join(PACKAGED_MODELS)}'


def preprocess(
  images: tf.Tensor, shape: tuple[int, ...] = (NUM_FEATURES,)
) -> tf.Tensor:
  """uint8 images [B, 28, 28, 1] -> float32 [B, *shape] in [0, 1]."""
  return tf.reshape(tf.cast(images, tf.float32) / 255.0, (-1, *shape))


def input_shape(net: keras.Model) -> tuple[int, ...]:
  """The shape of one image as `net` takes it: its Input's, or the image's
  for a model built without one. An Input's unknown sizes (None) are the
  image's where its rank is the image's, or all 784 pixels in one axis."""
  inputs = getattr(net, 'inputs', None)
  if not inputs:
    return IMAGE_SHAPE
  shape = tuple(inputs[0].shape[1:])
  if None not in shape:
    return shape
  if len(shape) == len(IMAGE_SHAPE):
    return tuple(
      want if got is None else got
      for got, want in zip(shape, IMAGE_SHAPE, strict=True)
    )
  return (NUM_FEATURES,) if len(shape) == 1 else shape


def inputs(net: keras.Model, images: tf.Tensor) -> tf.Tensor:
  """uint8 images -> what `net` takes, cast and reshaped in the step."""
  return preprocess(images, input_shape(net))


class Linear(keras.layers.Layer):
  """y = x @ W^T + b, with W stored as [units, features], as in torch's Linear.

  Keras's Dense stores [features, units]. With 10 units that layout makes
  XLA:CPU's dots slow: the forward dot writes a 10-wide output and the weight
  gradient x^T @ dy is another [784, 10] product. Stored as [10, 784], the
  gradient dy^T @ x writes rows 784 wide. Same maths; the fused training loop
  runs faster (docs/speed.md).
  """

  def __init__(self, units: int, **kwargs) -> None:
    super().__init__(**kwargs)
    self.units = units

  def build(self, input_shape: tuple[int | None, ...]) -> None:
    self.kernel = self.add_weight(
      name='kernel', shape=(self.units, input_shape[-1]), initializer='zeros'
    )
    self.bias = self.add_weight(
      name='bias', shape=(self.units,), initializer='zeros'
    )

  def call(self, inputs: tf.Tensor) -> tf.Tensor:
    return tf.matmul(inputs, self.kernel, transpose_b=True) + self.bias

  def get_config(self) -> dict:
    return {**super().get_config(), 'units': self.units}


def softmax(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Linear(10) on 784 inputs, W and b zero-initialised as in the TF1 program.

  The softmax itself lives in the loss, on raw logits, which is the
  numerically stable form.
  """
  pixels = keras.Input(shape=(math.prod(input_shape),), name='pixels')
  logits = Linear(num_classes, name='linear')(pixels)
  return keras.Model(pixels, logits, name='softmax_regression')


# A user's model: f(input_shape, num_classes) -> a Keras model.
Factory = Callable[[tuple[int, ...], int], keras.Model]


def _packaged(name: str) -> Factory:
  """A packaged model's function (config.PACKAGED_MODELS names them before
  TF's import); the zoo's module loads only for one of its models."""
  if name == 'softmax':
    return softmax
  from xla_mnist.zoo import packaged  # noqa: PLC0415

  return {'mlp': packaged.mlp, 'cnn': packaged.cnn}[name]


def name_of(model: str | Factory) -> str:
  """config.model's name for a model: a packaged one's or a factory's
  (`module:function` for the function itself)."""
  if isinstance(model, str):
    return model
  from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

  return factory.name_of(model)


def create_model(
  name: str | Factory = 'softmax', seed: int = 0, fix: str = _FIX
) -> keras.Model:
  """The model `name` (config.model): a packaged one, or what a user's
  factory returns ('package.module:factory', or the function itself),
  checked to take images and give 10 scores each. `seed` seeds Keras's
  initialisers and its layers' random seeds, so that a run starts from the
  same weights and draws the same random numbers every time.

  A factory that sets Keras's global dtype policy (`mixed_bfloat16`) sets it
  for its own model only: the policy is put back after the build, so that it
  cannot leak into the process's next model.

  Raises UsageError naming what is wrong with a user's factory; `fix` is
  the other way out when it cannot be imported.
  """
  keras.utils.set_random_seed(seed % 2**32)
  policy = keras.config.dtype_policy()
  try:
    if isinstance(name, str) and name in PACKAGED_MODELS:
      return _packaged(name)(IMAGE_SHAPE, NUM_CLASSES)
    from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

    return factory.load(
      name, IMAGE_SHAPE, NUM_CLASSES, fix, shape_of=input_shape, inputs=inputs
    )
  finally:
    keras.config.set_dtype_policy(policy)


def precision(net: keras.Model) -> str:
  """The dtype policy `net` trains under (`float32`, `mixed_bfloat16`, ...):
  the model's own, as `fit` reads it."""
  return net.dtype_policy.name


@dataclasses.dataclass(frozen=True)
class Outputs:
  """What a model's scores are: logits, or probabilities (a softmax ends
  it); `layer` names the layer that gives them."""

  probabilities: bool
  layer: str


def outputs(net: keras.Model, name: str | Factory) -> Outputs:
  """Whether `net` gives probabilities rather than logits, as Keras's losses
  see it; the packaged models give logits, a user's is probed
  (`zoo.factory.gives_probabilities`)."""
  layer = net.layers[-1].name if getattr(net, 'layers', None) else net.name
  if isinstance(name, str) and name in PACKAGED_MODELS:
    return Outputs(False, layer)
  from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

  probabilities = factory.gives_probabilities(
    name_of(name), net, inputs, IMAGE_SHAPE
  )
  return Outputs(probabilities, layer)
