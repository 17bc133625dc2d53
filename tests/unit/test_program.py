"""The fused loop against the per-step function: one trace, the same
weights, the batch order whatever K."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from support import mnist, steps

from xla_mnist import input_pipeline, model, step
from xla_mnist.configs import default

BATCH = 32


STEPS = 20


def make(make_fn):
  """A fresh model and `make_fn`'s XLA program for it."""
  net = model.create_model(**mnist.FACTS)
  optimizer = tf.keras.optimizers.SGD(0.5)
  optimizer.build(net.trainable_variables)
  return net, make_fn(net, optimizer, 'on', BATCH)


def test_fused_loop_is_traced_once_for_any_indices_and_count(split):
  _, loop = make(functools.partial(step.make_train_call, fused=True))
  indices = iter(
    input_pipeline.batch_indices(split.size, BATCH, seed=0).batch(10)
  )
  for count in (10, 3, 0, 10):
    losses = loop(split.images, split.labels, next(indices), tf.constant(count))
    assert np.count_nonzero(losses.numpy()) == count
  assert loop.experimental_get_tracing_count() == 1


def test_fused_loop_and_indexed_step_match_the_batch_fed_step(split):
  """Same body, same batches: equal at lr 0.5, where rounding would grow."""
  net_fed, fed_step = make(steps.train_step)
  batches = input_pipeline.train_batches(split, BATCH, seed=1).take(STEPS)
  fed_losses = [float(fed_step(x, y)) for x, y in batches]
  indices = next(
    iter(input_pipeline.batch_indices(split.size, BATCH, 1).batch(STEPS))
  )
  net_loop, loop = make(functools.partial(step.make_train_call, fused=True))
  loop_losses = loop(split.images, split.labels, indices, tf.constant(STEPS))
  net_indexed, indexed_step = make(step.make_train_call)
  indexed_losses = [
    float(indexed_step(split.images, split.labels, row)) for row in indices
  ]
  assert indexed_step.experimental_get_tracing_count() == 1
  for losses, net in (loop_losses, net_loop), (indexed_losses, net_indexed):
    np.testing.assert_allclose(losses, fed_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(
      net.trainable_variables, net_fed.trainable_variables, strict=True
    ):
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('jit', ['off', 'on'])
def test_trainer_programs_follow_the_batch_order_whatever_k(split, jit):
  """K = 1, a K that does not divide the steps, and one call for all."""
  config = default.get_config()
  config.update(batch_size=BATCH, num_steps=STEPS, jit=jit, seed=3)
  runs = []
  for k in (1, 7, STEPS):
    config.steps_per_loop = k
    runs.append(steps.run_program(split, config, mnist.FACTS))
  (first_losses, first_weights), *others = runs
  for losses, weights in others:
    np.testing.assert_allclose(losses, first_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(weights, first_weights, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
