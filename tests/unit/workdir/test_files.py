"""Shared folders: files readable as the umask says, a workdir lock
released."""

from __future__ import annotations

import os

import pytest

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
