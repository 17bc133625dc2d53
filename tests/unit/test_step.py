"""The compiled training step: one trace, real XLA for `on`, same maths."""

import numpy as np
import pytest
import tensorflow as tf
from support import mnist, steps

from xla_mnist import input_pipeline, model, step

# Ops, fusions and rounding come from TF's CPU kernels: `make test` runs these
# with oneDNN on and off.
pytestmark = pytest.mark.kernels


def make(jit: str):
  net = model.create_model(**mnist.FACTS)
  optimizer = tf.keras.optimizers.SGD(0.5)
  optimizer.build(net.trainable_variables)
  return net, steps.train_step(net, optimizer, jit, global_batch_size=32)


@pytest.mark.parametrize('jit', ['off', 'on'])
def test_step_is_traced_once_for_the_whole_run(jit, split):
  _, train_step = make(jit)
  for images, labels in input_pipeline.train_batches(split, 32, seed=0).take(
    25
  ):
    train_step(images, labels)
  assert train_step.experimental_get_tracing_count() == 1


def test_jit_on_compiles_the_step_with_xla_fusions(split):
  _, train_step = make('on')
  images, labels = split.images[:32], split.labels[:32]
  ir = train_step.experimental_get_compiler_ir(images, labels)
  optimized = ir(stage='optimized_hlo')
  assert 'ENTRY' in optimized and 'fusion' in optimized
  _, plain = make('off')
  with pytest.raises(ValueError, match='jit_compile=True'):
    plain.experimental_get_compiler_ir(images, labels)


def test_xla_and_plain_steps_agree(split):
  results = []
  for jit in ('off', 'on'):
    net, train_step = make(jit)
    losses = [
      float(train_step(x, y))
      for x, y in input_pipeline.train_batches(split, 32, seed=1).take(20)
    ]
    results.append((losses, [v.numpy() for v in net.trainable_variables]))
  (losses_off, weights_off), (losses_on, weights_on) = results
  np.testing.assert_allclose(losses_off, losses_on, rtol=1e-4, atol=1e-5)
  for a, b in zip(weights_off, weights_on, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_first_step_matches_the_closed_form_gradient(split):
  net, train_step = make('on')
  images, labels = split.images[:32], split.labels[:32]
  loss = float(train_step(images, labels))
  assert loss == pytest.approx(np.log(10), rel=1e-6)  # Zero weights: uniform.
  x = model.preprocess(images, mnist.FLAT).numpy()
  error = np.full((32, 10), 0.1) - np.eye(10)[labels.numpy()]
  kernel, bias = (v.numpy() for v in net.trainable_variables)
  np.testing.assert_allclose(kernel, -0.5 * error.T @ x / 32, atol=1e-6)
  np.testing.assert_allclose(bias, -0.5 * error.mean(0), atol=1e-6)


def test_eval_step_counts_hits():
  net = model.create_model(**mnist.FACTS)
  kernel, bias = net.trainable_variables
  bias.assign([0.0] * 9 + [1.0])  # Always predicts class 9.
  evaluate = step.make_eval_step(net, 'on')
  images = tf.zeros((4, 28, 28, 1), tf.uint8)
  labels = tf.constant([9, 9, 9, 1], tf.int64)
  assert float(evaluate(images, labels)) == pytest.approx(0.75)
