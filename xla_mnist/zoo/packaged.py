"""The packaged models beside the softmax, with a user factory's contract:
`f(input_shape, num_classes)` returns a Keras model from pixels in [0, 1]
to scores (these give logits)."""

from __future__ import annotations

import math

import keras


def mlp(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Two hidden ReLU layers of 300 and 100 units (LeCun's LeNet-300-100)."""
  layers = keras.layers
  return keras.Sequential(
    [
      keras.Input(shape=(math.prod(input_shape),), name='pixels'),
      layers.Dense(300, activation='relu', name='hidden1'),
      layers.Dense(100, activation='relu', name='hidden2'),
      layers.Dense(num_classes, name='logits'),
    ],
    name='mlp',
  )


def cnn(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Flax's MNIST example's CNN: two 3x3 convolutions (32, 64) each with a
  ReLU and a 2x2 average pool, then dense 256 with a ReLU and a dense
  layer of a score per class."""
  layers = keras.layers
  return keras.Sequential(
    [
      keras.Input(shape=input_shape, name='image'),
      layers.Conv2D(32, 3, padding='same', activation='relu', name='conv1'),
      layers.AveragePooling2D(2, name='pool1'),
      layers.Conv2D(64, 3, padding='same', activation='relu', name='conv2'),
      layers.AveragePooling2D(2, name='pool2'),
      layers.Flatten(name='flatten'),
      layers.Dense(256, activation='relu', name='dense'),
      layers.Dense(num_classes, name='logits'),
    ],
    name='cnn',
  )
