"""Batch order, preprocessing and dataset selection."""

import numpy as np
import pytest
import tensorflow as tf
from support import mnist

from xla_mnist import data, input_pipeline, model
from xla_mnist.runtime.errors import DataError, UsageError


def take(dataset, n):
  return np.stack([x.numpy() for x in dataset.take(n)])


def test_each_epoch_is_a_permutation_cut_into_fixed_batches():
  order = take(
    input_pipeline.batch_indices(size=1050, batch_size=100, seed=3), 20
  )
  assert order.shape == (20, 100)
  first, second = order[:10].ravel(), order[10:].ravel()
  assert len(set(first)) == 1000 and len(set(second)) == 1000
  assert first.max() < 1050
  assert not np.array_equal(first, second)  # Reshuffled each epoch.


def test_order_depends_only_on_seed_and_step():
  a = take(input_pipeline.batch_indices(600, 50, seed=7), 30)
  b = take(input_pipeline.batch_indices(600, 50, seed=7), 30)
  c = take(input_pipeline.batch_indices(600, 50, seed=8), 30)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  resumed = take(
    input_pipeline.batch_indices(600, 50, seed=7, start_step=17), 13
  )
  np.testing.assert_array_equal(resumed, a[17:])


def test_train_batches_gather_images_and_labels_of_the_order():
  images = tf.constant(np.arange(40, dtype=np.uint8).reshape(40, 1, 1, 1))
  images = tf.tile(images, (1, 28, 28, 1))
  labels = tf.constant(np.arange(40) % 10, tf.int64)
  split = data.Split(images, labels)
  order = take(input_pipeline.batch_indices(40, 8, seed=0), 3)
  for (x, y), idx in zip(
    input_pipeline.train_batches(split, 8, 0).take(3), order, strict=True
  ):
    assert x.shape == (8, 28, 28, 1)
    np.testing.assert_array_equal(x[:, 0, 0, 0], idx)
    np.testing.assert_array_equal(y, idx % 10)


def test_preprocess_scales_to_unit_range_and_flattens():
  images = tf.constant([[[[0]] * 28] * 28, [[[255]] * 28] * 28], tf.uint8)
  x = model.preprocess(images, mnist.FLAT)
  assert x.shape == (2, 784) and x.dtype == tf.float32
  assert float(tf.reduce_min(x)) == 0.0 and float(tf.reduce_max(x)) == 1.0


@pytest.mark.parametrize('batch_size', [0, 601])
def test_batch_size_must_fit_the_split(batch_size):
  with pytest.raises(UsageError, match='batch_size'):
    input_pipeline.batch_indices(600, batch_size, seed=0)


def test_a_dataset_tfds_does_not_register_is_a_usage_error(tmp_path):
  with pytest.raises(UsageError, match="'cifar' is not one TFDS registers"):
    data.load('cifar', '', str(tmp_path))


def test_missing_idx_folder_is_named(tmp_path):
  with pytest.raises(DataError, match='nope does not exist'):
    data.load('mnist', str(tmp_path / 'nope'), str(tmp_path))
