"""The XLA cache runs only what the user's own files hold.

Its entries are machine code TF runs: a folder another user owns or can
write, an entry another user owns, a symlink or an entry others can write
is never read. Run as root (CI), "another user" is uid 65534 by chown.
"""

import gzip
import json
import os
import shutil
import stat
import struct
import time
import zlib

import numpy as np
import pytest
from conftest import (
  IDX_NAMES,
  make_idx_folder,
  run_module,
  run_train,
  write_idx,
)
from test_aot import exported, run_classify, trained  # noqa: F401

# (fixtures: test_aot keeps the built runtime, reused here)
from test_train import assert_one_line_error

from xla_mnist.datasets import identity, idx_builder
from xla_mnist.runtime import xla_cache
from xla_mnist.runtime.errors import DataError

NOBODY = 65534
ENTRY = 'xla_compile_cache__1__2__cluster_3_CPU_0.pb'


@pytest.fixture(autouse=True)
def as_root():
  if os.geteuid() != 0:
    pytest.skip('makes files of another user: needs root (CI is root)')


def own_cache(tmp_path, mode=0o700) -> str:
  cache = tmp_path / 'xla'
  cache.mkdir(mode=mode)
  os.chmod(cache, mode)
  return str(cache)


def put(cache: str, name: str = ENTRY, uid: int = 0, mode: int = 0o600):
  path = os.path.join(cache, name)
  with open(path, 'wb') as f:
    f.write(b'machine code')
  os.chown(path, uid, uid)
  os.chmod(path, mode)
  return path


@pytest.mark.parametrize('name', ['sp ace', 'tab\there', 'new\nline'])
def test_a_path_with_white_space_is_not_used_nor_made(tmp_path, name):
  # TF splits TF_XLA_FLAGS at white space: the cache would be another folder.
  real = tmp_path / 'real'
  real.mkdir()
  (tmp_path / 'link').symlink_to(tmp_path / name, target_is_directory=True)
  for cache in (tmp_path / name / 'cache', tmp_path / 'link' / 'cache'):
    prepared = xla_cache.prepare(str(cache))
    assert prepared.directory == ''
    assert 'white space' in prepared.notes[0]
    assert not cache.exists()
  assert xla_cache.prepare(str(real / 'cache')).directory


def test_the_folders_it_creates_are_the_users_alone(tmp_path):
  cache = str(tmp_path / 'home' / '.cache' / 'xla_mnist')
  os.umask(old := os.umask(0))  # Whatever the umask allows.
  try:
    assert xla_cache.prepare(cache).directory == cache
  finally:
    os.umask(old)
  for folder in (cache, os.path.dirname(cache), str(tmp_path / 'home')):
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder


@pytest.mark.parametrize(
  ('owner', 'mode', 'why'),
  [
    (NOBODY, 0o700, 'belongs to another user (uid 65534)'),
    (NOBODY, 0o777, 'belongs to another user (uid 65534)'),
    (0, 0o777, 'can be written by others (mode 0777)'),
    (0, 0o770, 'can be written by others (mode 0770)'),
    (
      0,
      0o1777,
      'can be written by others (mode 1777)',
    ),  # Sticky, yet not ours.
  ],
)
def test_a_folder_not_the_users_own_is_not_used(tmp_path, owner, mode, why):
  cache = own_cache(tmp_path, mode)
  put(cache, uid=NOBODY, mode=0o666)
  os.chown(cache, owner, owner)
  prepared = xla_cache.prepare(cache)
  assert prepared.directory == ''
  (note,) = prepared.notes
  assert note.startswith(f'note: XLA cache {cache} {why}: not used; '), note
  assert 'xla_cache_dir' in note
  assert os.listdir(cache) == [ENTRY]  # Not ours to clean.


@pytest.mark.parametrize(
  ('owner', 'mode', 'why'),
  [
    (0, 0o777, 'which others can write'),
    (0, 0o775, 'which others can write'),
    (NOBODY, 0o755, 'which belongs to another user (uid 65534)'),
    (NOBODY, 0o1777, 'which belongs to another user (uid 65534)'),
  ],
)
def test_a_folder_under_one_others_control_is_not_used(
  tmp_path, owner, mode, why
):
  above = tmp_path / 'shared' / 'deeper'
  above.mkdir(parents=True)
  cache = own_cache(above)
  os.chown(tmp_path / 'shared', owner, owner)
  os.chmod(tmp_path / 'shared', mode)
  (note,) = xla_cache.prepare(cache).notes
  assert f'is in {tmp_path / "shared"}, {why}: not used' in note, note


def test_the_users_folder_in_a_sticky_temp_area_is_used(tmp_path):
  area = tmp_path / 'tmp'
  area.mkdir()
  os.chmod(area, 0o1777)
  for mode in (0o700, 0o755):
    cache = str(area / f'xla{mode:o}')
    os.mkdir(cache, mode)
    os.chmod(cache, mode)
    assert xla_cache.prepare(cache) == xla_cache.Cache(cache)


def test_a_symlinked_folder_is_checked_and_given_resolved(tmp_path):
  real = own_cache(tmp_path)
  link = tmp_path / 'link'
  link.symlink_to(real)
  assert xla_cache.prepare(str(link)).directory == real
  os.chmod(real, 0o777)
  assert xla_cache.prepare(str(link)).directory == ''


@pytest.mark.parametrize(
  ('folder_mode', 'uid', 'mode', 'kept'),
  [
    (0o700, NOBODY, 0o644, False),  # Another user's.
    (0o700, NOBODY, 0o666, False),
    (0o755, 0, 0o666, False),  # Others can reach and write it.
    (0o750, 0, 0o664, False),  # The group can.
    (0o700, 0, 0o666, True),  # No one else can reach it.
    (0o700, 0, 0o664, True),  # A umask of 002, in the folder made 0700.
    (0o755, 0, 0o644, True),
  ],
)
def test_entries_not_only_the_users_are_removed_unread(
  tmp_path, folder_mode, uid, mode, kept
):
  cache = own_cache(tmp_path, folder_mode)
  put(cache, uid=uid, mode=mode)
  prepared = xla_cache.prepare(cache)
  assert prepared.directory == cache
  if kept:  # It then fails `_whole`, and is removed as damaged.
    assert 'not only yours' not in ' '.join(prepared.notes)
    return
  assert prepared.notes[0] == (
    f'note: XLA cache {cache}: removed 1 entry not only yours (another'
    " user's, writable by others, or a symlink), unread: compiling again"
  )
  assert os.listdir(cache) == []


def test_a_symlinked_entry_is_removed_not_its_target(tmp_path):
  cache = own_cache(tmp_path)
  target = tmp_path / 'elsewhere.pb'
  target.write_bytes(b'machine code')
  os.symlink(target, os.path.join(cache, ENTRY))
  os.symlink(target, os.path.join(cache, ENTRY + 'host-1-2-3.tmp'))
  (note,) = xla_cache.prepare(cache).notes
  assert 'removed 2 entries not only yours' in note
  assert os.listdir(cache) == [] and target.exists()


def test_a_hard_link_to_another_users_file_is_removed(tmp_path):
  cache = own_cache(tmp_path)
  theirs = put(str(tmp_path), 'theirs.pb', uid=NOBODY, mode=0o644)
  os.link(theirs, os.path.join(cache, ENTRY))
  (note,) = xla_cache.prepare(cache).notes
  assert 'removed 1 entry not only yours' in note


# Real runs: the note, and TF loads nothing of another user's.


def train(tmp_path, cache: str, data_dir: str):
  workdir = tmp_path / 'run'
  proc = run_train(
    '--config=fashion_mnist',
    '--jit=on',
    '--config.num_steps=20',
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
    f'--xla_cache_dir={cache}',
    '--fresh',
    TF_CPP_MIN_LOG_LEVEL='0',
    TF_CPP_VMODULE='device_executable_persistor=1',
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert (workdir / 'result.json').exists()
  return proc


def notes(proc) -> list[str]:
  return [line for line in proc.stdout.splitlines() if line.startswith('note:')]


@pytest.fixture(scope='module')
def warm(fashion_data_dir, tmp_path_factory) -> str:
  cache = tmp_path_factory.mktemp('warm') / 'xla'
  proc = train(cache.parent, str(cache), fashion_data_dir)
  assert f'XLA cache {cache}: 2 compiled now, stored' in proc.stdout
  return str(cache)


@pytest.mark.slow
def test_another_users_writable_cache_is_not_run(
  warm, fashion_data_dir, tmp_path
):
  cache = str(tmp_path / 'xla')
  shutil.copytree(warm, cache)
  for path in [cache, *(os.path.join(cache, n) for n in os.listdir(cache))]:
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o777 if path == cache else 0o666)
  proc = train(tmp_path, cache, fashion_data_dir)
  (note,) = notes(proc)
  assert f'{cache} belongs to another user (uid 65534): not used' in note
  assert '--xla_cache_dir' in note
  assert 'Loading cached entry' not in proc.stderr
  assert f'XLA cache {cache}' not in proc.stdout.replace(note, '')
  assert len(xla_cache.entries(cache)) == 2  # Left as they were.


@pytest.mark.slow
def test_another_users_entry_in_the_users_cache_is_compiled_again(
  warm, fashion_data_dir, tmp_path
):
  cache = str(tmp_path / 'xla')
  shutil.copytree(warm, cache)
  os.chmod(cache, 0o755)
  first, second = sorted(xla_cache.entries(cache))
  os.chown(os.path.join(cache, first), NOBODY, NOBODY)
  proc = train(tmp_path, cache, fashion_data_dir)
  (note,) = notes(proc)
  assert 'removed 1 entry not only yours' in note
  assert proc.stderr.count('Loading cached entry') == 1
  assert f'XLA cache {cache}: 1 compiled now, stored' in proc.stdout
  assert os.stat(os.path.join(cache, first)).st_uid == 0
  json.loads((tmp_path / 'run' / 'result.json').read_text())


# IDX files are checked against their header and the machine's memory
# before they are read: training, the export and classify alike.


def idx_header(magic: int, count: int) -> bytes:
  dims = (count, 28, 28) if magic == 2051 else (count,)
  return struct.pack(f'>i{len(dims)}i', magic, *dims)


def sparse(path: str, head: bytes, size: int) -> str:
  """A file of `size` bytes that holds only `head`: no disk, no time."""
  with open(path, 'wb') as f:
    f.write(head)
    f.truncate(size)
  return path


def bomb(path: str, head: bytes, zeros: int) -> str:
  """A small gzip file of `head` then `zeros` zero bytes unzipped."""
  unzip = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
  chunk = bytes(1 << 20)
  with open(path, 'wb') as f:
    f.write(unzip.compress(head))
    for _ in range(zeros >> 20):
      f.write(unzip.compress(chunk))
    f.write(unzip.flush())
  return path


def more_than_memory() -> int:
  """An image count whose bytes the machine's memory cannot hold."""
  # Twice the memory free now: free memory changes while a test runs.
  return min(2 * idx_builder.available_memory() // 784, 2**31 - 1)


IMAGES = IDX_NAMES['train'][0]


def test_a_file_far_bigger_than_its_header_is_refused_unread(tmp_path):
  path = sparse(str(tmp_path / 'images'), idx_header(2051, 10), 40 << 30)
  started = time.monotonic()
  with pytest.raises(DataError) as error:
    idx_builder.read_idx(path, 2051, (28, 28))
  assert time.monotonic() - started < 5
  assert str(error.value) == (
    f'{path} is truncated or padded: {40 << 30} bytes, its header announces'
    f' 10 items ({16 + 7840} bytes): replace the file'
  )


def test_a_header_that_promises_more_than_the_file_is_refused(tmp_path):
  path = sparse(str(tmp_path / 'images'), idx_header(2051, 60000), 1000)
  with pytest.raises(DataError, match='1000 bytes, its header announces 60000'):
    idx_builder.read_idx(path, 2051, (28, 28))


@pytest.mark.parametrize('gzipped', [False, True])
def test_a_header_beyond_memory_is_refused_before_reading(tmp_path, gzipped):
  count = more_than_memory()
  head = idx_header(2051, count)
  path = str(tmp_path / f'images{".gz" * gzipped}')
  if gzipped:
    bomb(path, head, 0)
  else:
    sparse(path, head, 16 + count * 784)  # Sparse: as big as it promises.
  with pytest.raises(DataError) as error:
    idx_builder.read_idx(path, 2051, (28, 28))
  message = str(error.value)
  assert message.startswith(f'{path}: its header announces {count} items')
  assert 'MiB available: use a smaller IDX file or free memory' in message


def test_a_gzip_bomb_is_unzipped_no_further_than_its_header(tmp_path):
  # Small enough for the header's count: only unzipping can tell.
  path = bomb(str(tmp_path / 'labels.gz'), idx_header(2049, 10**5), 64 << 20)
  assert os.path.getsize(path) < 10**5
  started = time.monotonic()
  with pytest.raises(DataError, match=r': 100009 bytes, its header announces'):
    idx_builder.read_idx(path, 2049, ())
  assert time.monotonic() - started < 1  # It stopped there, not at 64 MiB.


def test_a_gzip_file_bigger_than_its_header_allows_is_refused_unread(
  tmp_path,
):
  path = bomb(str(tmp_path / 'labels.gz'), idx_header(2049, 10), 64 << 20)
  with pytest.raises(DataError, match=r'bytes gzipped, its header announces'):
    idx_builder.read_idx(path, 2049, ())


def test_gzip_files_of_several_members_and_padding_still_read(tmp_path):
  path = str(tmp_path / 'labels.gz')
  with open(path, 'wb') as f:
    f.write(gzip.compress(idx_header(2049, 3) + b'\1'))
    f.write(gzip.compress(b'\2\3') + bytes(100))
  labels = idx_builder.read_idx(path, 2049, ())
  assert labels.tolist() == [1, 2, 3]


def test_a_negative_count_is_refused(tmp_path):
  path = sparse(str(tmp_path / 'labels'), idx_header(2049, -5), 12)
  with pytest.raises(DataError, match='announces -5 items: not an IDX file'):
    idx_builder.read_idx(path, 2049, ())


def test_identify_checks_sizes_before_hashing(tmp_path):
  make_idx_folder(str(tmp_path))
  path = os.path.join(tmp_path, IMAGES)
  os.remove(path)
  sparse(path.removesuffix('.gz'), idx_header(2051, 300), 40 << 30)
  started = time.monotonic()
  with pytest.raises(DataError, match='is truncated or padded: 42949672960'):
    identity.identify(str(tmp_path), idx_builder.hash_file)
  assert time.monotonic() - started < 5  # 40 GB were not hashed.


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


# classify and the export name their own files and their own fix.


@pytest.mark.slow
def test_the_exports_check_folder_names_the_exports_files_and_fix(
  tmp_path, fashion_data_dir
):
  workdir = str(tmp_path / 'run')
  train = run_train(
    '--config=fashion_mnist',
    '--config.num_steps=2',
    f'--workdir={workdir}',
    f'--data_dir={fashion_data_dir}',
  )
  assert train.returncode == 0, train.stderr
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  test_images, test_labels = IDX_NAMES['test']
  os.remove(os.path.join(folder, test_labels))
  for name in IDX_NAMES['train']:  # Training's files play no part.
    os.remove(os.path.join(folder, name))
  proc = run_module(
    'xla_mnist.aot', f'--workdir={workdir}', f'--check_dir={folder}'
  )
  assert_one_line_error(
    proc,
    1,
    f'{folder} lacks {test_labels}: put {test_images}, {test_labels} there',
    'point --check_dir at the IDX test set, or --check_dir= to skip',
  )
  assert 'train-' not in proc.stderr and 'idx_dir' not in proc.stderr
  # A file beyond memory is refused before the build, in one line too.
  os.remove(os.path.join(folder, test_images))
  bomb(
    os.path.join(folder, test_images), idx_header(2051, more_than_memory()), 0
  )
  write_idx(os.path.join(folder, test_labels), 2049, np.zeros(3, np.uint8))
  proc = run_module(
    'xla_mnist.aot', f'--workdir={workdir}', f'--check_dir={folder}'
  )
  assert_one_line_error(proc, 1, test_images, 'free memory')


@pytest.mark.slow
def test_classify_refuses_oversized_files_and_names_its_own_fix(
  exported,  # noqa: F811 - test_aot's fixture.
  tmp_path,
):
  workdir, _ = exported
  binary = os.path.join(workdir, 'aot', 'classify')
  cases = {
    'sparse': sparse(str(tmp_path / 'sparse'), idx_header(2051, 10), 40 << 30),
    'short': sparse(str(tmp_path / 'short'), idx_header(2051, 60000), 1000),
    'memory': bomb(
      str(tmp_path / 'memory.gz'), idx_header(2051, more_than_memory()), 0
    ),
    'bomb': bomb(str(tmp_path / 'bomb.gz'), idx_header(2051, 1000), 64 << 20),
    'negative': sparse(str(tmp_path / 'negative'), idx_header(2051, -5), 16),
  }
  for name, fragment in [
    ('sparse', '42949672960 bytes, its header announces 10 items'),
    ('short', '1000 bytes, its header announces 60000 items'),
    ('memory', 'MiB available: use a smaller IDX file or free memory'),
    ('bomb', '784017 bytes, its header announces 1000 items'),
    ('negative', 'announces -5 items: not an IDX file'),
  ]:
    assert_one_line_error(run_classify(binary, cases[name]), 1, fragment)
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  os.remove(os.path.join(folder, IDX_NAMES['test'][1]))
  assert_one_line_error(
    run_classify(binary, folder),
    1,
    'is missing: classify reads the IDX test set',
    'or give it an IDX image file alone',
  )
