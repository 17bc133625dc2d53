"""A user's models module: a factory per case, written into tmp_path, and
made importable in the test's process."""

import sys
import textwrap

import pytest

# What a user's module may hold: a factory per case, written into tmp_path.
FACTORIES = textwrap.dedent(
  """
  import keras
  import tensorflow as tf


  def small(input_shape, num_classes):
    return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Flatten(),
      keras.layers.Dense(32, activation='relu'),
      keras.layers.Dense(num_classes),
    ])


  def wider(input_shape, num_classes):
    return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Flatten(),
      keras.layers.Dense(48, activation='relu'),
      keras.layers.Dense(num_classes),
    ])


  def not_a_model(input_shape, num_classes):
    return [input_shape, num_classes]


  def five_outputs(input_shape, num_classes):
    return keras.Sequential(
      [keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(5)]
    )


  def raises(input_shape, num_classes):
    raise RuntimeError('no weights file here')


  class Stringly(keras.layers.Layer):
    # AsString has no XLA kernel; the gradient flows around it.
    def call(self, x):
      zero = tf.strings.to_number(tf.strings.as_string(tf.reduce_sum(x) * 0))
      return x + tf.stop_gradient(zero)


  def stringly(input_shape, num_classes):
    return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Flatten(),
      Stringly(),
      keras.layers.Dense(num_classes),
    ])
  """
)


def importable(patch: pytest.MonkeyPatch, folder) -> None:
  """The `user_models` module in `folder` importable in this process, for
  runs trained here, and imported anew: an earlier test's, of another
  folder, would stay in sys.modules."""
  patch.syspath_prepend(str(folder))
  patch.delitem(sys.modules, 'user_models', raising=False)
