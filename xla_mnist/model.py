"""The seed's model: softmax regression, y = x @ W + b, as a tf.keras model."""

import tensorflow as tf

from xla_mnist import data

NUM_CLASSES = 10


def create_model() -> tf.keras.Model:
  """Dense(10) on 784 inputs, W and b zero-initialised as in the TF1 program.

  The softmax itself lives in the loss, on raw logits, which is the
  numerically stable form.
  """
  inputs = tf.keras.Input(shape=(data.NUM_FEATURES,), name='pixels')
  logits = tf.keras.layers.Dense(
    NUM_CLASSES,
    kernel_initializer='zeros',
    bias_initializer='zeros',
    name='dense',
  )(inputs)
  return tf.keras.Model(inputs, logits, name='softmax_regression')
