"""A faulty XLA cache does not stop a run: one note, then it trains as
without; but for a disk that fills as TF stores an entry (one line, and the
next run only reads)."""

import contextlib
import json
import os
import shutil
import subprocess
import time

import pytest
from support.cli import run_train, start_train
from support.disk import fill

from xla_mnist.runtime import cache_faults, xla_cache

STEPS = 30


def train(tmp_path, cache: str, data_dir: str, **env):
  """A --jit=on run with the cache in `cache`; its output and figures."""
  workdir = tmp_path / 'run'
  proc = run_train(
    '--config=fashion_mnist',
    '--jit=on',
    f'--config.num_steps={STEPS}',
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
    f'--xla_cache_dir={cache}',
    '--fresh',
    **env,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  result = json.loads((workdir / 'result.json').read_text())
  return proc, {k: result[k] for k in ('final_loss', 'test_accuracy')}


def notes(proc) -> list[str]:
  return [line for line in proc.stdout.splitlines() if line.startswith('note:')]


@pytest.fixture(scope='module')
def uncached(fashion_data_dir, tmp_path_factory):
  """What a run computes without a cache: `--xla_cache_dir=` is none."""
  tmp_path = tmp_path_factory.mktemp('uncached')
  proc, figures = train(tmp_path, '', fashion_data_dir)
  assert proc.stderr == ''
  assert 'XLA cache' not in proc.stdout and not notes(proc)
  return figures


@pytest.fixture(scope='module')
def warm(fashion_data_dir, tmp_path_factory) -> str:
  """A cache holding this program's two entries (train loop, evaluation)."""
  cache = tmp_path_factory.mktemp('warm') / 'xla'
  proc, _ = train(cache.parent, str(cache), fashion_data_dir)
  assert f'XLA cache {cache}: 2 compiled now, stored' in proc.stdout
  assert len(xla_cache.entries(str(cache))) == 2
  return str(cache)


def copy_of(warm: str, tmp_path) -> str:
  cache = str(tmp_path / 'xla')
  shutil.copytree(warm, cache)
  return cache


def entry_holding(cache: str, text: bytes) -> str:
  """The path of the entry whose HLO holds `text` (a function's name)."""
  for name in sorted(xla_cache.entries(cache)):
    path = os.path.join(cache, name)
    with open(path, 'rb') as f:
      if text in f.read():
        return path
  raise AssertionError(f'no entry holds {text}')


def assert_one_note(proc, *fragments: str) -> None:
  assert proc.stderr == ''
  (note,) = notes(proc)
  for fragment in fragments:
    assert fragment in note, note


@pytest.mark.slow
def test_a_full_cache_disk_is_loaded_from_and_not_written(
  fashion_data_dir, uncached, small_disk, tmp_path
):
  cache = small_disk('xla', 512)
  os.chmod(cache, 0o755)  # tmpfs's 1777: others could write it.
  # support.disk's fill() fills the disk, then fails to close its file: Python
  # flushes what did not fit again.
  with contextlib.suppress(OSError):
    fill(cache)
  assert shutil.disk_usage(cache).free == 0
  proc, figures = train(tmp_path, cache, fashion_data_dir)
  assert_one_note(
    proc, f'XLA cache {cache} cannot be written', 'KiB free', 'storing nothing'
  )
  assert figures == uncached
  assert os.listdir(cache) == ['filler']  # No entry, no temp file.


@pytest.mark.slow
def test_a_read_only_cache_is_loaded_from(
  fashion_data_dir, uncached, warm, small_disk, tmp_path
):
  cache = small_disk('xla', 1024)
  os.chmod(cache, 0o755)  # tmpfs's 1777: others could write it.
  for name in os.listdir(warm):
    shutil.copy(os.path.join(warm, name), cache)
  subprocess.run(['mount', '-o', 'remount,ro', cache], check=True)
  proc, figures = train(
    tmp_path,
    cache,
    fashion_data_dir,
    TF_CPP_MIN_LOG_LEVEL='0',
    TF_CPP_VMODULE='device_executable_persistor=1',
  )
  (note,) = notes(proc)
  assert 'cannot be written (Read-only file system)' in note, note
  assert 'loading from it, storing nothing' in note
  assert proc.stderr.count('Loading cached entry for:') == 2
  assert f'XLA cache {cache}:' not in proc.stdout  # It counts no new entry.
  assert figures == uncached


@pytest.mark.slow
@pytest.mark.parametrize('damage', ['truncated', 'garbage', 'renamed'])
def test_a_damaged_entry_is_removed_and_compiled_again(
  damage, fashion_data_dir, uncached, warm, tmp_path
):
  cache = copy_of(warm, tmp_path)
  path = entry_holding(cache, b'train_loop')
  if damage == 'truncated':
    os.truncate(path, os.path.getsize(path) // 2)
  elif damage == 'garbage':
    with open(path, 'wb') as f:
      f.write(os.urandom(4096))
  else:  # The other entry's bytes, whole, under this one's name.
    shutil.copy(entry_holding(cache, b'evaluate'), path)
  proc, figures = train(tmp_path, cache, fashion_data_dir)
  assert_one_note(proc, f'XLA cache {cache}: removed 1 damaged entry')
  assert f'XLA cache {cache}: 1 compiled now, stored' in proc.stdout
  assert figures == uncached
  assert xla_cache.entries(cache) == xla_cache.entries(warm)


@pytest.mark.slow
def test_an_entry_tf_refuses_makes_the_run_train_again_compiling_anew(
  fashion_data_dir, uncached, warm, tmp_path
):
  """Whole and of its name, but of other HLO: TF fails at the first call,
  and fails that program for the whole process; the second try traces anew."""
  cache = copy_of(warm, tmp_path)
  path = entry_holding(cache, b'train_loop')
  with open(path, 'rb') as f:
    content = f.read()
  with open(path, 'wb') as f:
    f.write(content.replace(b'train_loop', b'train_lopp', 1))
  proc, figures = train(tmp_path, cache, fashion_data_dir)
  assert_one_note(
    proc,
    f'XLA cache {cache} failed in TF (Serialized HLO does not match.)',
    'removed 2 entries',
    'training again, compiling anew',
  )
  assert figures == uncached
  assert set(xla_cache.entries(cache)).isdisjoint(xla_cache.entries(warm))
  for name in xla_cache.entries(cache):  # The second try's, under new keys.
    with open(os.path.join(cache, name), 'rb') as f:
      assert b'train_lopp' not in f.read()
  events = [n for n in os.listdir(tmp_path / 'run') if 'tfevents' in n]
  assert len(events) == 1  # The first try's, superseded: --fresh.


@pytest.mark.slow
def test_a_disk_that_fills_as_tf_stores_ends_the_run_and_the_next_reads(
  fashion_data_dir, uncached, small_disk, tmp_path
):
  """TF reads its cache flags once per process and fails a compile it
  cannot store: one line, and the next run finds the cache full."""
  cache = small_disk('xla', (xla_cache.MIN_FREE_BYTES >> 10) + 1024)
  os.chmod(cache, 0o755)  # tmpfs's 1777: others could write it.
  workdir = tmp_path / 'run'
  args = (
    '--config=fashion_mnist',
    '--jit=on',
    f'--config.num_steps={STEPS}',
    f'--data_dir={fashion_data_dir}',
    f'--workdir={workdir}',
    f'--xla_cache_dir={cache}',
  )
  proc = start_train(*args)
  while not workdir.exists():  # `prepare` has passed; nothing compiled yet.
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.01)
  with contextlib.suppress(OSError):
    fill(cache)
  stdout, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 1, stdout + stderr
  assert stderr.startswith(
    f'error: XLA cache {cache} failed in TF (No space left on device):'
    ' run the same command again'
  ), stderr
  assert stderr.count('\n') == 1 and 'it will resume' in stderr, stderr
  again = run_train(*args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert (
    'cannot be written' in again.stdout and 'storing nothing' in again.stdout
  )
  result = json.loads((workdir / 'result.json').read_text())
  assert {k: result[k] for k in uncached} == uncached


@pytest.mark.slow
def test_a_killed_runs_temp_file_is_removed_and_a_live_ones_kept(
  fashion_data_dir, uncached, warm, tmp_path
):
  cache = copy_of(warm, tmp_path)
  entry = sorted(xla_cache.entries(cache))[0]
  old, live = (os.path.join(cache, f'{entry}vm-1f-{p}-5e.tmp') for p in (1, 2))
  for path in (old, live):
    with open(path, 'wb') as f:
      f.write(b'\0' * 1000)
  hours_ago = time.time() - 2 * cache_faults.STALE_TEMP_SECONDS
  os.utime(old, (hours_ago, hours_ago))
  proc, figures = train(tmp_path, cache, fashion_data_dir)
  assert_one_note(proc, f'XLA cache {cache}: removed 1 temp file')
  assert f'XLA cache {cache}: all loaded from it' in proc.stdout  # Warm.
  assert figures == uncached
  assert not os.path.exists(old) and os.path.exists(live)


@pytest.mark.slow
def test_a_cache_path_that_is_a_file_is_skipped(
  fashion_data_dir, uncached, tmp_path
):
  blocker = tmp_path / 'notes.txt'
  blocker.write_text('keep me')
  for cache in (blocker, blocker / 'xla'):
    proc, figures = train(tmp_path, str(cache), fashion_data_dir)
    assert_one_note(proc, f'XLA cache {cache}', 'compiling without it')
    assert figures == uncached
  assert blocker.read_text() == 'keep me'


@pytest.mark.slow
def test_only_whole_entries_of_their_name_pass(warm, tmp_path):
  """The check before TF reads an entry: every truncation of one fails it."""
  cache = copy_of(warm, tmp_path)
  name = min(
    xla_cache.entries(cache),
    key=lambda n: os.path.getsize(os.path.join(cache, n)),
  )
  path = os.path.join(cache, name)
  assert xla_cache.whole(cache, name)
  for size in range(os.path.getsize(path) - 1, -1, -1):
    os.truncate(path, size)
    assert not xla_cache.whole(cache, name), size
