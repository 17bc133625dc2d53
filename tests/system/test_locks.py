"""Shared folders between real processes: one run per workdir, one
preparer per data dir, stale and killed holders."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from support.cli import FASHION, REPO, assert_one_line_error, run_train
from support.idx import require_fashion_mnist

from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files

HOLDER = """
import sys, time
from xla_mnist.workdir import files
from xla_mnist.runtime.errors import UserError
with files.workdir_lock(sys.argv[1]):
  print('held', flush=True)
  time.sleep(600)
"""


def hold(workdir) -> subprocess.Popen:
  """A process that holds `workdir`'s lock until it is killed."""
  proc = subprocess.Popen(
    [sys.executable, '-c', HOLDER, str(workdir)],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  assert proc.stdout.readline() == 'held\n'
  return proc


@pytest.mark.slow
def test_second_run_on_a_held_workdir_stops_at_once_naming_the_holder(
  tmp_path,
):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  holder = hold(workdir)
  try:
    proc = run_train(FASHION, f'--workdir={workdir}', '--config.num_steps=5')
    assert_one_line_error(
      proc, 1, f'workdir {workdir} is in use', f'process {holder.pid}'
    )
    assert sorted(p.name for p in workdir.iterdir()) == [files.LOCK_FILE]
  finally:
    holder.kill()
    holder.wait()


@pytest.mark.parametrize(
  'stale',
  ['4194303999\n', 'garbage\nsecond line\n\x00\xff'],
  ids=['long_pid', 'garbage'],
)
def test_a_stale_lock_file_is_rewritten_and_the_holder_named_in_one_line(
  stale, tmp_path
):
  lock = tmp_path / files.LOCK_FILE
  lock.write_text(stale)  # As kill -9 leaves it, or anything.
  holder = hold(tmp_path)
  try:
    assert lock.read_text() == f'{holder.pid}\n'
    with pytest.raises(UserError) as error:
      with files.workdir_lock(str(tmp_path)):
        pass
    assert str(error.value) == (
      f'workdir {tmp_path} is in use by another run (process {holder.pid}):'
      ' wait for it to end, or pass another workdir=DIR'
    )
  finally:
    holder.kill()
    holder.wait()


FLOCKER = """
import fcntl, sys, time
f = open(sys.argv[1], 'r+')
fcntl.flock(f, fcntl.LOCK_EX)
print('held', flush=True)
time.sleep(600)
"""


def test_a_holder_that_has_not_written_its_id_yet_is_not_named(tmp_path):
  lock = tmp_path / files.LOCK_FILE
  lock.write_text('garbage\n4194303999\n')
  # Locked, its old content not yet replaced: the moment before the pwrite.
  holder = subprocess.Popen(
    [sys.executable, '-c', FLOCKER, str(lock)],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline() == 'held\n'
    with pytest.raises(UserError) as error:
      with files.workdir_lock(str(tmp_path)):
        pass
    assert str(error.value) == (
      f'workdir {tmp_path} is in use by another run: wait for it to end, or'
      ' pass another workdir=DIR'
    )
  finally:
    holder.kill()
    holder.wait()


@pytest.mark.slow
def test_a_lock_left_by_a_killed_run_does_not_block_the_next(
  fashion_data_dir, tmp_path
):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  holder = hold(workdir)
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  assert (workdir / files.LOCK_FILE).exists()  # Left behind, unlocked.
  proc = run_train(
    FASHION,
    f'--workdir={workdir}',
    f'--data_dir={fashion_data_dir}',
    '--config.num_steps=20',
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (workdir / 'result.json').exists()
  assert not (workdir / files.LOCK_FILE).exists()


@pytest.mark.slow
def test_three_runs_started_at_once_on_a_fresh_data_dir_all_train(tmp_path):
  require_fashion_mnist()
  data_dir = tmp_path / 'tfds'
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        '-m',
        'xla_mnist.train',
        FASHION,
        f'--data_dir={data_dir}',
        f'--workdir={tmp_path / f"run{i}"}',
        '--config.num_steps=20',
        '--config.profile_steps=0',
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(3)
  ]
  outputs = [p.communicate(timeout=600) for p in procs]
  for proc, (_, err) in zip(procs, outputs, strict=True):
    assert proc.returncode == 0, err[-3000:]
    assert err == ''
  said = [out.splitlines()[0].split()[0] for out, _ in outputs]
  assert sorted(said) == ['prepared', 'using', 'using'], said
