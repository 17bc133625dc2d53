"""What XLA makes of a model other than the seed's: a user's model tried on
one compiled step before the run writes anything, and the note when the
fused loop holds convolutions. Loaded only for such a model: the seed's
softmax is known good and holds no convolution."""

from __future__ import annotations

import ml_collections
import tensorflow as tf

from xla_mnist import model as model_lib
from xla_mnist import program, step
from xla_mnist.config import PACKAGED_MODELS
from xla_mnist.runtime import errors


def check(
  config: ml_collections.ConfigDict,
  factory: model_lib.Factory | None,
  image_shape: tuple[int, ...],
  num_classes: int,
) -> str | None:
  """Builds a user's model for the data and computes one step's gradients,
  compiled as the run's, on two images, by its own loss and optimizer where
  its factory compiled it: each fault is one UsageError (`zoo/factory.py`,
  and `optimizers.of_model` for a compiled optimizer beside the config's);
  a note names weights with no gradient."""
  if factory is None and config.model in PACKAGED_MODELS:
    return None
  from xla_mnist.zoo import factory as user  # noqa: PLC0415 - a user's only.

  name = factory or config.model
  net = model_lib.create_model(
    name, config.seed, image_shape=image_shape, num_classes=num_classes,
    precision=config.precision,
  )  # fmt: skip
  probabilities, _ = model_lib.outputs(net, name, image_shape)
  optimizer = step.make_optimizer(net, config)
  compiled = tf.function(
    step.make_grads(net, 2, probabilities=probabilities, optimizer=optimizer),
    jit_compile=step.jit_compile(config.jit),
  )
  images = tf.zeros((2, *image_shape), tf.uint8)
  return user.check_gradients(
    config.model, net, lambda: compiled(images, tf.zeros(2, tf.int64))[1]
  )


def loop_note(compiled: program.Compiled, jit: str, device: str) -> list[str]:
  """The note, as lines (none or one), when XLA's fused loop holds
  convolutions on a CPU: inside a `while` body XLA:CPU runs TF's gradient
  convolutions on a generic emitter, 10-35x slower than one step a call
  (docs/models.md; jax-ml/jax#12868)."""
  xla_loop = compiled.program.steps_per_loop > 1 and jit == 'on'
  if not xla_loop or not device.startswith('CPU'):
    return []
  library = compiled.graph.as_graph_def().library.function
  ops = {node.op for f in library for node in f.node_def}
  convolutions = sorted(o for o in ops if o.startswith(('Conv', 'Depthwise')))
  if not convolutions:
    return []
  return [
    f'note: the fused loop holds convolutions ({", ".join(convolutions)}),'
    " which XLA:CPU runs on a slow generic emitter inside a loop's body"
    f' (docs/models.md): {errors.field("steps_per_loop", 1)}'
    ' likely trains faster'
  ]
