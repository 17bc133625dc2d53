"""Ordinary Keras models, each a factory `f(input_shape, num_classes)` as
`config.model` takes it: the panel that the loop must train as Keras's own
`fit` does (tests/unit/test_keras_fit.py). Importable by name from a subprocess
(`support.keras_panel:dropout`, with tests/ on PYTHONPATH)."""

from __future__ import annotations

import math

import keras

layers = keras.layers


def _pixels(input_shape: tuple[int, ...]) -> keras.Input:
  return keras.Input(shape=(math.prod(input_shape),))


def dense_l2(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Weight and activity regularizers (Sequential)."""
  return keras.Sequential(
    [
      _pixels(input_shape),
      layers.Dense(
        32,
        activation='relu',
        kernel_regularizer=keras.regularizers.L2(0.05),
        activity_regularizer=keras.regularizers.L2(1e-3),
      ),
      layers.Dense(num_classes, kernel_regularizer=keras.regularizers.L1(0.01)),
    ]
  )


def bare(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """`dense_l2` without its regularizers."""
  return keras.Sequential(
    [
      _pixels(input_shape),
      layers.Dense(32, activation='relu'),
      layers.Dense(num_classes),
    ]
  )


def l2_strong(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """`bare` with an L2(1.0) on every kernel: kernels shrink."""
  l2 = keras.regularizers.L2(1.0)
  return keras.Sequential(
    [
      _pixels(input_shape),
      layers.Dense(32, activation='relu', kernel_regularizer=l2),
      layers.Dense(num_classes, kernel_regularizer=l2),
    ]
  )


class _Penalty(layers.Layer):
  """Adds a loss of its input's mean square, through `add_loss`."""

  def call(self, x):
    self.add_loss(0.1 * keras.ops.mean(keras.ops.square(x)))
    return x


def add_loss(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """A layer's `add_loss` (functional)."""
  pixels = _pixels(input_shape)
  hidden = _Penalty()(layers.Dense(32, activation='tanh')(pixels))
  return keras.Model(pixels, layers.Dense(num_classes)(hidden))


class Subclassed(keras.Model):
  def __init__(self, num_classes: int) -> None:
    super().__init__()
    self.flatten = layers.Flatten()
    self.hidden = layers.Dense(24, activation='relu')
    self.dropout = layers.Dropout(0.2)
    self.out = layers.Dense(num_classes)

  def call(self, x, training=False):
    x = self.dropout(self.hidden(self.flatten(x)), training=training)
    return self.out(x)


def subclassed(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """A subclassed model, built without an Input, with a Dropout."""
  return Subclassed(num_classes)


def batchnorm(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """BatchNormalization's moving statistics: non-trainable state."""
  return keras.Sequential(
    [
      _pixels(input_shape),
      layers.Dense(32),
      layers.BatchNormalization(),
      layers.Activation('relu'),
      layers.Dense(num_classes),
    ]
  )


def dropout(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Dropout's random numbers: a seed generator's state."""
  return keras.Sequential(
    [
      _pixels(input_shape),
      layers.Dense(64, activation='relu'),
      layers.Dropout(0.3),
      layers.Dense(num_classes),
    ]
  )


def noise(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """GaussianNoise and a Dropout: two seed generators."""
  return keras.Sequential(
    [
      _pixels(input_shape),
      layers.GaussianNoise(0.1),
      layers.Dense(32, activation='relu'),
      layers.Dropout(0.5),
      layers.Dense(num_classes),
    ]
  )


def frozen(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """A frozen layer: it must stay as initialised."""
  return keras.Sequential(
    [
      _pixels(input_shape),
      layers.Dense(32, activation='relu', trainable=False),
      layers.Dense(num_classes),
    ]
  )


def all_frozen(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Nothing to train."""
  net = bare(input_shape, num_classes)
  net.trainable = False
  return net


def keras_io_convnet(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """keras-io's "Simple MNIST convnet", unchanged: it ends in a softmax."""
  return keras.Sequential(
    [
      keras.Input(shape=input_shape),
      layers.Conv2D(32, kernel_size=(3, 3), activation='relu'),
      layers.MaxPooling2D(pool_size=(2, 2)),
      layers.Conv2D(64, kernel_size=(3, 3), activation='relu'),
      layers.MaxPooling2D(pool_size=(2, 2)),
      layers.Flatten(),
      layers.Dropout(0.5),
      layers.Dense(num_classes, activation='softmax'),
    ]
  )


def convnet_logits(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """`keras_io_convnet` ending in logits: its twin."""
  net = keras_io_convnet(input_shape, num_classes)
  net.layers[-1].activation = keras.activations.linear
  return net


def softmax_layer(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """Probabilities from a Softmax layer (functional), not an activation."""
  pixels = _pixels(input_shape)
  scores = layers.Dense(num_classes)(layers.Dense(32, 'relu')(pixels))
  return keras.Model(pixels, layers.Softmax()(scores))


def bf16(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Built under `mixed_bfloat16`, as a factory sets it."""
  keras.mixed_precision.set_global_policy('mixed_bfloat16')
  return bare(input_shape, num_classes)


def fp16(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Built under `mixed_float16`: `fit` scales its loss."""
  keras.mixed_precision.set_global_policy('mixed_float16')
  return bare(input_shape, num_classes)


class NoTrainingArg(keras.Model):
  """A `call` without `training`: `fit` calls it without one, so its Dropout
  keeps its default (off) in training too."""

  def __init__(self, num_classes: int) -> None:
    super().__init__()
    self.flatten = layers.Flatten()
    self.hidden = layers.Dense(24, activation='relu')
    self.dropout = layers.Dropout(0.5)
    self.out = layers.Dense(num_classes)

  def call(self, x):
    return self.out(self.dropout(self.hidden(self.flatten(x))))


def no_training_arg(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  return NoTrainingArg(num_classes)


def listed_output(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """One output, given in a list (Keras calls it as the tensor)."""
  pixels = _pixels(input_shape)
  return keras.Model(pixels, [layers.Dense(num_classes)(pixels)])


class _Hidden(keras.Model):
  """A class whose name starts with '_': TF refuses the name scope Keras
  makes of it in a tf.function, under `fit` too."""

  def __init__(self, num_classes: int) -> None:
    super().__init__()
    self.out = layers.Dense(num_classes)

  def call(self, x):
    return self.out(layers.Flatten()(x))


def underscored(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  return _Hidden(num_classes)


def spaced_layer(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """A layer whose name TF refuses as a name scope in a tf.function."""
  return keras.Sequential(
    [_pixels(input_shape), layers.Dense(num_classes, name='my dense')]
  )


def two_inputs(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  a, b = _pixels(input_shape), _pixels(input_shape)
  return keras.Model([a, b], layers.Dense(num_classes)(layers.Add()([a, b])))


def two_outputs(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  pixels = _pixels(input_shape)
  hidden = layers.Dense(16)(pixels)
  return keras.Model(
    pixels, [layers.Dense(num_classes)(hidden), layers.Dense(1)(hidden)]
  )


class _Classes(layers.Layer):
  def call(self, x):
    return keras.ops.cast(x, 'int32')


def int_outputs(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  pixels = _pixels(input_shape)
  return keras.Model(pixels, _Classes()(layers.Dense(num_classes)(pixels)))


class _Detached(layers.Layer):
  def call(self, x):
    return keras.ops.stop_gradient(x)


def no_gradient(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """Outputs that do not depend on the weights, as far as gradients go."""
  pixels = _pixels(input_shape)
  return keras.Model(pixels, _Detached()(layers.Dense(num_classes)(pixels)))


def partly_unused(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """A layer the model holds but never calls: its weights get no gradient."""
  pixels = _pixels(input_shape)
  net = keras.Model(pixels, layers.Dense(num_classes)(pixels))
  net.unused = layers.Dense(8, name='unused')
  net.unused.build((None, math.prod(input_shape)))
  return net


def unknown_sizes(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """An Input of unknown height and width."""
  return keras.Sequential(
    [
      keras.Input(shape=(None, None, 1)),
      layers.Conv2D(4, 3, activation='relu'),
      layers.GlobalAveragePooling2D(),
      layers.Dense(num_classes),
    ]
  )


def rank_two(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  """28x28 without a channel axis."""
  return keras.Sequential(
    [keras.Input(shape=(28, 28)), layers.Flatten(), layers.Dense(num_classes)]
  )


# Models that bring their own training (issue 51): compiled by the factory,
# a `compute_loss` of their own, an integer input.


def compiled_adam(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """`dropout` compiled as most Keras code is: Adam and its loss, on
  logits. (An epsilon above float32 rounding: test_keras_fit.OPTIMIZERS.)"""
  net = dropout(input_shape, num_classes)
  net.compile(
    optimizer=keras.optimizers.Adam(0.01, epsilon=1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  )
  return net


def compiled_one_hot(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """keras-io's compile() of its convnet, on a smaller model: a softmax, a
  one-hot loss, SGD with momentum."""
  net = keras.Sequential(
    [
      _pixels(input_shape),
      layers.Dense(32, activation='relu'),
      layers.Dense(num_classes, activation='softmax'),
    ]
  )
  net.compile(
    optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
    loss='categorical_crossentropy',
  )
  return net


def compiled_fp16(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """Compiled under `mixed_float16`: compile() wraps its optimizer in a
  LossScaleOptimizer, which the run takes as it is."""
  net = fp16(input_shape, num_classes)
  net.compile(
    optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  )
  return net


def compiled_loss_only(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """Compiled with a loss and no optimizer: the config's trains it. A
  one-hot loss, smooth: a hinge's kink would turn float rounding into
  another step (tests/system/test_model_contract.py's mirrored run)."""
  net = dense_l2(input_shape, num_classes)
  net.compile(
    optimizer=None,
    loss=keras.losses.CategoricalCrossentropy(
      from_logits=True, label_smoothing=0.1
    ),
  )
  return net


def compiled_no_loss(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """Compiled with an optimizer only: `fit` would refuse it."""
  net = bare(input_shape, num_classes)
  net.compile(optimizer='adam')
  return net


def _box_loss(y_true, y_pred):
  """A loss of another task's targets: four numbers an image."""
  return keras.ops.mean(keras.ops.abs(y_pred[:, :4] - y_true))


def compiled_box_loss(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """Compiled with a loss that takes neither labels nor their one-hot rows."""
  net = bare(input_shape, num_classes)
  net.compile(optimizer='sgd', loss=_box_loss)
  return net


class OwnLoss(keras.Model):
  """A functional model with a `compute_loss` of its own, the way Keras's
  guide writes one: cross-entropy on its logits, a penalty on their size,
  and its regularizers' `losses`."""

  def compute_loss(self, x, y, y_pred, sample_weight, training=True):
    data = keras.losses.sparse_categorical_crossentropy(
      y, y_pred, from_logits=True
    )
    penalty = 0.01 * keras.ops.mean(keras.ops.square(y_pred))
    return keras.ops.mean(data) + penalty + keras.ops.sum(self.losses)


def own_loss(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
  pixels = _pixels(input_shape)
  hidden = layers.Dense(
    32, activation='relu', kernel_regularizer=keras.regularizers.L2(0.05)
  )(pixels)
  return OwnLoss(pixels, layers.Dense(num_classes)(hidden))


class OwnStep(keras.Model):
  """A `train_step` of its own: the loop cannot call it."""

  def train_step(self, data):
    return super().train_step(data)


def own_train_step(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  pixels = _pixels(input_shape)
  return OwnStep(pixels, layers.Dense(num_classes)(pixels))


def pixel_embedding(
  input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
  """An Embedding over the pixels' values: an integer input, 0 to 255."""
  pixels = keras.Input(shape=(math.prod(input_shape),), dtype='int32')
  vectors = layers.Embedding(256, 2)(pixels)
  return keras.Model(
    pixels, layers.Dense(num_classes)(layers.Flatten()(vectors))
  )
