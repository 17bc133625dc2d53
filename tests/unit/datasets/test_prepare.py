"""Prepared data is the data of the source named: per-source folders, checked
arrays files, and the data dir's faults (full, read-only, leftovers, damage)."""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds
from support.cli import FASHION, assert_one_line_error, run_train, start_train
from support.idx import (
  FASHION_DIR,
  IDX_NAMES,
  make_idx_folder,
  require_fashion_mnist,
  write_idx,
)
from support.runs import train_here

from xla_mnist import data, datasets
from xla_mnist.datasets import idx_builder, prepare, prepared, registered
from xla_mnist.runtime import process
from xla_mnist.runtime.errors import DataError, UsageError
from xla_mnist.workdir import files

TRAIN_LABELS = IDX_NAMES['train'][1]


def version_dir(data_dir: str, source: data.Data, dataset='mnist') -> str:
  """Where `source`'s dataset is prepared in `data_dir`."""
  root = os.path.join(data_dir, prepared.IDX_ROOT, source.source_digest[:16])
  return os.path.join(root, 'idx_mnist', dataset, '1.0.0')


def arrays_file(folder: str, split: str = 'train') -> str:
  return os.path.join(folder, f'{prepared.ARRAYS_PREFIX}{split}.npz')


def remove_arrays_files(folder: str) -> None:
  for split in ('train', 'test'):
    os.remove(arrays_file(folder, split))


def assert_is(loaded: data.Data, arrays) -> None:
  for name in ('train', 'test'):
    split = getattr(loaded, name)
    np.testing.assert_array_equal(split.images[..., 0], arrays[name][0])
    np.testing.assert_array_equal(split.labels, arrays[name][1])


@pytest.fixture
def two_sources(tmp_path):
  a, b = str(tmp_path / 'A'), str(tmp_path / 'B')
  return (a, make_idx_folder(a, seed=1)), (b, make_idx_folder(b, seed=2))


def test_each_source_is_prepared_in_a_folder_of_its_own(two_sources, tmp_path):
  (a, arrays_a), (b, arrays_b) = two_sources
  data_dir = str(tmp_path / 'tfds')
  first = data.load('mnist', a, data_dir)
  other = data.load('mnist', b, data_dir)
  assert other.prepared_now
  assert_is(other, arrays_b)
  assert other.source_digest != first.source_digest
  assert b in other.source and other.source_digest[:12] in other.source
  # A's prepared data is still there, for a concurrent or a later run.
  again = data.load('mnist', a, data_dir)
  assert not again.prepared_now
  assert_is(again, arrays_a)


def ungzip_folder(folder: str) -> None:
  """The same IDX files, stored uncompressed: edits keep their size."""
  for name in os.listdir(folder):
    path = os.path.join(folder, name)
    with gzip.open(path) as f:
      raw = f.read()
    with open(path.removesuffix('.gz'), 'wb') as f:
      f.write(raw)
    os.remove(path)


@pytest.fixture
def settled(monkeypatch):
  """Files stamped however recently they changed: a test's files are
  written milliseconds before they are hashed, which `SETTLED_NS` excludes
  from stamps; so the shortcut is taken in these tests."""
  monkeypatch.setattr(prepare, 'SETTLED_NS', 0)


@pytest.fixture
def hashes(monkeypatch) -> dict[str, int]:
  """How often source files and arrays get hashed: the real functions,
  counted."""
  counts = {'files': 0, 'arrays': 0}

  def counted(name: str, function):
    def call(*args):
      counts[name] += 1
      return function(*args)

    return call

  monkeypatch.setattr(
    idx_builder, 'hash_file', counted('files', idx_builder.hash_file)
  )
  monkeypatch.setattr(
    prepare, 'arrays_digest', counted('arrays', prepare.arrays_digest)
  )
  return counts


def stamped(data_dir: str) -> dict:
  with open(os.path.join(data_dir, prepared.STAMPS)) as f:
    return json.load(f)


def test_what_was_checked_once_is_not_hashed_again(
  idx_folder, tmp_path, settled, hashes
):
  folder, arrays = idx_folder
  data_dir = str(tmp_path / 'tfds')
  first = data.load('mnist', folder, data_dir)
  assert hashes['files'] == 4
  data.load('mnist', folder, data_dir)  # Checks the arrays files it found.
  assert hashes['files'] == 4
  hashes['arrays'] = 0
  again = data.load('mnist', folder, data_dir)
  assert hashes == {'files': 4, 'arrays': 0}
  assert again.source_digest == first.source_digest
  assert_is(again, arrays)
  assert len(stamped(data_dir)) == 6  # Four IDX files, two arrays files.


def test_stamps_of_files_gone_or_changed_are_dropped(
  two_sources, tmp_path, settled
):
  (a, _), (b, arrays_b) = two_sources
  data_dir = str(tmp_path / 'tfds')
  data.load('mnist', a, data_dir)
  shutil.rmtree(a)  # A temporary folder, gone.
  assert_is(data.load('mnist', b, data_dir), arrays_b)
  # B's files; no arrays file yet: each was written, not checked.
  assert {os.path.dirname(p) for p in stamped(data_dir)} == {b}


def test_files_changed_just_before_their_hash_are_not_stamped(
  idx_folder, tmp_path, hashes
):
  folder, arrays = idx_folder  # Written just now.
  data_dir = str(tmp_path / 'tfds')
  for _ in range(2):
    assert_is(data.load('mnist', folder, data_dir), arrays)
  assert hashes['files'] == 8
  assert not os.path.exists(os.path.join(data_dir, prepared.STAMPS))


@pytest.mark.parametrize('content', ['', '[1, 2]', '{"x": 3}', '\x00\xff'])
def test_stamps_that_cannot_be_read_are_done_without(
  idx_folder, tmp_path, settled, content
):
  folder, arrays = idx_folder
  data_dir = tmp_path / 'tfds'
  data_dir.mkdir()
  (data_dir / prepared.STAMPS).write_text(content)
  assert_is(data.load('mnist', folder, str(data_dir)), arrays)
  assert len(stamped(str(data_dir))) == 4  # Written anew.


@pytest.mark.parametrize('stamp', [False, True])
def test_same_size_and_mtime_but_other_bytes_is_another_source(
  idx_folder, tmp_path, monkeypatch, stamp
):
  if stamp:  # The first load stamps the files: their ctime tells.
    monkeypatch.setattr(prepare, 'SETTLED_NS', 0)
  folder, arrays = idx_folder
  ungzip_folder(folder)
  data_dir = str(tmp_path / 'tfds')
  first = data.load('mnist', folder, data_dir)
  assert (prepared.STAMPS in os.listdir(data_dir)) == stamp
  path = os.path.join(folder, TRAIN_LABELS.removesuffix('.gz'))
  before = os.stat(path)
  relabelled = (arrays['train'][1] + 1) % 10
  with open(path, 'r+b') as f:
    f.seek(8)  # Past the IDX header.
    f.write(relabelled.astype(np.uint8).tobytes())
  os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
  after = os.stat(path)
  assert (after.st_size, after.st_mtime_ns) == (
    before.st_size,
    before.st_mtime_ns,
  )
  again = data.load('mnist', folder, data_dir)
  assert again.prepared_now and again.source_digest != first.source_digest
  np.testing.assert_array_equal(again.train.labels, relabelled)


@pytest.mark.parametrize('stamp', [False, True])
def test_a_touched_file_with_the_same_bytes_is_not_prepared_again(
  idx_folder, tmp_path, monkeypatch, stamp
):
  if stamp:
    monkeypatch.setattr(prepare, 'SETTLED_NS', 0)
  folder, arrays = idx_folder
  data_dir = str(tmp_path / 'tfds')
  first = data.load('mnist', folder, data_dir)
  path = os.path.join(folder, TRAIN_LABELS)
  with open(path, 'rb') as f:
    raw = f.read()
  os.remove(path)
  with open(path, 'wb') as f:  # A new file, the same bytes.
    f.write(raw)
  stat = os.stat(path)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**11))
  again = data.load('mnist', folder, data_dir)
  assert not again.prepared_now
  assert again.source_digest == first.source_digest
  assert_is(again, arrays)


def test_a_file_changed_after_it_was_identified_is_refused(
  two_sources, tmp_path
):
  (a, _), (b, _) = two_sources
  source = prepared.identify(a, idx_builder.hash_file)
  shutil.copy(os.path.join(b, TRAIN_LABELS), os.path.join(a, TRAIN_LABELS))
  data_dir = tmp_path / 'tfds'
  builder = idx_builder.IdxMnist(
    config='mnist', data_dir=str(data_dir), source=source
  )
  with pytest.raises(DataError, match='changed while the dataset was being'):
    builder.download_and_prepare()
  assert not list(data_dir.rglob('dataset_info.json'))


def swapped_from_b(path: str, b_arrays_file: str) -> None:
  shutil.copy(b_arrays_file, path)


def relabelled(path: str, _) -> None:
  """Labels changed, the stored source and digest kept."""
  with np.load(path) as f:
    content = dict(f)
  content['labels'] = (content['labels'] + 1) % 10
  np.savez(path, **content)


def byte_flipped(path: str, _) -> None:
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


def unsigned(path: str, _) -> None:
  """The arrays alone, as an older version wrote them."""
  with np.load(path) as f:
    np.savez(path, images=f['images'], labels=f['labels'])


@pytest.mark.parametrize('stamp', [False, True])
@pytest.mark.parametrize(
  'spoil', [swapped_from_b, relabelled, byte_flipped, unsigned]
)
def test_an_arrays_file_not_provably_the_sources_is_read_past_and_rewritten(
  two_sources, tmp_path, monkeypatch, spoil, stamp
):
  (a, arrays_a), (b, _) = two_sources
  data_dir = str(tmp_path / 'tfds')
  loaded = data.load('mnist', a, data_dir)
  if stamp:  # A second load stamps the arrays file it checked.
    monkeypatch.setattr(prepare, 'SETTLED_NS', 0)
    data.load('mnist', a, data_dir)
    assert os.path.abspath(arrays_file(version_dir(data_dir, loaded))) in (
      stamped(data_dir)
    )
  other = data.load('mnist', b, data_dir)
  path = arrays_file(version_dir(data_dir, loaded))
  spoil(path, arrays_file(version_dir(data_dir, other)))
  assert_is(data.load('mnist', a, data_dir), arrays_a)
  with np.load(path) as f:  # Written anew, from A's checked records.
    assert str(f['source']) == loaded.source_digest
    np.testing.assert_array_equal(f['labels'], arrays_a['train'][1])


def cut_records(folder: str, _) -> None:
  (path,) = glob.glob(os.path.join(folder, '*train.tfrecord*'))
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - 100)


def flip_a_record_byte(folder: str, _) -> None:
  (path,) = glob.glob(os.path.join(folder, '*train.tfrecord*'))
  byte_flipped(path, None)


def records_of_b(folder: str, b_folder: str) -> None:
  """B's train records, whole and of the same count, in A's place."""
  (path,) = glob.glob(os.path.join(folder, '*train.tfrecord*'))
  (other,) = glob.glob(os.path.join(b_folder, '*train.tfrecord*'))
  shutil.copy(other, path)


def drop_the_manifest(folder: str, _) -> None:
  os.remove(os.path.join(folder, prepared.MANIFEST))


def cut_dataset_info(folder: str, _) -> None:
  with open(os.path.join(folder, 'dataset_info.json'), 'r+b') as f:
    f.truncate(100)


@pytest.mark.parametrize(
  'damage, fragment',
  [
    (cut_records, 'train records'),
    (flip_a_record_byte, 'train records'),
    (records_of_b, 'train records differ from the manifest'),
    (drop_the_manifest, prepared.MANIFEST),
    (cut_dataset_info, 'cannot be read'),
  ],
)
def test_damaged_prepared_data_is_named_not_used(
  two_sources, tmp_path, damage, fragment
):
  (a, _), (b, _) = two_sources
  data_dir = str(tmp_path / 'tfds')
  folder = version_dir(data_dir, data.load('mnist', a, data_dir))
  remove_arrays_files(folder)  # Else they serve the load, checked.
  other = version_dir(data_dir, data.load('mnist', b, data_dir))
  damage(folder, other)
  with pytest.raises(DataError, match='delete that folder') as error:
    data.load('mnist', a, data_dir)
  assert fragment in str(error.value)
  # Deleting it, as the message says, prepares it anew.
  shutil.rmtree(folder)
  assert data.load('mnist', a, data_dir).prepared_now


def prepared_records_only(folder: str, data_dir: str) -> str:
  """Fashion-MNIST prepared from `folder`, its arrays files removed: a run
  reads TFDS's records. Returns the prepared version's folder."""
  prepared = version_dir(
    data_dir, data.load('fashion_mnist', folder, data_dir), 'fashion_mnist'
  )
  remove_arrays_files(prepared)
  return prepared


def train_five_steps(
  folder: str, data_dir: str, tmp_path
) -> subprocess.CompletedProcess:
  return run_train(
    FASHION,
    f'--config.idx_dir={folder}',
    '--config.num_steps=5',
    f'--data_dir={data_dir}',
    f'--workdir={tmp_path / "run"}',
  )


@pytest.mark.slow
def test_damaged_records_end_a_run_in_one_line(idx_folder, tmp_path):
  folder, _ = idx_folder
  data_dir = str(tmp_path / 'tfds')
  prepared = prepared_records_only(folder, data_dir)
  flip_a_record_byte(prepared, None)
  proc = train_five_steps(folder, data_dir, tmp_path)
  assert_one_line_error(proc, 1, 'is damaged', 'delete that folder')
  assert not (tmp_path / 'run' / 'result.json').exists()


def train_on(folder: str, data_dir, workdir, capsys) -> tuple[dict, str]:
  """A short run in this process: its result.json, and what it said."""
  train_here(
    FASHION,
    f'--config.idx_dir={folder}',
    '--config.num_steps=30',
    '--config.batch_size=50',
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
  )
  with open(os.path.join(workdir, 'result.json')) as f:
    return json.load(f), capsys.readouterr().out


@pytest.mark.slow
def test_a_second_source_in_one_data_dir_is_trained_on_and_named(
  two_sources, tmp_path, capsys
):
  (a, _), (b, _) = two_sources
  shared = tmp_path / 'tfds'
  on_a, _ = train_on(a, shared, tmp_path / 'a', capsys)
  on_b, said = train_on(b, shared, tmp_path / 'b', capsys)
  fresh_b, _ = train_on(b, tmp_path / 'fresh', tmp_path / 'fresh_b', capsys)
  digest = prepared.identify(b, idx_builder.hash_file).digest
  assert (
    f'prepared fashion_mnist IDX files from {b} (source {digest[:12]})' in said
  )
  figures = ('final_loss', 'test_accuracy')
  assert [on_b[k] for k in figures] == [fresh_b[k] for k in figures]
  assert on_b['final_loss'] != on_a['final_loss']  # So the check can fail.


@pytest.mark.slow
def test_a_data_dir_that_fills_while_preparing_ends_in_one_line(
  small_disk, tmp_path
):
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder, train=3000)  # Records of MBs, on 512 KiB.
  data_dir = small_disk('tfds', 512)
  args = (
    FASHION,
    f'--config.idx_dir={folder}',
    '--config.num_steps=5',
    f'--data_dir={data_dir}',
    f'--workdir={tmp_path / "run"}',
  )
  for _ in range(2):  # The second run finds nothing taken as prepared.
    proc = run_train(*args)
    assert_one_line_error(
      proc, 1, f'data dir {data_dir}', 'No space left on device', '--data_dir='
    )
    assert not glob.glob(
      os.path.join(data_dir, '**', 'dataset_info.json'), recursive=True
    )
    assert not glob.glob(
      os.path.join(data_dir, '**', 'incomplete.*'), recursive=True
    )


def incomplete_dirs(data_dir: str) -> list[str]:
  pattern = os.path.join(
    data_dir, prepared.IDX_ROOT, '*', '*', '*', 'incomplete.*'
  )
  return glob.glob(pattern)


@pytest.mark.slow
def test_what_a_killed_preparation_left_is_cleared_by_the_next_run(tmp_path):
  folder = str(tmp_path / 'idx')
  arrays = make_idx_folder(folder, train=20000)  # Seconds to prepare.
  data_dir = str(tmp_path / 'tfds')
  run = start_train(
    FASHION,
    f'--config.idx_dir={folder}',
    f'--data_dir={data_dir}',
    f'--workdir={tmp_path / "run"}',
  )
  try:
    while not incomplete_dirs(data_dir) and run.poll() is None:
      time.sleep(0.01)  # Not a busy loop: the run needs the CPU to get there.
    run.send_signal(signal.SIGKILL)
  finally:
    run.communicate()
  (left,) = incomplete_dirs(data_dir)
  loaded = data.load('fashion_mnist', folder, data_dir)
  assert loaded.prepared_now and not os.path.exists(left)
  assert_is(loaded, arrays)
  assert not incomplete_dirs(data_dir)


def test_a_killed_arrays_write_is_cleared_and_a_live_one_never(
  two_sources, tmp_path
):
  (a, arrays_a), (b, _) = two_sources
  data_dir = str(tmp_path / 'tfds')
  loaded = data.load('mnist', a, data_dir)
  folder = version_dir(data_dir, loaded)
  other = version_dir(data_dir, data.load('mnist', b, data_dir))
  # What a preparation of B, and an arrays write, would leave half-made.
  live_dir = os.path.join(os.path.dirname(other), 'incomplete.LIVE01_1.0.0')
  os.mkdir(live_dir)
  live_tmp = os.path.join(other, 'tmplive.tmp')
  open(live_tmp, 'wb').close()
  with files.waiting_lock(os.path.join(data_dir, prepare.PREPARE_LOCK)):
    # They are live while their run holds the lock: a run that needs no
    # lock (all prepared, arrays files whole) leaves them alone.
    runner = threading.Thread(target=data.load, args=('mnist', a, data_dir))
    runner.start()
    runner.join(timeout=300)
    assert not runner.is_alive(), 'a load of prepared data waited on the lock'
    assert os.path.isdir(live_dir) and os.path.isfile(live_tmp)
  # Their run was killed: the next run that takes the lock clears them.
  remove_arrays_files(folder)
  assert_is(data.load('mnist', a, data_dir), arrays_a)
  assert not os.path.exists(live_dir) and not os.path.exists(live_tmp)
  assert os.path.isfile(arrays_file(folder))


@pytest.mark.slow
def test_a_read_only_data_dir_with_prepared_data_still_trains(
  small_disk, tmp_path, monkeypatch
):
  """The arrays files it cannot take: the splits held in memory instead,
  where they fit; where they would not, one line, not a run out of memory."""
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  data_dir = small_disk('tfds', 8192)
  prepared = prepared_records_only(folder, data_dir)  # A run would write them.
  subprocess.run(['mount', '-o', 'remount,ro', data_dir], check=True)
  proc = train_five_steps(folder, data_dir, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'using fashion_mnist IDX files from {folder}' in proc.stdout
  assert (tmp_path / 'run' / 'result.json').is_file()
  assert not os.path.exists(arrays_file(prepared))
  monkeypatch.setattr(process, 'memory_bytes', lambda: 2**14)  # 16 KiB.
  with pytest.raises(DataError, match='make the data dir writable') as raised:
    data.load('fashion_mnist', folder, data_dir)
  assert f'cannot write {prepared}' in str(raised.value)


@pytest.mark.slow
def test_a_copy_of_the_debian_files_is_the_same_source(
  fashion_data_dir, tmp_path
):
  require_fashion_mnist()
  copy = str(tmp_path / 'copy')
  os.mkdir(copy)
  for name in os.listdir(FASHION_DIR):  # The IDX files, whatever is beside.
    if 'ubyte' in name:
      shutil.copy(os.path.join(FASHION_DIR, name), copy)  # New mtimes.
  debian = data.load('fashion_mnist', '', fashion_data_dir)
  copied = data.load('fashion_mnist', copy, fashion_data_dir)
  assert (
    debian.source_digest
    == prepared.identify(FASHION_DIR, idx_builder.hash_file).digest
  )
  assert copied.source_digest == debian.source_digest
  assert not copied.prepared_now and copy in copied.source


def test_prepared_data_is_checked_and_loaded_without_preparing(
  fashion_data_dir, settled, monkeypatch
):
  """What prepares (TFDS, the IDX reader, the lock, the hashing) loads only
  for a file not checked before: a run on prepared, stamped data finds,
  checks and loads it without."""
  data.load('fashion_mnist', '', fashion_data_dir)  # Stamps what it checks.
  for module in (data, prepared):  # Imported by a run: not these.
    assert not [v for v in vars(module).values() if v in (prepare, idx_builder)]
  for name in ('prepare', 'idx_builder'):
    monkeypatch.delattr(datasets, name, raising=False)
    monkeypatch.setitem(sys.modules, f'xla_mnist.datasets.{name}', None)
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)
  loaded = data.load('fashion_mnist', '', fashion_data_dir)
  assert not loaded.prepared_now and loaded.train.size == 60000


def test_registered_datasets_are_named_by_tfds_checksums(tmp_path):
  def digest(name: str) -> str:
    builder = tfds.builder(name, data_dir=str(tmp_path))
    assert builder.url_infos  # TFDS checks its download against these.
    return registered.facts(builder, ('train', 'test'), 0)[1]

  assert digest('mnist') == digest('mnist') != digest('fashion_mnist')


def uncompressed_folder(folder: str) -> dict[str, tuple]:
  """IDX files without gzip's timestamp: the same bytes on every call."""
  rng = np.random.default_rng(0)
  os.makedirs(folder)
  arrays = {}
  for split, n in (('train', 300), ('test', 100)):
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    images_name, labels_name = (
      name.removesuffix('.gz') for name in IDX_NAMES[split]
    )
    write_idx(os.path.join(folder, images_name), 2051, images)
    write_idx(os.path.join(folder, labels_name), 2049, labels)
    arrays[split] = (images[..., np.newaxis], labels.astype(np.int64))
  return arrays


# Digests as the code of issue 40's start computed them: checkpoints record
# the source's digest in their fingerprint, so a change would refuse every
# resume, and arrays files and manifests record the arrays' digest.
IDX_DIGEST = '5259e8653552d272069fbae801c100e410608902276cda97d8e601e01942d5f9'
ARRAYS_DIGEST = (
  'b8289996d3aba368d83cd9d26805ff8e56040e347f27eff2bef06427ec21047e'
)
DEBIAN_DIGEST = (
  '08b409aa49f053a4b7c28defb3e3ed160c0309484728f4b8aa69f1aac0ac4eae'
)
REGISTERED_DIGESTS = {
  'mnist': '8da717da6c7b468d934fa06b6b492e6294739917cd46ec192746238201bfedfa',
  'fashion_mnist': (
    'd10821a6ba8945ac4ded60beebe1add6f91c9886e741862d6ee641e9ad4e4c0d'
  ),
}


def test_source_and_arrays_digests_are_those_of_earlier_versions(tmp_path):
  folder = str(tmp_path / 'idx')
  arrays = uncompressed_folder(folder)
  data_dir = str(tmp_path / 'tfds')
  assert prepared.identify(folder, idx_builder.hash_file).digest == IDX_DIGEST
  assert prepare.arrays_digest(*arrays['train']) == ARRAYS_DIGEST
  for _ in range(2):  # Prepared, then read back.
    assert data.load('mnist', folder, data_dir).source_digest == IDX_DIGEST
  for name, digest in REGISTERED_DIGESTS.items():
    builder = tfds.builder(name, data_dir=data_dir)
    assert registered.facts(builder, ('train', 'test'), 0)[1] == digest


def test_debians_fashion_mnist_keeps_its_digest(fashion_data_dir):
  require_fashion_mnist()
  digest = prepared.identify(FASHION_DIR, idx_builder.hash_file).digest
  assert digest == DEBIAN_DIGEST
  loaded = data.load('fashion_mnist', '', fashion_data_dir)
  assert loaded.source_digest == DEBIAN_DIGEST


def test_a_registered_dataset_is_read_by_tfds_once_then_from_its_arrays(
  idx_folder, tmp_path, settled, monkeypatch
):
  folder, arrays = idx_folder
  data_dir = str(tmp_path / 'tfds')
  source = prepared.identify(folder, idx_builder.hash_file)
  idx_builder.IdxMnist(
    config='mnist', data_dir=data_dir, source=source
  ).download_and_prepare()

  def played(name: str, data_dir: str) -> tfds.core.DatasetBuilder:
    """TFDS's `mnist`, played by a prepared `idx_mnist` (no download)."""
    return idx_builder.IdxMnist(config=name, data_dir=data_dir)

  monkeypatch.setattr(tfds, 'builder', played)
  reads = []
  read = registered.read
  monkeypatch.setattr(
    registered, 'read', lambda *a: reads.append(a) or read(*a)
  )
  loads = [data.load('mnist', '', data_dir) for _ in range(3)]
  assert len(reads) == 2  # Once per split: later, its arrays files.
  for loaded in loads:
    assert_is(loaded, arrays)
    assert not loaded.prepared_now
    assert loaded.source_digest == loads[0].source_digest
  assert f'mnist from TFDS in {data_dir}' in loads[0].source
  assert len(stamped(data_dir)) == 2  # The two arrays files.
  for split, words in (('validation', "no split 'validation'"), (
    'train[:90%]+valid[:5]', "no split 'valid'"
  )):  # fmt: skip
    with pytest.raises(UsageError, match=words) as raised:
      data.load('mnist', '', data_dir, test_split=split)
    assert 'its splits: train, test' in str(raised.value)
  carved = data.load(
    'mnist', '', data_dir, train_split='train[:250]', test_split='train[250:]'
  )  # A dataset without a test split: a slice of another.
  assert carved.train.size == 250 and carved.test.size == 50
  every = data.load('mnist', '', data_dir, test_split='all')  # TFDS's own.
  assert every.test.size == 400
  assert carved.source_digest != loads[0].source_digest
