"""The XLA cache runs only what the user's own files hold, in real runs:
another user's writable cache is not run, another user's entry is compiled
again. These tests make files of another user: they need root (CI is
root)."""

import json
import os
import shutil

import pytest
from support.cli import run_train
from support.idx import IDX_NAMES

from xla_mnist.runtime import xla_cache

NOBODY = 65534


@pytest.fixture(autouse=True)
def as_root():
  if os.geteuid() != 0:
    pytest.skip('makes files of another user: needs root (CI is root)')


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


IMAGES = IDX_NAMES['train'][0]
