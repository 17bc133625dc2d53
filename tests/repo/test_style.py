"""The package's shape, kept so: the recipe at the top of the package and
the machinery in subpackages, no sprawling function, no `print` but the one
that ends a command on stderr (`cli.fail`): the commands and the library
speak through one logger (`runtime.console`)."""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
  'xla_mnist',
)


# A guard against sprawl, not a reason to split a function that reads
# top-down.
MAX_FUNCTION_LINES = 80


# The top of the package is the recipe (the core that "Read one run" walks,
# and a strategy's program) and the commands' entries with their one parse;
# the rest lives in subpackages named for their role (docs/development.md).
RECIPE = {
  'config', 'data', 'input_pipeline', 'model', 'step', 'program', 'replicated',
  'loop', 'optimizers',
}  # fmt: skip
ENTRIES = {
  'trainer', 'train', 'parse', 'user_config', 'compare', 'aot', '__init__',
}  # fmt: skip


def modules() -> list[str]:
  return sorted(
    os.path.join(root, name)
    for root, _, names in os.walk(PACKAGE)
    for name in names
    if name.endswith('.py')
  )


def tree(path: str) -> ast.Module:
  with open(path) as f:
    return ast.parse(f.read(), path)


@pytest.mark.parametrize('path', modules(), ids=os.path.basename)
def test_no_function_sprawls(path):
  long = [
    f'{node.name} ({node.end_lineno - node.lineno + 1} lines)'
    for node in ast.walk(tree(path))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
  ]
  assert not long, f'split {", ".join(long)}'


@pytest.mark.parametrize('path', modules(), ids=os.path.basename)
def test_one_voice(path):
  calls = [
    node.lineno
    for node in ast.walk(tree(path))
    if isinstance(node, ast.Call)
    and isinstance(node.func, ast.Name)
    and node.func.id == 'print'
  ]
  if path.endswith(os.path.join('runtime', 'cli.py')):
    assert len(calls) == 1, 'cli.fail prints the error line, nothing else'
    return
  assert not calls, f'print at lines {calls}: say it with runtime.console'


def test_the_top_of_the_package_is_the_recipe():
  top = {
    n.removesuffix('.py') for n in os.listdir(PACKAGE) if n.endswith('.py')
  }
  assert top == RECIPE | ENTRIES, (
    'a new module goes in a room, or is named here'
  )


# One helper for each: an error's first line (`errors.first_line`) and
# stderr silenced (`streams.quiet_stderr`); a copy elsewhere drifts.
ONE_HOME = {
  '.splitlines()[0]': 'runtime/errors.py',
  'os.dup2(': 'runtime/streams.py',
}


@pytest.mark.parametrize('text, home', ONE_HOME.items())
def test_one_helper_does_each_job(text, home):
  elsewhere = []
  for path in modules():
    with open(path) as f:
      if text in f.read() and not path.endswith(home):
        elsewhere.append(os.path.relpath(path, PACKAGE))
  assert not elsewhere, f'{text} in {elsewhere}: use the helper in {home}'


# docs/development.md's "Read one run": the core a reader holds, and the
# thin entry above it (issue 40). Weight leaves by lazy loading or deletion.
CORE = (
  'config.py', 'data.py', 'model.py', 'step.py', 'program.py', 'loop.py',
  'workdir/checkpointing.py', 'trainer.py',
)  # fmt: skip
# Issue 52 brought it back under 1,600 (1,473): a resume's reading of the
# checkpoints left `checkpointing` for `resuming`, loaded only for one.
CORE_LINES, ENTRY_LINES = 1600, 120


def test_the_core_a_reader_holds_stays_small():
  def lines(name: str) -> int:
    with open(os.path.join(PACKAGE, name)) as f:
      return sum(1 for _ in f)

  with open(os.path.join(PACKAGE, '..', 'docs', 'development.md')) as f:
    walk = f.read().split('## Read one run', 1)[1].split('\n## ', 1)[0]
  for name in CORE:
    assert f'`xla_mnist/{name}`' in walk, f'"Read one run" skips {name}'
  total = sum(map(lines, CORE))
  assert total <= CORE_LINES, f'the core is {total} lines'
  assert lines('train.py') <= ENTRY_LINES, 'train.py grew'
