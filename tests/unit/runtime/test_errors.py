"""One error, two wordings: a library call is told `fresh=True` and
`config.x`, a command line `--fresh` and `--config.x`, through `errors.arg`
and `errors.field`; no module rewrites a message after it is raised; an
error's first line."""

from __future__ import annotations

import ast
import inspect
import pathlib
import re

import pytest
from support.cli import REPO

from xla_mnist.runtime import cli, errors


@pytest.mark.parametrize(
  'error, named, line',
  [
    (ValueError('bad value\nmore'), False, 'bad value'),
    (ValueError('  \n bad value.\n'), True, 'ValueError: bad value.'),
    (OSError(), False, 'OSError'),
    (
      RuntimeError(
        '{{function_node __wrapped__SaveV2_dtypes_2_device_/job:localhost}}'
        ' /w/ckpt; No space left on device [Op:SaveV2]'
      ),
      False,
      '/w/ckpt; No space left on device [Op:SaveV2]',
    ),
    (KeyError('a}} b'), False, "'a}} b'"),  # Only TF's tag goes.
  ],
)
def test_an_errors_first_line(error, named, line):
  assert errors.first_line(error, named=named) == line


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
