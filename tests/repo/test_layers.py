"""The core and the tools: the tools (compare and its explanation, the AOT
export, the benchmarks) sit on the core's public names, and the core never
imports a tool, not even inside a function. A tool that reached into the
core's private names would break with any change to the core; a core that
imported a tool would load it on every run."""

from __future__ import annotations

import ast
import os
import tempfile

import pytest

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


# The tools, by module name; everything else in the package is the core
# (the recipe and the machinery every run uses).
TOOLS = (
  'xla_mnist.compare',
  'xla_mnist.aot',
  'xla_mnist.inspection.comparison',
  'xla_mnist.inspection.why',
  'xla_mnist.inspection.by_field',
  'xla_mnist.inspection.keras_fit',
  'xla_mnist.export',
  'benchmarks',
)


def module_name(path: str) -> str:
  relative = os.path.relpath(path, ROOT).removesuffix('.py')
  return relative.replace(os.sep, '.').removesuffix('.__init__')


def is_tool(name: str) -> bool:
  return any(name == t or name.startswith(f'{t}.') for t in TOOLS)


def sources(*folders: str) -> list[str]:
  return sorted(
    os.path.join(root, name)
    for folder in folders
    for root, _, names in os.walk(os.path.join(ROOT, folder))
    for name in names
    if name.endswith('.py')
  )


def imports(path: str) -> list[tuple[str, list[str], int]]:
  """(module, names imported from it, line) for every import in `path`,
  those inside functions too; relative imports resolved."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  package = module_name(path).rpartition('.')[0]
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(a.name, [], node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = package.split('.')[: len(package.split('.')) - node.level + 1]
        base = '.'.join([*parts, base] if base else parts)
      found.append((base, [a.name for a in node.names], node.lineno))
  return found


CORE = [p for p in sources('xla_mnist') if not is_tool(module_name(p))]


TOOL_FILES = [
  p for p in sources('xla_mnist', 'benchmarks') if is_tool(module_name(p))
]


@pytest.mark.parametrize('path', CORE, ids=module_name)
def test_the_core_imports_no_tool(path):
  wrong = []
  for module, names, line in imports(path):
    targets = [module, *(f'{module}.{n}' for n in names)]
    if any(is_tool(t) for t in targets):
      wrong.append(f'line {line}: {module} {names}')
  assert not wrong, f'{module_name(path)} imports a tool: {wrong}'


def core_modules() -> set[str]:
  return {module_name(p) for p in CORE}


@pytest.mark.parametrize('path', TOOL_FILES, ids=module_name)
def test_a_tool_uses_only_the_cores_public_names(path):
  """No `from core import _name`, and no `core_module._name` through a
  module the tool imported from the core."""
  core = core_modules()
  aliases, wrong = {}, []
  for module, names, line in imports(path):
    if module in core:
      wrong += [f'line {line}: {module}.{n}' for n in names if n[0] == '_']
    for n in names:
      if f'{module}.{n}' in core:
        aliases[n] = f'{module}.{n}'
    if not names and module in core:
      aliases[module.rpartition('.')[2]] = module
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and node.attr.startswith('_')
      and not node.attr.startswith('__')
      and isinstance(node.value, ast.Name)
      and node.value.id in aliases
    ):
      wrong.append(f'line {node.lineno}: {node.value.id}.{node.attr}')
  assert not wrong, f'{module_name(path)} reaches private names: {wrong}'


def test_the_split_covers_what_it_names():
  """Each tool named exists, and the core holds the recipe."""
  names = core_modules() | {module_name(p) for p in TOOL_FILES}
  for tool in TOOLS:
    assert any(n == tool or n.startswith(f'{tool}.') for n in names), tool
  for recipe in ('config', 'data', 'model', 'step', 'program', 'loop'):
    assert f'xla_mnist.{recipe}' in core_modules()
  assert 'xla_mnist.trainer' in core_modules()


# Keras's and TF's internals; TF's protobuf schemas (`*_pb2`) are data.
PRIVATE = ('keras.src', 'tensorflow.python')


def private_imports(path: str) -> list[tuple[str, int]]:
  """(module, line) for each import of a library's private module: Keras's
  `keras.src`, TF's `tensorflow.python`, any `pywrap` or `_`-named one."""
  found = []
  for module, names, line in imports(path):
    targets = [module, *(f'{module}.{n}' for n in names)]
    if any(
      t.startswith(PRIVATE)
      or any(p.startswith('_') or 'pywrap' in p for p in t.split('.')[1:])
      for t in targets
      if not t.startswith(('xla_mnist', '__future__'))
    ):
      found.append((module, line))
  return found


@pytest.mark.parametrize('path', CORE, ids=module_name)
def test_the_core_uses_public_apis_or_says_why_not(path):
  """A private module of TF, Keras or xprof breaks with any release, and
  pins the dependencies; where TF offers no public way, the lines just
  above the import say so ('no public ...')."""
  with open(path) as f:
    lines = f.read().splitlines()
  unexplained = [
    f'line {line}: {module}'
    for module, line in private_imports(path)
    if not any(
      'no public' in text.lower() for text in lines[max(0, line - 4) : line]
    )
  ]
  assert not unexplained, f'{module_name(path)}: {unexplained}'


def test_the_private_import_check_sees_one():
  """The check above finds what it looks for (in a file of its own)."""
  with tempfile.NamedTemporaryFile('w', suffix='.py', delete=False) as f:
    f.write('from keras.src.utils import naming\nimport tensorflow as tf\n')
    f.write('from tensorflow.python.client import pywrap_tf_session\n')
  try:
    assert [m for m, _ in private_imports(f.name)] == [
      'keras.src.utils',
      'tensorflow.python.client',
    ]
  finally:
    os.remove(f.name)
