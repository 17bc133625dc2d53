"""The models, each a Keras model from an image's pixels in [0, 1] to 10
logits: the seed's softmax regression, the packaged MLP and CNN, and a user's
own, `config.model = 'package.module:factory'` (docs/models.md).

The data stay uint8 [N, 28, 28, 1] in memory; the step casts a batch and
reshapes it to the model's input shape inside the compiled program, so that
XLA fuses the cast with the first layer.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from keras.src.utils import naming

from xla_mnist.config import PACKAGED_MODELS
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError
from xla_mnist.zoo import factory, packaged

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
  for a model built without one."""
  inputs = getattr(net, 'inputs', None)
  return tuple(inputs[0].shape[1:]) if inputs else IMAGE_SHAPE


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


# config.PACKAGED_MODELS names them before TF's import.
_PACKAGED = dict(
  zip(PACKAGED_MODELS, (softmax, packaged.mlp, packaged.cnn), strict=True)
)


def create_model(
  name: str = 'softmax', seed: int = 0, fix: str = _FIX
) -> keras.Model:
  """The model `name` (config.model): a packaged one, or what a user's
  factory ('package.module:factory') returns, checked to take images and
  give 10 logits each. `seed` seeds Keras's initialisers, so that a run
  starts from the same weights every time.

  Its weights' paths (the checkpoint's fingerprint holds them) are the same
  in every process: Keras names an unnamed layer after those built before it
  in the process (`dense_2`), and training builds a user's model twice (once
  to check it) where the export builds it once; so the counters restart.

  Raises UsageError naming what is wrong with a user's factory; `fix` is
  the other way out when it cannot be imported.
  """
  keras.utils.set_random_seed(seed % 2**32)
  naming.reset_uids()
  if name in _PACKAGED:
    return _PACKAGED[name](IMAGE_SHAPE, NUM_CLASSES)
  net = factory.load(name, IMAGE_SHAPE, NUM_CLASSES, fix=fix)
  _check_outputs(name, net)
  return net


def _check_outputs(name: str, net: keras.Model) -> None:
  """The model called on two images must give [2, 10] float logits."""
  shape = input_shape(net)
  if int(np.prod(shape)) != NUM_FEATURES:
    raise UsageError(
      f'model {name} takes inputs of shape {shape}, which do not hold a 28x28'
      f' image: build it on keras.Input(shape={IMAGE_SHAPE}) or'
      f' ({NUM_FEATURES},)'
    )
  images = tf.zeros((2, *IMAGE_SHAPE), tf.uint8)
  try:
    logits = net(inputs(net, images), training=False)
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise UsageError(
      f'model {name} fails on a batch of images'
      f' ({errors.first_line(e, named=True)}): fix it'
    ) from None
  got = tuple(getattr(logits, 'shape', ()))
  if got != (2, NUM_CLASSES) or not logits.dtype.is_floating:
    raise UsageError(
      f'model {name} gives outputs of shape {got} for 2 images, not'
      f' (2, {NUM_CLASSES}) float logits: end it with'
      f' keras.layers.Dense({NUM_CLASSES}), no softmax (the loss applies it)'
    )
