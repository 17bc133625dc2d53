"""The models, each a Keras model from an image's pixels in [0, 1] to 10
logits: the seed's softmax regression, the packaged MLP and CNN, and a user's
own, `config.model = 'package.module:factory'` (docs/models.md).

The data stay uint8 [N, 28, 28, 1] in memory; the step casts a batch and
reshapes it to the model's input shape inside the compiled program, so that
XLA fuses the cast with the first layer.
"""

from __future__ import annotations

import importlib

import keras
import numpy as np
import tensorflow as tf

from xla_mnist.config import PACKAGED_MODELS
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError

NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28, 1)
NUM_FEATURES = 28 * 28  # A flattened (Fashion-)MNIST image.


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


def softmax() -> keras.Model:
  """Linear(10) on 784 inputs, W and b zero-initialised as in the TF1 program.

  The softmax itself lives in the loss, on raw logits, which is the
  numerically stable form.
  """
  pixels = keras.Input(shape=(NUM_FEATURES,), name='pixels')
  logits = Linear(NUM_CLASSES, name='linear')(pixels)
  return keras.Model(pixels, logits, name='softmax_regression')


def mlp() -> keras.Model:
  """Two hidden ReLU layers of 300 and 100 units (LeCun's LeNet-300-100)."""
  layers = keras.layers
  return keras.Sequential(
    [
      keras.Input(shape=(NUM_FEATURES,), name='pixels'),
      layers.Dense(300, activation='relu', name='hidden1'),
      layers.Dense(100, activation='relu', name='hidden2'),
      layers.Dense(NUM_CLASSES, name='logits'),
    ],
    name='mlp',
  )


def cnn() -> keras.Model:
  """Flax's MNIST example's CNN: two 3x3 convolutions (32, 64) each with a
  ReLU and a 2x2 average pool, then dense 256 with a ReLU and dense 10."""
  layers = keras.layers
  return keras.Sequential(
    [
      keras.Input(shape=IMAGE_SHAPE, name='image'),
      layers.Conv2D(32, 3, padding='same', activation='relu', name='conv1'),
      layers.AveragePooling2D(2, name='pool1'),
      layers.Conv2D(64, 3, padding='same', activation='relu', name='conv2'),
      layers.AveragePooling2D(2, name='pool2'),
      layers.Flatten(name='flatten'),
      layers.Dense(256, activation='relu', name='dense'),
      layers.Dense(NUM_CLASSES, name='logits'),
    ],
    name='cnn',
  )


# config.PACKAGED_MODELS names them before TF's import.
_PACKAGED = dict(zip(PACKAGED_MODELS, (softmax, mlp, cnn), strict=True))


def create_model(name: str = 'softmax', seed: int = 0) -> keras.Model:
  """The model `name` (config.model): a packaged one, or what a user's
  factory ('package.module:factory') returns, checked to take images and
  give 10 logits each. `seed` seeds Keras's initialisers, so that a run
  starts from the same weights every time.

  Raises UsageError naming what is wrong with a user's factory.
  """
  keras.utils.set_random_seed(seed % 2**32)
  if name in _PACKAGED:
    return _PACKAGED[name]()
  net = _call_factory(name, _factory(name))
  _check_outputs(name, net)
  return net


def _factory(name: str):
  """The callable 'package.module:factory' names, imported."""
  module_name, _, attribute = name.partition(':')
  fix = (
    f'put its folder on PYTHONPATH, or set {errors.field("model")} to one of'
    f' {", ".join(_PACKAGED)}'
  )
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise UsageError(
      f'model {name}: cannot import {module_name}'
      f' ({errors.first_line(e, named=True)}): {fix}'
    ) from None
  factory = getattr(module, attribute, None)
  if not callable(factory):
    problem = 'is not callable' if hasattr(module, attribute) else 'is missing'
    raise UsageError(
      f'model {name}: {module_name}.{attribute} {problem}: define'
      f' {attribute}(input_shape, num_classes) returning a Keras model there'
    )
  return factory


def _call_factory(name: str, factory) -> keras.Model:
  """`factory(input_shape, num_classes)`, which must return a Keras model."""
  try:
    net = factory(IMAGE_SHAPE, NUM_CLASSES)
  except Exception as e:  # noqa: BLE001 - the user's code: any fault is its.
    raise UsageError(
      f'model {name}: {name.partition(":")[2]}{(IMAGE_SHAPE, NUM_CLASSES)}'
      f' raised {errors.first_line(e, named=True)}: fix it'
    ) from None
  if not isinstance(net, keras.Model):
    raise UsageError(
      f'model {name} returned a {type(net).__name__}, not a Keras model:'
      ' return a keras.Model (e.g. keras.Sequential) from the factory'
    )
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
