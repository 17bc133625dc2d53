"""The XLA cache runs only what the user's own files hold.

Its entries are machine code TF runs: a folder another user owns or can
write, an entry another user made, is never used. These tests make files
of another user: they need root (CI is root)."""

import os
import stat
import sys

import pytest
from support.idx import IDX_NAMES

from xla_mnist import runtime
from xla_mnist.runtime import process, xla_cache

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
    prepared = process.xla_cache_in(str(cache))
    assert prepared.directory == ''
    assert 'white space' in prepared.notes[0]
    assert not cache.exists()
  assert process.xla_cache_in(str(real / 'cache')).directory


def test_the_folders_it_creates_are_the_users_alone(tmp_path):
  cache = str(tmp_path / 'home' / '.cache' / 'xla_mnist')
  os.umask(old := os.umask(0))  # Whatever the umask allows.
  try:
    assert process.xla_cache_in(cache).directory == cache
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
  prepared = process.xla_cache_in(cache)
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
  (note,) = process.xla_cache_in(cache).notes
  assert f'is in {tmp_path / "shared"}, {why}: not used' in note, note


def test_the_users_folder_in_a_sticky_temp_area_is_used(tmp_path):
  area = tmp_path / 'tmp'
  area.mkdir()
  os.chmod(area, 0o1777)
  for mode in (0o700, 0o755):
    cache = str(area / f'xla{mode:o}')
    os.mkdir(cache, mode)
    os.chmod(cache, mode)
    assert process.xla_cache_in(cache) == xla_cache.Cache(cache)


def varint(n: int) -> bytes:
  out = b''
  while n > 0x7F:
    out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
  return out + bytes([n])


def field(number: int, value: int | bytes) -> bytes:
  """A protobuf field: a varint (wire type 0), or length-delimited (2)."""
  if isinstance(value, int):
    return varint(number << 3) + varint(value)
  return varint(number << 3 | 2) + varint(len(value)) + value


def put_whole(cache: str) -> str:
  """An entry as TF writes one: key (naming the file), HLO, executable."""
  key = field(1, 1) + field(2, 2) + field(3, b'cluster_3_CPU_0')
  key += field(4, b'xla_compile_cache')
  path = os.path.join(cache, ENTRY)
  with open(path, 'wb') as f:
    f.write(field(1, key) + field(2, b'hlo') + field(3, b'machine code'))
  return path


def test_a_sound_cache_goes_to_tf_without_loading_the_fault_handling(
  tmp_path, monkeypatch
):
  monkeypatch.delattr(runtime, 'cache_faults', raising=False)
  monkeypatch.setitem(sys.modules, 'xla_mnist.runtime.cache_faults', None)
  cache = own_cache(tmp_path)
  put_whole(cache)
  put(cache, 'notes.txt', mode=0o666)  # Not TF's: left alone.
  assert process.xla_cache_in(cache) == xla_cache.Cache(cache)


def test_a_cut_entry_is_removed_before_tf_reads_it(tmp_path):
  cache = own_cache(tmp_path)
  path = put_whole(cache)
  assert xla_cache.whole(cache, ENTRY)
  os.truncate(path, os.path.getsize(path) - 1)
  (note,) = process.xla_cache_in(cache).notes
  assert (
    note == f'note: XLA cache {cache}: removed 1 damaged entry: compiling again'
  )
  assert os.listdir(cache) == []


def test_a_symlinked_folder_is_checked_and_given_resolved(tmp_path):
  real = own_cache(tmp_path)
  link = tmp_path / 'link'
  link.symlink_to(real)
  assert process.xla_cache_in(str(link)).directory == real
  os.chmod(real, 0o777)
  assert process.xla_cache_in(str(link)).directory == ''


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
  prepared = process.xla_cache_in(cache)
  assert prepared.directory == cache
  if kept:  # It then fails `whole`, and is removed as damaged.
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
  (note,) = process.xla_cache_in(cache).notes
  assert 'removed 2 entries not only yours' in note
  assert os.listdir(cache) == [] and target.exists()


def test_a_hard_link_to_another_users_file_is_removed(tmp_path):
  cache = own_cache(tmp_path)
  theirs = put(str(tmp_path), 'theirs.pb', uid=NOBODY, mode=0o644)
  os.link(theirs, os.path.join(cache, ENTRY))
  (note,) = process.xla_cache_in(cache).notes
  assert 'removed 1 entry not only yours' in note


IMAGES = IDX_NAMES['train'][0]
