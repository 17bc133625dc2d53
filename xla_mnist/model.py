"""The models: Keras models from pixels in [0, 1] to a score per class,
logits or probabilities as under `fit`: the seed's softmax, the zoo's, a user's
(docs/models.md). The data stay uint8 in memory; the step casts a batch inside
the compiled program, so that XLA fuses the cast with the first layer."""

from __future__ import annotations

import math
from collections.abc import Callable

import keras
import tensorflow as tf

from xla_mnist.config import PACKAGED_MODELS
from xla_mnist.runtime import errors

# What a factory that cannot be loaded should do instead.
FIX = f'or set {errors.field("model")} to one of {", ".join(PACKAGED_MODELS)}'


def preprocess(images: tf.Tensor, shape: tuple[int, ...]) -> tf.Tensor:
  """uint8 images [B, *image] -> float32 [B, *shape] in [0, 1]."""
  return tf.reshape(tf.cast(images, tf.float32) / 255.0, (-1, *shape))


def input_shape(net: keras.Model, image: tuple[int, ...]) -> tuple[int, ...]:
  """One image's shape as `net` takes it (no Input: `image`, the data's).
  Unknown sizes are the image's at its rank, or all its values in one
  axis."""
  inputs = getattr(net, 'inputs', None)
  if not inputs:
    return image
  shape = tuple(inputs[0].shape[1:])
  if None not in shape:
    return shape
  if len(shape) == len(image):
    return tuple(
      w if g is None else g for g, w in zip(shape, image, strict=True)
    )
  return (math.prod(image),) if len(shape) == 1 else shape


def inputs(net: keras.Model, images: tf.Tensor) -> tf.Tensor:
  """uint8 images [B, *image] -> what `net` takes (integer Input: 0..255)."""
  shape = input_shape(net, tuple(images.shape[1:]))
  if 'int' in str(getattr(net, 'inputs', None) and net.inputs[0].dtype):
    return tf.reshape(tf.cast(images, net.inputs[0].dtype), (-1, *shape))
  return preprocess(images, shape)


class Linear(keras.layers.Layer):
  """y = x @ W^T + b, W stored [units, features] as torch's Linear, not as
  Dense's [features, units]: XLA:CPU's weight-gradient dot then writes rows
  784 wide, not 10, and the fused loop runs faster (docs/speed.md)."""

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
  """Linear(classes) on every pixel, zeros as in the TF1 program; the
  softmax is in the loss, on logits, its numerically stable form."""
  pixels = keras.Input(shape=(math.prod(input_shape),), name='pixels')
  logits = Linear(num_classes, name='linear')(pixels)
  return keras.Model(pixels, logits, name='softmax_regression')


# A user's model: f(input_shape, num_classes) -> a Keras model.
Factory = Callable[[tuple[int, ...], int], keras.Model]


def _packaged(name: str) -> Factory:
  """A packaged model's function; the zoo loads only for one of its own."""
  if name == 'softmax':
    return softmax
  from xla_mnist.zoo import packaged  # noqa: PLC0415

  return {'mlp': packaged.mlp, 'cnn': packaged.cnn}[name]


def create_model(
  name: str | Factory = 'softmax',
  seed: int = 0,
  fix: str = FIX,
  *,
  image_shape: tuple[int, ...],
  num_classes: int,
  precision: str = 'float32',
) -> keras.Model:
  """The model config.model names, built for the data's images of
  `image_shape` and its `num_classes`; a user's is checked to take them
  and give a score per class (a UsageError names the fault; `fix`, the way
  out when it cannot be imported). `seed` seeds Keras's initialisers and
  layers' seeds, so a run starts and draws alike every time. Built under
  the dtype policy `precision` names (a factory may set its own), which is
  put back after the build: it must not leak into the next model."""
  keras.utils.set_random_seed(seed % 2**32)
  policy = keras.config.dtype_policy()
  keras.config.set_dtype_policy(precision)
  try:
    if isinstance(name, str) and name in PACKAGED_MODELS:
      return _packaged(name)(image_shape, num_classes)
    from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

    return factory.load(
      name, image_shape, num_classes, fix, inputs=inputs,
      shape_of=lambda net: input_shape(net, image_shape),
    )  # fmt: skip
  finally:
    keras.config.set_dtype_policy(policy)


def outputs(
  net: keras.Model, name: str | Factory, image: tuple[int, ...]
) -> tuple[bool, str | None]:
  """Whether `net` gives probabilities rather than logits, as Keras's losses
  see it, and a note saying so: the packaged models give logits, a user's
  is probed."""
  if isinstance(name, str) and name in PACKAGED_MODELS:
    return False, None
  from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

  return factory.outputs(name, net, inputs, image)
