"""The `idx_mnist` TFDS builder on generated and on real IDX files."""

import glob
import gzip
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds
from support.idx import FASHION_DIR, IDX_NAMES, require_fashion_mnist, write_idx

from xla_mnist import data
from xla_mnist.datasets import idx_builder, prepared
from xla_mnist.runtime.errors import DataError


def prepare(folder: str, data_dir: str) -> tfds.core.DatasetBuilder:
  source = prepared.identify(folder, idx_builder.hash_file)
  if source is None:  # A file is missing: named as `datasets.prepare` does.
    idx_builder.check_folder(folder)
  builder = idx_builder.IdxMnist(
    config='mnist', data_dir=data_dir, source=source
  )
  builder.download_and_prepare()
  return builder


def prepared_dir(data_dir: str) -> str:
  """The version folder of the one source prepared in `data_dir`."""
  (found,) = glob.glob(
    os.path.join(data_dir, 'idx', '*', 'idx_mnist', '*', '*')
  )
  return found


def test_round_trip_keeps_every_image_label_and_order(idx_folder, tmp_path):
  folder, arrays = idx_folder
  loaded = data.load('mnist', folder, str(tmp_path / 'tfds'))
  assert loaded.prepared_now
  for split in (loaded.train, loaded.test):
    assert split.images.dtype == 'uint8' and split.labels.dtype == 'int64'
  train_images, train_labels = arrays['train']
  np.testing.assert_array_equal(loaded.train.images[..., 0], train_images)
  np.testing.assert_array_equal(loaded.train.labels, train_labels)
  np.testing.assert_array_equal(loaded.test.labels, arrays['test'][1])


def test_second_load_reads_the_prepared_data(idx_folder, tmp_path):
  folder, arrays = idx_folder
  data_dir = str(tmp_path / 'tfds')
  first = data.load('mnist', folder, data_dir)
  again = data.load('mnist', folder, data_dir)
  assert not again.prepared_now
  assert again.source_digest == first.source_digest
  np.testing.assert_array_equal(again.train.labels, arrays['train'][1])


def test_prepared_data_is_not_used_once_its_source_is_gone(
  idx_folder, tmp_path
):
  # Its files identify the source: without them, no prepared copy is its.
  folder, _ = idx_folder
  data_dir = str(tmp_path / 'tfds')
  data.load('mnist', folder, data_dir)
  for name in os.listdir(folder):
    os.remove(os.path.join(folder, name))
  with pytest.raises(DataError, match='holds none of the four IDX files'):
    data.load('mnist', folder, data_dir)


def arrays_file(data_dir: str, split: str) -> str:
  return os.path.join(
    prepared_dir(data_dir), f'{prepared.ARRAYS_PREFIX}{split}.npz'
  )


def remove_records(data_dir: str) -> None:
  for path in glob.glob(os.path.join(prepared_dir(data_dir), '*.tfrecord*')):
    os.remove(path)


def test_later_loads_read_the_arrays_file_not_the_records(idx_folder, tmp_path):
  folder, arrays = idx_folder
  data_dir = str(tmp_path / 'tfds')
  data.load('mnist', folder, data_dir)
  assert os.path.isfile(arrays_file(data_dir, 'train'))
  remove_records(data_dir)  # Now only the arrays files can serve the load.
  again = data.load('mnist', folder, data_dir)
  np.testing.assert_array_equal(again.train.images[..., 0], arrays['train'][0])
  np.testing.assert_array_equal(again.test.labels, arrays['test'][1])


def _cut(path):
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


def _other_count(path):
  np.savez(path, images=np.zeros((5, 28, 28, 1), np.uint8), labels=np.zeros(5))


def _no_labels(path):
  np.savez(path, images=np.zeros((300, 28, 28, 1), np.uint8))


def _empty(path):
  open(path, 'w').close()


def _flat_images(path):
  np.savez(
    path, images=np.zeros((300, 784), np.uint8), labels=np.zeros(300, int)
  )


@pytest.mark.parametrize(
  'spoil', [_cut, _empty, _other_count, _no_labels, _flat_images]
)
def test_a_spoiled_arrays_file_is_read_past_and_written_anew(
  idx_folder, tmp_path, spoil
):
  folder, arrays = idx_folder
  data_dir = str(tmp_path / 'tfds')
  data.load('mnist', folder, data_dir)
  path = arrays_file(data_dir, 'train')
  spoil(path)
  again = data.load('mnist', folder, data_dir)
  np.testing.assert_array_equal(again.train.images[..., 0], arrays['train'][0])
  with np.load(path) as f:  # Whole again, for the next run.
    np.testing.assert_array_equal(f['labels'], arrays['train'][1])


def test_an_arrays_file_that_cannot_be_written_is_skipped(idx_folder, tmp_path):
  folder, arrays = idx_folder
  data_dir = str(tmp_path / 'tfds')
  data.load('mnist', folder, data_dir)
  path = arrays_file(data_dir, 'train')
  os.remove(path)
  os.mkdir(path)  # Neither readable nor replaceable as a file, even by root.
  again = data.load('mnist', folder, data_dir)
  np.testing.assert_array_equal(again.train.labels, arrays['train'][1])
  assert os.path.isdir(path)
  assert not [
    n for n in os.listdir(os.path.dirname(path)) if n.endswith('.tmp')
  ]


def test_uncompressed_files_are_accepted(tmp_path):
  folder = tmp_path / 'raw'
  folder.mkdir()
  rng = np.random.default_rng(1)
  for split, n in (('train', 20), ('test', 10)):
    images_name, labels_name = IDX_NAMES[split]
    write_idx(
      str(folder / images_name.removesuffix('.gz')),
      2051,
      rng.integers(0, 256, (n, 28, 28)),
    )
    write_idx(
      str(folder / labels_name.removesuffix('.gz')),
      2049,
      rng.integers(0, 10, n),
    )
  builder = prepare(str(folder), str(tmp_path / 'tfds'))
  assert builder.info.splits['train'].num_examples == 20


def _truncate(path):
  with gzip.open(path) as f:
    raw = f.read()
  with gzip.open(path, 'wb') as f:
    f.write(raw[:-100])


def _wrong_magic(path):
  write_idx(path, 2049, np.zeros((300, 28, 28), np.uint8))


def _fewer_labels(path):
  write_idx(path, 2049, np.zeros(299, np.uint8))


def _label_out_of_range(path):
  write_idx(path, 2049, np.full(300, 10, np.uint8))


def _not_gzip(path):
  with open(path, 'wb') as f:
    f.write(b'this is not a gzip file')


@pytest.mark.parametrize(
  'file_index, corrupt, expected',
  [
    (0, _truncate, 'truncated'),
    (0, _wrong_magic, 'magic number 2049, expected 2051'),
    (1, _fewer_labels, 'has 300 images but'),
    (1, _label_out_of_range, 'label 10, outside 0..9'),
    (0, _not_gzip, 'cannot be read'),
    (1, os.remove, 'lacks'),
  ],
)
def test_bad_file_is_named_and_nothing_is_left_prepared(
  idx_folder, tmp_path, file_index, corrupt, expected
):
  folder, _ = idx_folder
  bad = os.path.join(folder, IDX_NAMES['train'][file_index])
  corrupt(bad)
  data_dir = tmp_path / 'tfds'
  with pytest.raises(DataError, match=expected) as error:
    prepare(folder, str(data_dir))
  assert IDX_NAMES['train'][file_index].removesuffix('.gz') in str(error.value)
  # TFDS leaves empty folders and its `.config` metadata, but no split file.
  leftovers = [
    p for p in data_dir.rglob('*') if p.is_file() and '.config' not in p.parts
  ]
  assert leftovers == [], leftovers


def test_real_fashion_mnist_prepares_with_its_true_shape(fashion_data_dir):
  require_fashion_mnist()
  loaded = data.load('fashion_mnist', '', fashion_data_dir)
  assert not loaded.prepared_now  # The session fixture prepared it.
  assert FASHION_DIR in loaded.source
  assert loaded.train.images.shape == (60000, 28, 28, 1)
  assert loaded.test.images.shape == (10000, 28, 28, 1)
  counts = np.bincount(loaded.train.labels.numpy(), minlength=10)
  np.testing.assert_array_equal(counts, [6000] * 10)
  # First training labels of the Fashion-MNIST release, in file order.
  np.testing.assert_array_equal(loaded.train.labels[:6], [9, 0, 0, 3, 0, 2])
