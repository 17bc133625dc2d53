"""The environment TF reads, in real processes: the user's XLA flags
checked before TF starts, and the library's import of TF as quiet as a
command's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.cli import REPO, assert_one_line_error, run_module

from xla_mnist.runtime import env

FASHION = '--config=fashion_mnist'


BAD = [
  ('XLA_FLAGS', '--bogus', '--bogus'),
  ('TF_XLA_FLAGS', '--bogus', '--bogus'),
  ('XLA_FLAGS', '--xla_cpu_enable_fast_math=maybe', 'fast_math=maybe'),
  ('TF_XLA_FLAGS', '--tf_xla_auto_jit=maybe', 'auto_jit=maybe'),
  ('XLA_FLAGS', 'garbage', "'garbage'"),
  # A good flag does not hide a bad one after it.
  ('XLA_FLAGS', '--xla_cpu_enable_fast_math=false --nope', '--nope'),
]


def train_args(idx: str, tmp_path, *more: str) -> list[str]:
  return [
    FASHION,
    f'--config.idx_dir={idx}',
    f'--data_dir={tmp_path / "d"}',
    f'--workdir={tmp_path / "w"}',
    '--config.num_steps=5',
    *more,
  ]


@pytest.mark.slow
@pytest.mark.parametrize(('name', 'value', 'named'), BAD)
def test_a_bad_xla_flag_is_a_usage_error(
  name, value, named, idx_folder, tmp_path
):
  folder, _ = idx_folder
  proc = run_module(
    'xla_mnist.train',
    *train_args(folder, tmp_path),
    **{name: value, 'XDG_CACHE_HOME': str(tmp_path / 'cache')},
  )
  assert_one_line_error(proc, 2, name, named)
  assert not os.path.exists(tmp_path / 'w' / 'result.json')


@pytest.mark.slow
def test_compare_refuses_a_bad_flag_before_its_runs(idx_folder, tmp_path):
  folder, _ = idx_folder
  workdir = tmp_path / 'cmp'
  proc = run_module(
    'xla_mnist.compare',
    f'--workdir={workdir}',
    FASHION,
    f'--config.idx_dir={folder}',
    f'--data_dir={tmp_path / "d"}',
    TF_XLA_FLAGS='--tf_xla_nonsense=1',
    XDG_CACHE_HOME=str(tmp_path / 'cache'),
  )
  assert_one_line_error(proc, 2, 'TF_XLA_FLAGS', '--tf_xla_nonsense')
  assert not workdir.exists() or not os.listdir(workdir)


@pytest.mark.slow
def test_a_good_flag_is_checked_once_and_trains(idx_folder, tmp_path):
  folder, _ = idx_folder
  cache = tmp_path / 'cache'
  flag = {'XLA_FLAGS': '--xla_cpu_enable_fast_math=false'}
  proc = run_module(
    'xla_mnist.train',
    *train_args(folder, tmp_path),
    **flag,
    XDG_CACHE_HOME=str(cache),
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stderr == ''
  with open(cache / 'xla_mnist-flags-checked.json') as f:
    assert len(json.load(f)) == 1
  # The same values again: the verdict is reused, the run still trains.
  again = run_module(
    'xla_mnist.train',
    *train_args(folder, tmp_path, '--fresh'),
    **flag,
    XDG_CACHE_HOME=str(cache),
  )
  assert again.returncode == 0, again.stderr
  with open(cache / 'xla_mnist-flags-checked.json') as f:
    assert len(json.load(f)) == 1


QUIET_API = """
import sys
from xla_mnist import trainer
from xla_mnist.configs import default

config = default.get_config()
config.update(
  dataset='fashion_mnist', idx_dir=sys.argv[1], num_steps=20, batch_size=20,
  log_every=10, profile_steps=5,
)
trainer.train_and_evaluate(config, sys.argv[2], sys.argv[3], quiet=True)
"""


def run_api(folder: str, tmp_path, **variables: str):
  environ = {
    k: v
    for k, v in os.environ.items()
    if k not in ('TF_CPP_MIN_LOG_LEVEL', *env.FLAG_VARIABLES)
  }
  return subprocess.run(
    [
      sys.executable,
      '-c',
      QUIET_API,
      folder,
      str(tmp_path / 'w'),
      str(tmp_path / 'd'),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**environ, 'XDG_CACHE_HOME': str(tmp_path / 'cache'), **variables},
  )


@pytest.mark.slow
def test_the_api_quiet_prints_nothing_without_a_log_level(idx_folder, tmp_path):
  folder, _ = idx_folder
  proc = run_api(folder, tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (proc.stdout, proc.stderr) == ('', '')
  assert os.path.isfile(tmp_path / 'w' / 'result.json')


@pytest.mark.slow
def test_the_api_shows_tf_log_when_the_user_asks(idx_folder, tmp_path):
  folder, _ = idx_folder
  proc = run_api(folder, tmp_path, TF_CPP_MIN_LOG_LEVEL='0')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'XLA service' in proc.stderr  # TF's own log, as asked.


@pytest.mark.slow
def test_the_api_refuses_a_bad_flag_at_import(idx_folder, tmp_path):
  folder, _ = idx_folder
  proc = run_api(folder, tmp_path, TF_XLA_FLAGS='--bogus')
  assert proc.returncode == 1
  assert proc.stderr.splitlines()[-1] == (
    'xla_mnist.runtime.errors.UsageError: TF_XLA_FLAGS: TF has no flag --bogus:'
    ' fix or unset TF_XLA_FLAGS (TF would stop at its first compile)'
  )


@pytest.mark.slow
def test_the_check_writes_nothing_into_the_users_dump_folder(tmp_path):
  # The check's child compiles: its dumps must not land where the run's go.
  dumps = tmp_path / 'dumps'
  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      'from xla_mnist.runtime import env; env.check_user_flags()',
    ],
    cwd=REPO,
    env={
      **os.environ,
      'XLA_FLAGS': f'--xla_dump_to={dumps}',
      'XDG_CACHE_HOME': str(tmp_path / 'cache'),
    },
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert (tmp_path / 'cache' / 'xla_mnist-flags-checked.json').exists()
  assert not dumps.exists()
