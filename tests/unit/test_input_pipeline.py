"""The streamed input against the resident one: the same batches in the
same order, so the same weights bit for bit, in every jit mode and K; and
the path `data.load` takes, and says."""

import numpy as np
import pytest
from support import mnist, steps

from xla_mnist import data, input_pipeline
from xla_mnist.configs import default

BATCH, STEPS = 32, 23  # 23: K = 10 ends on a short call.


def trained(split: data.Split, jit: str, k: int) -> tuple[np.ndarray, list]:
  config = default.get_config()
  config.update(batch_size=BATCH, num_steps=STEPS, jit=jit, seed=5)
  config.steps_per_loop = k
  return steps.run_program(split, config, mnist.FACTS)


@pytest.mark.kernels  # oneDNN's kernels (jit off, auto) either way.
@pytest.mark.parametrize(
  'jit, k', [('on', 10), ('on', 1), ('off', 1), ('auto', 1)]
)
def test_a_streamed_split_trains_to_the_resident_weights(split, jit, k):
  streamed = data.Split(split.images.numpy(), split.labels.numpy())
  assert streamed.streamed and not split.streamed
  resident_losses, resident = trained(split, jit, k)
  streamed_losses, weights = trained(streamed, jit, k)
  np.testing.assert_array_equal(streamed_losses, resident_losses)
  for a, b in zip(weights, resident, strict=True):
    np.testing.assert_array_equal(a, b)


def test_the_stream_reads_the_order_of_the_batch_indices(split):
  """Blocks of K batches, as `batch_indices` orders them, from step 7."""
  images, labels = split.images.numpy(), split.labels.numpy()
  streamed = data.Split(images, labels)
  feed, specs, zeros = input_pipeline.streamed(streamed, 8, 2, 7, 3)
  order = input_pipeline.batch_indices(split.size, 8, 2, 7).batch(3)
  for rows in order.take(4):
    got_images, got_labels, picks = feed()
    np.testing.assert_array_equal(got_images, images[rows.numpy()])
    np.testing.assert_array_equal(got_labels, labels[rows.numpy()])
  assert list(picks.numpy()) == [0, 1, 2]
  assert specs[0].shape == (3, 8, *images.shape[1:])
  assert zeros[0].shape == specs[0].shape


@pytest.mark.parametrize(
  'asked, held', [('auto', True), ('resident', True), ('stream', False)]
)
def test_load_holds_or_streams_and_says_why(idx_folder, tmp_path, asked, held):
  folder, arrays = idx_folder
  data_dir = str(tmp_path / 'tfds')
  data.load('mnist', folder, data_dir)  # Prepared: its arrays files.
  loaded = data.load('mnist', folder, data_dir, input=asked)
  assert loaded.train.streamed == (not held)
  assert loaded.input_line.startswith(
    'input: resident (' if held else 'input: streamed ('
  )
  assert f'input={asked}' in loaded.input_line
  if not held:  # Read from the arrays file, not held.
    assert isinstance(loaded.train.images, np.memmap)
  np.testing.assert_array_equal(
    np.asarray(loaded.train.images), arrays['train'][0][..., None]
  )
