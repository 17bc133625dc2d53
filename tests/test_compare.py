"""`python -m xla_mnist.compare`: four runs, one table, a chart."""

import json
import pathlib

import pytest
from conftest import COMPARE_STEPS, run_compare

from xla_mnist import compare


@pytest.mark.slow
def test_compare_writes_a_row_per_mode(compare_workdir):
  workdir = pathlib.Path(compare_workdir)
  results = json.loads((workdir / 'compare.json').read_text())['results']
  assert list(results) == ['off', 'on', 'auto', 'fused']
  assert [r['jit'] for r in results.values()] == ['off', 'on', 'auto', 'on']
  steps = [r['steps_per_loop'] for r in results.values()]
  assert steps == [1, 1, 1, COMPARE_STEPS]
  rows = (workdir / 'compare.md').read_text().splitlines()[4:]
  assert [row.split(' | ')[0] for row in rows] == [f'| {m}' for m in results]
  assert (workdir / 'compare.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  for mode in results:
    assert (workdir / mode / 'result.json').is_file()


def test_a_failing_run_ends_compare_with_its_error(tmp_path):
  proc = run_compare('--config.batch_size=0', f'--workdir={tmp_path}')
  assert proc.returncode == 2
  [line] = proc.stderr.strip().splitlines()  # One line, no traceback.
  assert line.startswith('error: the off run failed (exit 2): error: ')
  assert '--config.batch_size' in line


def test_compare_refuses_jit(tmp_path):
  proc = run_compare('--jit=on', f'--workdir={tmp_path}')
  assert proc.returncode == 2
  assert proc.stderr.strip().endswith(
    'error: compare runs every jit mode: drop --jit'
  )


def test_default_workdir_is_named_after_the_config():
  assert compare.config_name(['--config=fashion_mnist']) == ('fashion_mnist')
  assert compare.config_name(['--config', 'a/b.py', '--config.seed=2']) == 'b'
  assert compare.config_name([]) == 'default'
