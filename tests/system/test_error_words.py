"""One error, two wordings, through the command: `--fresh` and
`--config.x` on a command line, `fresh=True` and `config.x` to a library
call in another process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from support.cli import FASHION, REPO, assert_one_line_error, run_train

from xla_mnist import config as config_lib
from xla_mnist.configs import fashion_mnist
from xla_mnist.runtime import errors


def test_a_field_is_config_x_to_the_library_and_a_flag_on_a_command():
  config = fashion_mnist.get_config()
  config.batch_size = 0
  with pytest.raises(errors.UsageError) as library:
    config_lib.check(config)
  said = str(library.value)
  assert 'set config.batch_size to a whole number' in said
  assert '--' not in said

  proc = run_train(FASHION, '--config.batch_size=0')
  assert_one_line_error(proc, 2)
  flag_words = said.replace('config.batch_size', '--config.batch_size')
  assert proc.stderr == f'error: {flag_words}\n'


@pytest.mark.slow  # Imports TensorFlow, in this process and in another.
def test_an_argument_is_fresh_true_to_the_library_and_a_flag_on_a_command(
  tmp_path,
):
  from xla_mnist.workdir import resuming  # noqa: PLC0415 - imports TF.

  with pytest.raises(errors.UsageError) as library:
    resuming.check_compatible({'seed': 1}, {'seed': 2}, str(tmp_path))
  said = str(library.value)
  assert 'pass fresh=True to replace that run, or another workdir=DIR' in said

  # The same error raised in a command line's flag parser: `cli.run` speaks
  # flags before anything runs.
  program = textwrap.dedent(f"""
    from xla_mnist.runtime import cli, env

    env.quiet_by_default()
    with env.importing_tensorflow():
      from xla_mnist.workdir import resuming

    def parse(argv):
      resuming.check_compatible(
        {{'seed': 1}}, {{'seed': 2}}, {str(tmp_path)!r}
      )

    cli.run(lambda argv: None, parse)
  """)
  proc = subprocess.run(
    [sys.executable, '-c', program], cwd=REPO, capture_output=True, text=True
  )
  assert_one_line_error(proc, 2)
  flag_words = said.replace('fresh=True', '--fresh').replace(
    'workdir=DIR', '--workdir=DIR'
  )
  assert proc.stderr == f'error: {flag_words}\n'
