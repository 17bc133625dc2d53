"""parse: the one reading of a run's flags, train's and compare's."""

from __future__ import annotations

import pytest

from xla_mnist import parse
from xla_mnist.runtime.errors import UsageError


def test_config_of_reads_the_file_overrides_and_field_flags():
  config = parse.config_of(
    ['--config=fashion_mnist', '--jit=off', '--config.batch_size=7',
     '--workdir=elsewhere', '--dump_hlo']
  )  # fmt: skip
  assert (config.dataset, config.jit, config.batch_size) == (
    'fashion_mnist', 'off', 7,
  )  # fmt: skip
  assert config.dump_hlo is True  # --workdir is train's own: left alone.


def test_the_last_config_flag_names_the_file_either_spelling():
  argv = ['--config', 'cnn', '--config=mlp']
  resolved, path = parse.resolve_argv(argv)
  assert path == parse.config_path('mlp')
  assert parse.config_name(path) == 'mlp'
  assert parse.config_of(argv).model == 'mlp'
  assert resolved == []  # Train loads the file; absl parses the rest.


@pytest.mark.parametrize(
  ('argv', 'said'),
  [
    (['--config.batch_sz=3'], 'config has no field batch_sz: did you mean'),
    (['--config.nosuch=1'], 'config has no field nosuch: see configs'),
    (['--jit=fast'], '--jit=fast: value should be one of'),
    (['--config.learning_rate=abc'], 'could not convert'),
    (['--config.batch_size=0'], 'batch_size is 0'),
    (['--config=nope'], "no packaged config 'nope'"),
    (['--config.precision=float16'], "precision 'float16' is not one of"),
  ],
)
def test_each_fault_is_one_usage_error(argv, said):
  with pytest.raises(UsageError) as raised:
    parse.config_of(argv)
  message = str(raised.value)
  assert said in message and '\n' not in message


def test_a_flag_is_read_and_removed_in_either_spelling():
  argv = ['--a=1', '--b', '2', '--a', '3', '--c']
  assert parse.value_of('--a', argv) == '3'
  assert parse.value_of('--c', argv) is None
  assert parse.without('--a', argv) == ['--b', '2', '--c']
  # A last flag without its value stays, for the parser to refuse.
  assert parse.without('--c', argv) == argv


@pytest.mark.parametrize('name', parse.packaged())
def test_a_packaged_config_is_imported_as_a_users_file_would_be_read(name):
  """A packaged config skips `user_config`'s checks: each passes them, to
  the same recipe."""
  from xla_mnist import user_config  # noqa: PLC0415

  path = parse.config_path(name)
  imported = parse.loaded(path)
  assert imported == user_config.load(path, parse.packaged())
