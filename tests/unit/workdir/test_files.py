"""Shared folders: files readable as the umask says, a workdir lock
released, a run's folders checked without a trace."""

from __future__ import annotations

import os

import pytest

from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files


@pytest.mark.parametrize('umask', [0o022, 0o002, 0o077])
def test_written_files_get_the_mode_the_umask_gives(umask, tmp_path):
  old = os.umask(umask)
  try:
    files.write_atomically(str(tmp_path / 'result.json'), '{}')
    with open(tmp_path / 'plain', 'w') as f:
      f.write('{}')
  finally:
    os.umask(old)
  mode = (tmp_path / 'result.json').stat().st_mode & 0o777
  assert mode == 0o666 & ~umask == (tmp_path / 'plain').stat().st_mode & 0o777


def test_a_workdir_lock_is_released_and_leaves_no_file(tmp_path):
  with files.workdir_lock(str(tmp_path)):
    assert (tmp_path / files.LOCK_FILE).read_text() == f'{os.getpid()}\n'
  assert list(tmp_path.iterdir()) == []
  with files.workdir_lock(str(tmp_path)):  # Free again.
    pass


def test_checking_a_runs_folders_makes_and_leaves_nothing(tmp_path):
  """The command's check before TF's import: a folder to be made is not
  made, and the probe of a folder that must take files leaves none."""
  (tmp_path / 'kept').mkdir()
  files.check_places(str(tmp_path / 'new' / 'run'), str(tmp_path / 'kept'))
  files.check_places(str(tmp_path / 'kept'), str(tmp_path / 'new' / 'tfds'))
  assert [p.name for p in tmp_path.iterdir()] == ['kept']
  assert not any((tmp_path / 'kept').iterdir())
  (tmp_path / 'notes.txt').write_text('keep me')
  with pytest.raises(UserError, match='notes.txt is a file: pass workdir=DIR'):
    files.check_places(str(tmp_path / 'notes.txt'), str(tmp_path / 'kept'))
  with pytest.raises(UserError, match=r'tfds cannot be written \(Not a dir'):
    files.check_places(str(tmp_path), str(tmp_path / 'notes.txt' / 'tfds'))
