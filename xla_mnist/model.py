"""The seed's model: softmax regression, y = x @ W + b, as a tf.keras model."""

import tensorflow as tf

NUM_CLASSES = 10
NUM_FEATURES = 28 * 28  # A flattened (Fashion-)MNIST image.


def preprocess(images: tf.Tensor) -> tf.Tensor:
  """uint8 [B, 28, 28, 1] -> float32 [B, 784] in [0, 1].

  Called inside the training step, so that XLA fuses it with the first layer.
  """
  return tf.reshape(tf.cast(images, tf.float32) / 255.0, (-1, NUM_FEATURES))


class Linear(tf.keras.layers.Layer):
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


def create_model() -> tf.keras.Model:
  """Linear(10) on 784 inputs, W and b zero-initialised as in the TF1 program.

  The softmax itself lives in the loss, on raw logits, which is the
  numerically stable form.
  """
  inputs = tf.keras.Input(shape=(NUM_FEATURES,), name='pixels')
  logits = Linear(NUM_CLASSES, name='linear')(inputs)
  return tf.keras.Model(inputs, logits, name='softmax_regression')
