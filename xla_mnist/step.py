"""The training and evaluation steps, compiled as the jit mode asks.

`off` is a plain `tf.function`; `on` compiles the whole step with XLA
(`jit_compile=True`); `auto` lets TF's auto-clustering pick XLA clusters out of
the graph, the TF2 heir of TF1's `global_jit_level=ON_1`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import tensorflow as tf

from xla_mnist import data

JIT_MODES = ('off', 'on', 'auto')
# Auto-clustering on CPU needs these besides `set_jit`; TF reads them once, at
# the first `tf.function` call of the process.
AUTOCLUSTERING_XLA_FLAGS = '--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit'


def configure_jit(mode: str) -> None:
  """Sets the process-wide part of `mode`; call it before any `tf.function`."""
  if mode == 'auto':
    flags = os.environ.get('TF_XLA_FLAGS', '')
    if AUTOCLUSTERING_XLA_FLAGS not in flags:
      os.environ['TF_XLA_FLAGS'] = f'{flags} {AUTOCLUSTERING_XLA_FLAGS}'.strip()
    tf.config.optimizer.set_jit('autoclustering')


def loss_fn(
  logits: tf.Tensor, labels: tf.Tensor, global_batch_size: int
) -> tf.Tensor:
  """Mean sparse softmax cross-entropy over the global batch, on raw logits."""
  per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
  return tf.nn.compute_average_loss(
    per_example, global_batch_size=global_batch_size
  )


def make_train_step(
  model: tf.keras.Model,
  optimizer: tf.keras.optimizers.Optimizer,
  jit: str,
  global_batch_size: int,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """Returns `step(uint8 images, labels) -> loss`, one SGD update."""

  def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
      logits = model(data.preprocess(images), training=True)
      loss = loss_fn(logits, labels, global_batch_size)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(
      zip(grads, model.trainable_variables, strict=True)
    )
    return loss

  return tf.function(train_step, jit_compile=jit_compile(jit))


def make_eval_step(
  model: tf.keras.Model, jit: str
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """Returns `evaluate(uint8 images, labels) -> accuracy` over one batch."""

  def evaluate(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    logits = model(data.preprocess(images), training=False)
    hits = tf.equal(tf.argmax(logits, axis=-1), labels)
    return tf.reduce_mean(tf.cast(hits, tf.float32))

  return tf.function(evaluate, jit_compile=jit_compile(jit))


def jit_compile(mode: str) -> bool | None:
  """The `tf.function(jit_compile=...)` value of a jit mode.

  None, not False, for `auto`: False would forbid auto-clustering there.
  """
  if mode not in JIT_MODES:
    raise ValueError(f'unknown jit mode {mode!r}')
  return True if mode == 'on' else None
