"""The training and evaluation steps, compiled as the jit mode asks: `off` a
plain `tf.function`, `on` all XLA, `auto` TF's auto-clustering (TF1's
`global_jit_level=ON_1`)."""

from __future__ import annotations

from collections.abc import Callable

import keras
import ml_collections
import tensorflow as tf

from xla_mnist import config as config_lib
from xla_mnist import data
from xla_mnist import model as model_lib

EVAL_BATCH = 1000  # Test images per evaluation call.


def make_optimizer(
  net: keras.Model, config: ml_collections.ConfigDict
) -> keras.optimizers.Optimizer:
  """The optimizer `fit` trains `net` with: its compile()'s, or the config's
  (`optimizers.of_model`; plain SGD without loading it) loss-scaled for
  `mixed_float16`, whose float16 gradients would otherwise underflow."""
  own = getattr(net, 'optimizer', None)  # A factory's model's compile()'s.
  if own is None and config_lib.plain_sgd(config):
    optimizer = keras.optimizers.SGD(config.learning_rate)
  else:
    from xla_mnist import optimizers  # noqa: PLC0415 - beyond plain SGD only.

    optimizer = optimizers.of_model(net, config)
  if own is None and net.dtype_policy.name == 'mixed_float16':
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  optimizer.build(net.trainable_variables)
  return optimizer


def make_grads(
  model: keras.Model,
  global_batch_size: int,
  *,
  probabilities: bool = False,
  optimizer: keras.optimizers.Optimizer | None = None,
) -> Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, list[tf.Tensor | None]]]:
  """`grads(uint8 images, labels) -> (loss, gradients)`, uncompiled: the loss
  `fit` computes (docs/models.md, "What `fit` does"), its gradients as
  `optimizer` scales them (its `apply_gradients` unscales). Apart from the
  update so that tf.distribute can compile just this part."""
  data_loss = keras.losses.SparseCategoricalCrossentropy(
    from_logits=not probabilities, reduction=None
  )
  own_loss = None  # A model's own (compiled, compute_loss) is fit's.
  if model.compiled or type(model).compute_loss is not keras.Model.compute_loss:
    from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

    own_loss = factory.fit_loss(model)

  def grads(
    images: tf.Tensor, labels: tf.Tensor
  ) -> tuple[tf.Tensor, list[tf.Tensor | None]]:
    with tf.GradientTape() as tape:
      x = model_lib.inputs(model, images)
      outputs = _training_call(model, x)
      if own_loss:  # model.losses included.
        loss = own_loss(x, labels, outputs)
      else:
        loss = tf.nn.compute_average_loss(
          data_loss(labels, outputs), global_batch_size=global_batch_size
        )
        if model.losses:
          extra = [tf.reduce_sum(tf.cast(t, tf.float32)) for t in model.losses]
          loss += tf.nn.scale_regularization_loss(tf.add_n(extra))
      scaled = optimizer.scale_loss(loss) if optimizer else loss
    return loss, tape.gradient(scaled, model.trainable_variables)

  return grads


def _training_call(model: keras.Model, inputs: tf.Tensor) -> tf.Tensor:
  """`model` as `fit` calls it: `training=True` only where `call` takes it
  (otherwise its layers run as by default, Dropout off, as under `fit`)."""
  if 'training' in model.call_signature_parameters:
    return model(inputs, training=True)
  return model(inputs)


def make_update(
  model: keras.Model,
  optimizer: keras.optimizers.Optimizer,
  global_batch_size: int,
  probabilities: bool = False,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """`update(uint8 images, labels) -> loss`: one step, uncompiled; the
  per-step function and the fused loop share it, so they compute alike."""
  grads_fn = make_grads(
    model, global_batch_size, probabilities=probabilities, optimizer=optimizer
  )

  def update(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    loss, grads = grads_fn(images, labels)
    # Weights without a gradient stay, as under fit, whose optimizer also
    # warns of compile(): the run's note names them (`check_gradients`).
    pairs = zip(grads, model.trainable_variables, strict=True)
    optimizer.apply_gradients([(g, v) for g, v in pairs if g is not None])
    return loss

  return update


def make_train_call(
  model: keras.Model,
  optimizer: keras.optimizers.Optimizer,
  jit: str,
  global_batch_size: int,
  probabilities: bool = False,
  batch_of: Callable | None = None,
  fused: bool = False,
) -> Callable[..., tf.Tensor]:
  """One compiled call that gathers its batches from the resident data, with
  no tf.data work (or as `batch_of` picks them: `input_pipeline.picking`):
  `step(images, labels, indices) -> loss`, one step; `fused`,
  `loop(images, labels, indices [K, batch], count) -> losses [K]`, `count`
  steps in one program, no Python between them. `count` is a tensor, so a
  short last call reuses the program (0 compiles it without training);
  losses past `count` are 0."""
  update = (batch_of or _gathering)(
    make_update(model, optimizer, global_batch_size, probabilities)
  )

  def train_loop(
    images: tf.Tensor, labels: tf.Tensor, indices: tf.Tensor, count: tf.Tensor
  ) -> tf.Tensor:
    def body(i: tf.Tensor, losses: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
      loss = update(images, labels, indices[i])
      return i + 1, tf.tensor_scatter_nd_update(losses, [[i]], [loss])

    _, losses = tf.while_loop(
      lambda i, _: i < count,
      body,
      (tf.constant(0), tf.zeros(tf.shape(indices)[:1])),
    )
    return losses

  # An explicit while_loop, no autograph: tracing takes a fraction of the time.
  return tf.function(
    train_loop if fused else update, jit_compile=jit_compile(jit),
    autograph=False,
  )  # fmt: skip


def _gathering(
  update: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]:
  """`update(images, labels)` made `update(images, labels, indices)`."""

  def update_batch(
    images: tf.Tensor, labels: tf.Tensor, indices: tf.Tensor
  ) -> tf.Tensor:
    return update(tf.gather(images, indices), tf.gather(labels, indices))

  return update_batch


def make_eval_step(
  model: keras.Model, jit: str
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """`evaluate(uint8 images, labels) -> accuracy` of one batch."""

  def evaluate(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    logits = model(model_lib.inputs(model, images), training=False)
    hits = tf.equal(tf.argmax(logits, axis=-1), labels)
    return tf.reduce_mean(tf.cast(hits, tf.float32))

  return tf.function(evaluate, jit_compile=jit_compile(jit))


def evaluate(model: keras.Model, jit: str, split: data.Split) -> float:
  """`model`'s accuracy on `split`, in batches: a CNN's activations for
  10,000 images would take gigabytes. A batch's accuracy times its size
  rounds to its exact count of hits (float32 holds k / n within 0.5 / n)."""
  accuracy = make_eval_step(model, jit)
  hits = 0
  for start in range(0, split.size, EVAL_BATCH):
    images = split.images[start : start + EVAL_BATCH]
    labels = split.labels[start : start + EVAL_BATCH]
    hits += round(float(accuracy(images, labels)) * len(labels))
  return hits / split.size


def model_losses(model: keras.Model, split: data.Split) -> float | None:
  """`model.losses` summed on the first test batch, inference mode: the
  loss that is not the data's; None for a model that has none."""

  def extra(images: tf.Tensor) -> tf.Tensor | None:
    model(model_lib.inputs(model, images), training=False)
    losses = [tf.reduce_sum(tf.cast(x, tf.float32)) for x in model.losses]
    return tf.add_n(losses) if losses else None

  value = tf.function(extra, autograph=False)(split.images[:EVAL_BATCH])
  return None if value is None else float(value)


def jit_compile(mode: str) -> bool | None:
  """`tf.function`'s `jit_compile` for a jit mode: None, not False, for
  `auto`, where False would forbid auto-clustering."""
  if mode not in config_lib.JIT_MODES:
    raise ValueError(f'unknown jit mode {mode!r}')
  return True if mode == 'on' else None
