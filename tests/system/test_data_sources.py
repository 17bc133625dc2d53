"""Any TFDS image dataset by name and a folder of images: their shape and
classes carried to the model, the run's result and its checkpoint, each
fault one line (issue 50, docs/data.md).

TFDS cannot download here: its own `tfds.testing.mock_data` serves the
registered builders' random examples offline, which replaces TFDS's
download (and so our check that the download's hosts answer, part of it);
the refusal when offline is tested without the mock. Folders are written
from Fashion-MNIST's real images, so that their accuracy means something.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from support import folders
from support.runs import train_here

from xla_mnist import data
from xla_mnist.datasets import prepare, registered
from xla_mnist.runtime import layout
from xla_mnist.runtime.errors import DataError, UsageError, UserError


def flags(tmp_path, *extra: str) -> list[str]:
  return [
    f'--workdir={tmp_path / "run"}', f'--data_dir={tmp_path / "data"}',
    '--config.num_steps=20', '--config.batch_size=16',
    '--config.learning_rate=0.01', '--config.log_every=10', *extra,
  ]  # fmt: skip


@pytest.fixture
def mocked(monkeypatch):
  """TFDS's mock of its registered datasets, 64 random examples a split."""
  monkeypatch.setattr(prepare, '_check_download_reachable', lambda *_: None)
  with tfds.testing.mock_data(num_examples=64):
    yield


@pytest.mark.parametrize(
  'dataset, model, shape, classes',
  [
    ('cifar100', 'mlp', [32, 32, 3], 100),
    ('cifar10', 'cnn', [32, 32, 3], 10),
    ('emnist/letters', 'softmax', [28, 28, 1], 37),
  ],
)
def test_a_tfds_dataset_by_name_builds_the_model_for_its_data(
  mocked, tmp_path, dataset, model, shape, classes
):
  trained = train_here(
    *flags(tmp_path, f'--config.dataset={dataset}', f'--config.model={model}')
  )
  result = trained.result
  assert result.image_shape == shape
  assert len(result.class_names) == classes
  assert trained.model.output_shape == (None, classes)
  with open(tmp_path / 'run' / 'result.json') as f:
    stored = json.load(f)
  assert stored['image_shape'] == shape
  assert len(stored['class_names']) == classes


def test_a_factory_is_called_with_the_datas_shape_and_classes(mocked, tmp_path):
  import keras  # noqa: PLC0415

  from xla_mnist import parse, trainer  # noqa: PLC0415

  called = []

  def factory(input_shape, num_classes):
    called.append((input_shape, num_classes))
    return keras.Sequential([
      keras.Input(input_shape), keras.layers.Flatten(),
      keras.layers.Dense(num_classes),
    ])  # fmt: skip

  config = parse.config_of(
    ['--config.dataset=cifar100', '--config.num_steps=5',
     '--config.batch_size=8', '--config.cpu_threads=0']
  )  # fmt: skip
  trainer.train_and_evaluate(
    config, str(tmp_path / 'run'), str(tmp_path / 'data'), model=factory,
    quiet=True,
  )  # fmt: skip
  assert set(called) == {((32, 32, 3), 100)}


def test_a_label_feature_picks_the_classes(mocked, tmp_path):
  """CIFAR-100's 20 superclasses (its `coarse_label`) are other data than
  its 100 classes: their own arrays, names and fingerprint."""
  coarse = train_here(
    *flags(tmp_path, '--config.dataset=cifar100', '--config.label=coarse_label')
  )
  assert coarse.model.output_shape == (None, 20)
  assert len(coarse.result.class_names) == 20
  fine = train_here(*flags(
    tmp_path / 'fine', '--config.dataset=cifar100', '--config.label=label',
  ))  # fmt: skip
  assert fine.model.output_shape == (None, 100)
  assert fine.result.data_source != coarse.result.data_source
  with pytest.raises(UsageError, match='no ClassLabel feature') as raised:
    train_here(*flags(
      tmp_path / 'bad', '--config.dataset=cifar100', '--config.label=image',
    ))  # fmt: skip
  assert 'coarse_label' in str(raised.value) and '\n' not in str(raised.value)


def test_resuming_on_other_data_is_one_line(mocked, tmp_path):
  train_here(*flags(tmp_path, '--config.dataset=cifar10'))
  with pytest.raises(UserError, match='data') as raised:
    train_here(
      *flags(tmp_path, '--config.dataset=cifar100', '--config.num_steps=40')
    )
  assert '\n' not in str(raised.value)


@pytest.mark.parametrize(
  'extra, words',
  [
    (['--config.dataset=no_such_dataset'], 'not one TFDS registers'),
    (['--config.dataset=ag_news_subset'], 'not image classification'),
  ],
)
def test_a_dataset_that_cannot_serve_is_one_line(
  mocked, tmp_path, extra, words
):
  with pytest.raises(UserError, match=words) as raised:
    train_here(*flags(tmp_path, *extra))
  assert '\n' not in str(raised.value)
  assert not (tmp_path / 'run' / 'checkpoints').exists()


def test_offline_a_dataset_not_prepared_is_one_line(tmp_path):
  """No mock: TFDS's builder, and its download's host, which cannot be
  reached here; in seconds, not after TFDS's retries."""
  with pytest.raises(DataError, match='cannot be downloaded') as raised:
    train_here(*flags(tmp_path, '--config.dataset=cifar10'))
  assert 'image_dir' in str(raised.value)


def test_a_dataset_tfds_prepares_from_your_files_names_where(tmp_path):
  """ImageNet's files are the user's to fetch: no mock, no download tried;
  one line naming the folder TFDS reads them from."""
  with pytest.raises(DataError, match='downloads/manual') as raised:
    train_here(
      *flags(
        tmp_path, '--config.dataset=imagenet2012', '--config.image_size=64'
      )
    )
  assert str(tmp_path / 'data') in str(raised.value)
  assert '\n' not in str(raised.value)


@pytest.fixture(scope='module')
def fashion_folder(tmp_path_factory):
  """Fashion-MNIST's first images as PNGs and as IDX files."""
  root = tmp_path_factory.mktemp('fashion')
  arrays = folders.write_fashion_folder(
    str(root / 'png'), {'train': 6000, 'test': 2000}
  )
  folders.write_idx_folder(str(root / 'idx'), arrays)
  return root


def test_a_folder_trains_as_its_idx_files_do(fashion_folder, tmp_path):
  """The same images, as PNGs in class folders or as IDX files: the MLP
  learns them alike (another order of examples and labels: within a
  point), and the run records the folders' class names."""
  common = ['--config=mlp', '--config.num_steps=1500']
  idx = train_here(
    *common, f'--config.idx_dir={fashion_folder / "idx"}',
    f'--workdir={tmp_path / "idx"}', f'--data_dir={tmp_path / "data"}',
  ).result  # fmt: skip
  folder = train_here(
    *common, f'--config.image_dir={fashion_folder / "png"}',
    f'--workdir={tmp_path / "png"}', f'--data_dir={tmp_path / "data"}',
  ).result  # fmt: skip
  assert abs(folder.test_accuracy - idx.test_accuracy) <= 0.01
  assert folder.image_shape == [28, 28, 1]
  assert folder.dataset == str(fashion_folder / 'png')
  assert folder.class_names[:2] == ['Ankle boot', 'Bag']  # Sorted folders.


def test_a_folder_is_read_part_by_part_pixel_for_pixel(
  fashion_folder, tmp_path, monkeypatch
):
  """Parts of 999 images (no divisor of the split) land in the arrays file
  in the folders' order: class folders sorted, then file names."""
  monkeypatch.setattr(registered, 'READ_BATCH', 999)
  loaded = data.load(
    '', '', str(tmp_path / 'data'), input='stream',
    image_dir=str(fashion_folder / 'png'),
  )  # fmt: skip
  images, labels = folders.fashion('train', 6000)
  names = [n.replace('/', '_') for n in layout.IDX_CLASSES['fashion_mnist']]
  order = sorted(range(len(names)), key=names.__getitem__)
  np.testing.assert_array_equal(
    loaded.train.images[..., 0],
    np.concatenate([images[labels == c] for c in order]),
  )
  counts = [np.sum(labels == c) for c in order]
  np.testing.assert_array_equal(
    loaded.train.labels, np.repeat(np.arange(len(order)), counts)
  )


# Peak memory while preparing mocked CIFAR-10: after a small warm-up (tf.data's
# own set-up), ru_maxrss (KiB) before and after; then a run that reads it.
PEAK = """
import json, resource, sys
import tensorflow_datasets as tfds
from xla_mnist import data
from xla_mnist.datasets import prepare
prepare._check_download_reachable = lambda *_: None
with tfds.testing.mock_data(num_examples=64):
  data.load('cifar10', '', sys.argv[1] + '/warm', input='stream')
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with tfds.testing.mock_data(num_examples=int(sys.argv[2])):
  ready = data.load('cifar10', '', sys.argv[1] + '/big', input='stream')
  after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  again = data.load('cifar10', '', sys.argv[1] + '/big', input='stream')
print(json.dumps([
  (after - before) * 1024, ready.train.images.nbytes, ready.prepared_now,
  again.prepared_now, again.train.size,
]))
"""


def test_a_split_is_prepared_into_its_file_a_part_at_a_time(tmp_path):
  """Preparing never holds a split: the peak memory grows by a fraction of
  it (holding it grew by three times it), so that data larger than memory
  prepare, then train streamed. The next run takes the file as written
  (its digest, hashed part by part, checked whole)."""
  proc = subprocess.run(
    [sys.executable, '-c', PEAK, str(tmp_path), '16000'],
    capture_output=True, text=True, timeout=600, check=False,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  grown, split_bytes, prepared_now, again, size = json.loads(
    proc.stdout.splitlines()[-1]
  )
  assert split_bytes == 16000 * 32 * 32 * 3 and size == 16000
  assert grown < split_bytes / 2, f'{grown / 2**20:.0f} MiB grown'
  assert prepared_now and not again


def make_folder(root, sizes, ext='png', channels=1):
  """Two classes of two images each per split, of the given sizes."""
  import numpy as np  # noqa: PLC0415

  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for c, name in enumerate(('cat', 'dog')):
      os.makedirs(root / split / name, exist_ok=True)
      for i, (h, w) in enumerate(sizes[c]):
        pixels = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
        (root / split / name / f'{i}.{ext}').write_bytes(
          folders.encode(pixels, ext)
        )


def test_images_of_several_sizes_are_refused_or_resized(tmp_path):
  root = tmp_path / 'images'
  make_folder(root, [[(20, 20), (20, 20)], [(24, 30), (20, 20)]], ext='jpg')
  base = flags(tmp_path, f'--config.image_dir={root}', '--config.batch_size=2')
  with pytest.raises(DataError, match='differ in size') as raised:
    train_here(*base)
  assert '30x24' in str(raised.value) and 'image_size' in str(raised.value)
  result = train_here(*base, '--config.image_size=16').result
  assert result.image_shape == [16, 16, 1]
  assert result.class_names == ['cat', 'dog']


def test_grey_and_colour_images_take_the_most_channels(tmp_path):
  root = tmp_path / 'images'
  make_folder(root, [[(8, 8)] * 2, [(8, 8)] * 2], channels=1)
  import numpy as np  # noqa: PLC0415

  rgba = np.full((8, 8, 4), 200, np.uint8)
  (root / 'train' / 'cat' / 'rgba.png').write_bytes(folders.encode(rgba, 'png'))
  result = train_here(
    *flags(tmp_path, f'--config.image_dir={root}', '--config.batch_size=2')
  ).result
  assert result.image_shape == [8, 8, 4]
  # Grey with alpha beside RGB: RGBA, not RGB without the alpha.
  (root / 'train' / 'cat' / 'rgba.png').unlink()
  rgb, grey_alpha = (
    np.full((8, 8, 3), 9, np.uint8),
    np.full((8, 8, 2), 7, np.uint8),
  )
  (root / 'train' / 'dog' / 'rgb.png').write_bytes(folders.encode(rgb, 'png'))
  (root / 'test' / 'dog' / 'la.png').write_bytes(
    folders.encode(grey_alpha, 'png')
  )
  result = train_here(
    *flags(tmp_path, f'--config.image_dir={root}', '--config.batch_size=2',
           f'--workdir={tmp_path / "mixed"}')
  ).result  # fmt: skip
  assert result.image_shape == [8, 8, 4]


@pytest.mark.parametrize(
  'damage, words',
  [
    (lambda r: (r / 'train' / 'cat' / '0.png').write_bytes(b'not a png'),
     'cannot be read'),
    (lambda r: [p.unlink() for p in (r / 'test' / 'dog').iterdir()],
     'holds no image'),
    (lambda r: [p.unlink() for p in (r / 'test' / 'dog').iterdir()]
     and (r / 'test' / 'dog').rmdir(), "no class folder 'dog'"),
    (lambda r: os.rename(r / 'test', r / 'validation'),
     "no split folder 'test'"),
    (lambda r: [shutil.rmtree(r / s / 'dog') for s in ('train', 'test')],
     'two at least'),
  ],
)  # fmt: skip
def test_a_folder_that_cannot_serve_is_one_line(tmp_path, damage, words):
  root = tmp_path / 'images'
  make_folder(root, [[(8, 8)] * 2, [(8, 8)] * 2])
  damage(root)
  with pytest.raises(DataError, match=words) as raised:
    train_here(
      *flags(tmp_path, f'--config.image_dir={root}', '--config.batch_size=2')
    )
  assert '\n' not in str(raised.value)


def test_a_changed_folder_is_prepared_again(tmp_path, capsys):
  root = tmp_path / 'images'
  make_folder(root, [[(8, 8)] * 2, [(8, 8)] * 2])
  base = flags(tmp_path, f'--config.image_dir={root}', '--config.batch_size=2')
  runs = iter(range(3))

  def run():  # Each in a workdir of its own: a new run, not a resume.
    return train_here(*base, f'--workdir={tmp_path / str(next(runs))}').result

  first = run()
  again = run()
  assert again.data_source == first.data_source
  import numpy as np  # noqa: PLC0415

  other = np.zeros((8, 8, 1), np.uint8)
  (root / 'train' / 'cat' / '0.png').write_bytes(folders.encode(other, 'png'))
  capsys.readouterr()
  changed = run()
  assert changed.data_source != first.data_source
  assert 'prepared images in' in capsys.readouterr().out


@pytest.mark.parametrize(
  'extra, words',
  [
    (['--config.dataset=Not A Name'], 'not a TFDS name'),
    (['--config.dataset=cifar10', '--config.idx_dir=/tmp'], 'IDX files of'),
    (['--config.idx_dir=/tmp', '--config.image_dir=/tmp'], 'drop one'),
    (['--config.test_split='], 'test_split'),
    (['--config.image_size=-1'], 'image_size'),
    (['--config.input=disk'], 'input'),
    (
      ['--config=fashion_mnist', '--config.test_split=train[50000:]'],
      'read from the IDX files in',
    ),
    (['--config.idx_dir=/tmp', '--config.image_size=32'], 'train whole'),
    (['--strategy=mirrored', '--config.input=stream'], 'resident data only'),
    (['--config=fashion_mnist', '--config.label=label'], 'drop it'),
    (['--config.image_dir=/tmp', '--config.label=label'], 'drop it'),
  ],
)
def test_bad_data_fields_are_refused_before_tf(tmp_path, extra, words):
  from xla_mnist import config as config_lib  # noqa: PLC0415
  from xla_mnist import parse  # noqa: PLC0415

  with pytest.raises(UsageError, match=words):
    config_lib.check(parse.config_of(extra))
