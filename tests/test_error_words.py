"""One error, two wordings: a library call is told `fresh=True` and
`config.x`, a command line `--fresh` and `--config.x`, through `errors.arg`
and `errors.field`; no module rewrites a message after it is raised."""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, run_train
from test_train import FASHION, assert_one_line_error

from xla_mnist import config as config_lib
from xla_mnist.configs import fashion_mnist
from xla_mnist.runtime import cli, errors

# Modules whose messages may spell their own flags: the command lines, and
# the comparison, whose training runs are given as their flags.
COMMANDS = {
  'train.py',
  'compare.py',
  'aot.py',
  'bench.py',
  'inference.py',
  'comparison.py',
}
SOURCES = [
  *sorted((pathlib.Path(REPO) / 'xla_mnist').rglob('*.py')),
  *sorted((pathlib.Path(REPO) / 'benchmarks').glob('*.py')),
]
# A spelling of an argument or field that only `errors.arg`/`field` may make.
SPELLED = re.compile(r'\w=True\b|\w=(DIR|PORT)\b|(?<![-\w./`])config\.\w')
FLAG = re.compile(r'(?<![-\w])--\w')


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
  from xla_mnist.workdir import checkpointing  # noqa: PLC0415 - imports TF.

  with pytest.raises(errors.UsageError) as library:
    checkpointing._check_compatible({'seed': 1}, {'seed': 2}, str(tmp_path))
  said = str(library.value)
  assert 'pass fresh=True to replace that run, or another workdir=DIR' in said

  # The same error raised in a command line's flag parser: `cli.run` speaks
  # flags before anything runs.
  program = textwrap.dedent(f"""
    from xla_mnist.runtime import cli, env

    env.quiet_by_default()
    with env.importing_tensorflow():
      from xla_mnist.workdir import checkpointing

    def parse(argv):
      checkpointing._check_compatible(
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


def test_outside_a_command_line_arguments_are_named_as_a_call_passes_them():
  assert errors.arg('fresh', True) == 'fresh=True'
  assert errors.field('device', 'cpu') == 'config.device=cpu'
  with errors.speaking_flags():
    assert errors.arg('fresh', True) == '--fresh'
    assert errors.arg('workdir', 'DIR') == '--workdir=DIR'
    assert errors.field('idx_dir') == '--config.idx_dir'
  assert errors.arg('workdir', 'DIR') == 'workdir=DIR'  # Left as it was.


def _messages(tree: ast.AST) -> list[tuple[int, str]]:
  """The literal text of every error a module makes: `SomeError(...)`."""
  found = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    name = getattr(node.func, 'id', None) or getattr(node.func, 'attr', '')
    if not name.endswith(('Error', 'Diverged', 'Stopped', 'RunFailed')):
      continue
    for part in ast.walk(node):
      if isinstance(part, ast.Constant) and isinstance(part.value, str):
        found.append((part.lineno, part.value))
  return found


@pytest.mark.parametrize(
  'path', SOURCES, ids=lambda p: f'{p.parent.name}/{p.name}'
)
def test_messages_name_arguments_through_errors_and_nothing_rewrites_them(
  path,
):
  source = path.read_text()
  assert not re.search(r'_as_flags|wording', source, re.I), path
  if path.name == 'errors.py':
    return
  for line, text in _messages(ast.parse(source)):
    assert not SPELLED.search(text), f'{path.name}:{line}: {text!r}'
    if path.name not in COMMANDS:
      assert not FLAG.search(text), f'{path.name}:{line}: {text!r}'


def test_the_command_lines_print_errors_as_raised():
  assert list(inspect.signature(cli.run).parameters) == ['main', 'flags_parser']
