"""Bad IDX folders and unusable paths through the CLI: one line, an exit
code, nothing half-made left behind; an oversized IDX file too. (Bad flags
and config values: test_train.py.)"""

from __future__ import annotations

import os

import numpy as np
import pytest
from support.cli import FASHION, assert_one_line_error, run_train
from support.idx import (
  IDX_NAMES,
  bomb,
  idx_header,
  make_idx_folder,
  more_than_memory,
  sparse,
  write_idx,
)

IMAGES = IDX_NAMES['train'][0]


@pytest.mark.slow
@pytest.mark.parametrize('damage', ['sparse', 'beyond_memory', 'bomb'])
def test_training_on_an_oversized_idx_file_is_one_line(tmp_path, damage):
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  path = os.path.join(folder, IMAGES)
  os.remove(path)
  if damage == 'sparse':
    sparse(path.removesuffix('.gz'), idx_header(2051, 300), 40 << 30)
  elif damage == 'beyond_memory':
    bomb(path, idx_header(2051, more_than_memory()), 0)
  else:
    bomb(path, idx_header(2051, 300), 64 << 20)
  proc = run_train(
    f'--config.idx_dir={folder}',
    f'--data_dir={tmp_path / "data"}',
    f'--workdir={tmp_path / "run"}',
    '--config.num_steps=2',
  )
  assert_one_line_error(proc, 1, IMAGES.removesuffix('.gz'))
  assert 'replace the file' in proc.stderr or 'free memory' in proc.stderr


TRAIN_IMAGES, TRAIN_LABELS = IDX_NAMES['train']


TEST_IMAGES, TEST_LABELS = IDX_NAMES['test']


# An existing folder where even root cannot create a file, as a read-only
# folder is for other users. chmod cannot show that to root, whom
# CAP_DAC_OVERRIDE lets write anywhere.
SYSFS_DIR = '/sys/kernel'


def cut_download(folder: str) -> None:
  """A download that stopped half-way: the gzip stream just ends."""
  path = os.path.join(folder, TRAIN_IMAGES)
  with open(path, 'rb') as f:
    raw = f.read()
  with open(path, 'wb') as f:
    f.write(raw[: len(raw) // 2])


def swap_images_and_labels(folder: str) -> None:
  images = os.path.join(folder, TRAIN_IMAGES)
  labels = os.path.join(folder, TRAIN_LABELS)
  os.replace(images, images + '.swap')
  os.replace(labels, images)
  os.replace(images + '.swap', labels)


def mix_releases(folder: str) -> None:
  """Test labels of another release, with one item fewer than the images."""
  write_idx(os.path.join(folder, TEST_LABELS), 2049, np.zeros(99, np.uint8))


def label_ten(folder: str) -> None:
  labels = np.zeros(300, np.uint8)
  labels[123] = 10
  write_idx(os.path.join(folder, TRAIN_LABELS), 2049, labels)


def drop_test_images(folder: str) -> None:
  """Three files of the four."""
  os.remove(os.path.join(folder, TEST_IMAGES))


def empty(folder: str) -> None:
  for name in os.listdir(folder):
    os.remove(os.path.join(folder, name))


@pytest.mark.slow
@pytest.mark.parametrize(
  'damage, fragments',
  [
    # Each fails as the IDX folder is loaded, so TF's start-up lines, which
    # differ with oneDNN on and off, are the same for all: `make test` runs
    # the first again with oneDNN flipped.
    pytest.param(
      damage,
      fragments,
      id=damage.__name__,
      marks=[pytest.mark.kernels] if damage is cut_download else [],
    )
    for damage, fragments in [
      (cut_download, [TRAIN_IMAGES, 'cannot be read', 'replace the file']),
      (
        swap_images_and_labels,
        [TRAIN_IMAGES, 'magic number 2049, expected 2051'],
      ),
      (mix_releases, [TEST_IMAGES, '100 images', TEST_LABELS, '99 labels']),
      (label_ten, [TRAIN_LABELS, 'label 10, outside 0..9']),
      (drop_test_images, [TEST_IMAGES, 'lacks']),
      (empty, ['holds none of the four IDX files', '--config.idx_dir']),
    ]
  ],
)
def test_bad_idx_folder_is_named_and_nothing_is_prepared(
  damage, fragments, tmp_path
):
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  damage(folder)
  data_dir, workdir = tmp_path / 'tfds', tmp_path / 'run'
  proc = run_train(
    FASHION,
    f'--config.idx_dir={folder}',
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
  )
  assert_one_line_error(proc, 1, *fragments)
  # Nothing a later run would take as prepared: no metadata, no records.
  prepared = [p.name for p in data_dir.rglob('*') if p.is_file()]
  assert not [n for n in prepared if 'dataset_info' in n or 'tfrecord' in n]
  assert not workdir.exists() or list(workdir.iterdir()) == []


def blocker(tmp_path) -> str:
  """A regular file to put a path under: ENOTDIR, for root too."""
  path = tmp_path / 'notes.txt'
  path.write_text('keep me')
  return str(path)


def sysfs(_) -> str:
  if not os.path.isdir(SYSFS_DIR):
    pytest.skip(f'no sysfs at {SYSFS_DIR}')
  return SYSFS_DIR


# The workdir's and data dir's faults end before TF's import; the IDX
# folder's after it, where TF's start-up lines must stay off stderr, whose
# words differ with oneDNN on and off (`kernels`).
@pytest.mark.parametrize(
  'flag, make_path, fragments',
  [
    pytest.param(
      'workdir',
      lambda tmp: os.path.join(blocker(tmp), 'run'),
      ['notes.txt/run cannot be written', 'Not a directory'],
      id='workdir_under_a_file',
    ),
    pytest.param(
      'workdir',
      sysfs,
      [f'workdir {SYSFS_DIR} cannot be written'],
      id='workdir_in_sysfs',
    ),
    pytest.param(
      'data_dir',
      blocker,
      ['data dir', 'notes.txt is a file', '--data_dir'],
      id='data_dir_is_a_file',
    ),
    pytest.param(
      'data_dir',
      lambda tmp: os.path.join(blocker(tmp), 'tfds'),
      ['notes.txt/tfds cannot be written', 'Not a directory', '--data_dir'],
      id='data_dir_under_a_file',
    ),
    pytest.param(
      'config.idx_dir',
      blocker,
      ['notes.txt is not a folder', '--config.idx_dir'],
      id='idx_dir_is_a_file',
      marks=[pytest.mark.slow, pytest.mark.kernels],
    ),
  ],
)
def test_unusable_path_is_named_and_nothing_is_written(
  flag, make_path, fragments, tmp_path
):
  folder = tmp_path / 'idx'
  make_idx_folder(str(folder))
  paths = {
    'config.idx_dir': str(folder),
    'data_dir': str(tmp_path / 'tfds'),
    'workdir': str(tmp_path / 'run'),
    'xla_cache_dir': str(tmp_path / 'xla'),
  }
  paths[flag] = make_path(tmp_path)
  proc = run_train(FASHION, *(f'--{name}={p}' for name, p in paths.items()))
  assert_one_line_error(proc, 1, *fragments)
  inputs = {*folder.iterdir(), tmp_path / 'notes.txt'}
  written = [p for p in tmp_path.rglob('*') if p.is_file() and p not in inputs]
  assert written == []
  if (tmp_path / 'notes.txt').exists():
    assert (tmp_path / 'notes.txt').read_text() == 'keep me'


def config_file(tmp_path, field: str, value: str) -> str:
  """A config file: fashion_mnist's, with `field` of another type."""
  path = tmp_path / 'custom.py'
  path.write_text(
    'import ml_collections\n'
    'from xla_mnist.configs import fashion_mnist\n\n\n'
    'def get_config():\n'
    '  fields = fashion_mnist.get_config().to_dict()\n'
    f'  fields[{field!r}] = {value}\n'
    '  return ml_collections.ConfigDict(fields)\n'
  )
  return f'--config={path}'


@pytest.mark.parametrize(
  'make_args, fragments',
  [
    pytest.param(  # Finite in float64, inf in float32: was a traceback.
      lambda _: ['--config.learning_rate=1e39'],
      ['learning_rate is 1e+39', '--config.learning_rate', '(float32)'],
      id='float32_overflow',
    ),
    pytest.param(  # 0 in float32: no training at all.
      lambda _: ['--config.learning_rate=1e-46'],
      ['learning_rate is 1e-46', '1.175e-38'],
      id='float32_underflow',
    ),
    pytest.param(
      lambda _: ['--config.batch_size=2147483648'],
      ['batch_size is 2147483648', '1 to 2147483647 (int32)'],
      id='int32_overflow',
    ),
    pytest.param(
      lambda _: ['--config.seed=9223372036854775808'],
      ['seed is 9223372036854775808', '9223372036854775807 (int64)'],
      id='int64_overflow',
    ),
    pytest.param(
      lambda _: ['--config.steps_per_loop=-1'],
      ['steps_per_loop is -1', '--config.steps_per_loop', 'from 0 to'],
      id='int_below_range',
    ),
    pytest.param(
      lambda tmp: [config_file(tmp, 'batch_size', '100.0')],
      ['batch_size is 100.0', 'a whole number'],
      id='float_for_an_int',
    ),
    pytest.param(
      lambda tmp: [config_file(tmp, 'dump_hlo', "'yes'")],
      ["dump_hlo is 'yes'", '--config.dump_hlo to True or False'],
      id='str_for_a_bool',
    ),
    pytest.param(
      lambda tmp: [config_file(tmp, 'learning_rate', 'True')],
      ['learning_rate is True'],
      id='bool_for_a_float',
    ),
  ],
)
def test_config_numbers_outside_what_tf_holds_are_refused_before_tf(
  make_args, fragments, tmp_path
):
  workdir = tmp_path / 'run'
  proc = run_train(FASHION, f'--workdir={workdir}', *make_args(tmp_path))
  assert_one_line_error(proc, 2, *fragments)
  assert not workdir.exists()
