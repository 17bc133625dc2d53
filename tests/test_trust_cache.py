"""The XLA cache runs only what the user's own files hold.

Its entries are machine code TF runs: a folder another user owns or can
write, an entry another user owns, a symlink or an entry others can write
is never read. Run as root (CI), "another user" is uid 65534 by chown.
"""

import json
import os
import shutil
import stat

import pytest
from conftest import run_train

from xla_mnist import xla_cache

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
