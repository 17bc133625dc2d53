"""The package as pip installs it: a wheel in a new venv, run from elsewhere.

The venv reuses this one's installed dependencies (a `.pth` file names its
site-packages), so no network is needed; the package itself comes from the
wheel only.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap

import pytest
from support.cli import REPO

# The venv's own: no PYTHONPATH that could name a checkout.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}


# What only the dev and plot extras install: no shipped module may need them.
EXTRAS_ONLY = ('matplotlib', 'PIL', 'selenium', 'pytest')


NOT_SOURCE = (
  '.venv*',
  '.git',
  'build',
  'logs',
  'data',
  '*.egg-info',
  '.*cache',
)

IMPORT_EVERY_MODULE = """
import importlib, importlib.abc, json, pkgutil, sys

class NotInstalled(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in {blocked!r}:
      raise ImportError(f'{{name}} is not a runtime dependency')

sys.meta_path.insert(0, NotInstalled())
import xla_mnist
modules = pkgutil.walk_packages(xla_mnist.__path__, 'xla_mnist.')
names = [m.name for m in modules]
for name in names:
  importlib.import_module(name)
print(json.dumps({{'file': xla_mnist.__file__, 'modules': names}}))
"""


@pytest.fixture(scope='module')
def venv(tmp_path_factory) -> str:
  """A new venv with the wheel of this checkout installed, not editable."""
  root = tmp_path_factory.mktemp('install')
  wheels, env_dir, source = root / 'wheels', root / 'venv', root / 'source'
  # A copy: setuptools builds in the source tree, and an old build/ there
  # would ship modules the checkout no longer has.
  shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
  subprocess.run(
    [
      sys.executable,
      '-m',
      'pip',
      'wheel',
      '--quiet',
      '--no-deps',
      '--no-build-isolation',
      f'--wheel-dir={wheels}',
      str(source),
    ],
    check=True,
    cwd=root,
    capture_output=True,
  )
  (wheel,) = wheels.glob('xla_mnist-*.whl')
  subprocess.run(
    [sys.executable, '-m', 'venv', '--without-pip', env_dir], check=True
  )
  python = str(env_dir / 'bin' / 'python')
  deps = subprocess.run(
    [python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
    check=True,
    capture_output=True,
    text=True,
  ).stdout.strip()
  with open(os.path.join(deps, 'dependencies.pth'), 'w') as f:
    f.write('\n'.join(site.getsitepackages()) + '\n')
  subprocess.run(
    [
      *(sys.executable, '-m', 'pip', f'--python={python}', 'install'),
      *('--quiet', '--no-deps', str(wheel)),
    ],
    check=True,
    capture_output=True,
  )
  return str(env_dir)


@pytest.mark.slow
def test_every_module_imports_with_the_runtime_dependencies_alone(
  venv, tmp_path
):
  script = IMPORT_EVERY_MODULE.format(blocked=EXTRAS_ONLY)
  proc = subprocess.run(
    [os.path.join(venv, 'bin', 'python'), '-c', textwrap.dedent(script)],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    env=CLEAN_ENV,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  found = json.loads(proc.stdout.splitlines()[-1])
  assert found['file'].startswith(venv)  # The wheel's, not the checkout's.
  assert {'xla_mnist.train', 'xla_mnist.configs.fashion_mnist'} <= set(
    found['modules']
  )


@pytest.mark.slow
@pytest.mark.parametrize('how', ['module', 'console_script'])
def test_installed_package_trains_a_packaged_config_by_name_from_elsewhere(
  how, venv, fashion_data_dir, tmp_path
):
  command = {
    'module': [os.path.join(venv, 'bin', 'python'), '-m', 'xla_mnist.train'],
    'console_script': [os.path.join(venv, 'bin', 'xla-mnist-train')],
  }[how]
  proc = subprocess.run(
    [
      *command,
      '--config=fashion_mnist',
      '--config.num_steps=20',
      f'--data_dir={fashion_data_dir}',
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
    env=CLEAN_ENV,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stderr == ''
  result = tmp_path / 'logs' / 'fashion_mnist-on' / 'result.json'
  assert json.loads(result.read_text())['dataset'] == 'fashion_mnist'


@pytest.mark.slow
def test_installed_compare_script_reads_its_flags(venv, tmp_path):
  proc = subprocess.run(
    [os.path.join(venv, 'bin', 'xla-mnist-compare'), '--jit=on'],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    env=CLEAN_ENV,
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr == 'error: compare runs every jit mode: drop --jit\n'
