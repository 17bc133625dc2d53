"""`result.json` as a run writes it: schema 2 records what the figures came
from, and what was not measured is null in strict JSON."""

from __future__ import annotations

import json

import pytest
from support.results import make_result

from xla_mnist.workdir import outputs, recorded


def test_schema_2_round_trips_with_versions_machine_and_memory(tmp_path):
  workdir = str(tmp_path)
  result = make_result(
    workdir,
    profile=None,
    schema_version=outputs.SCHEMA_VERSION,
    peak_host_mib=outputs.peak_host_mib(),
    config={'jit': 'on', 'learning_rate': 0.5},
    versions=outputs.versions(),
    cpu_model=outputs.cpu_model(),
  )
  outputs.write_result(result)
  assert recorded.read_result(workdir) == result
  assert set(result.versions) == set(outputs.VERSIONED)
  assert result.versions['tensorflow'].startswith('2.')
  assert result.peak_host_mib > 10 and result.cpu_model
  assert 'peak memory: host ' in result.summary()


UNMEASURED = ('compile_seconds', 'train_seconds', 'paused_seconds')


def test_figures_not_measured_are_null_in_strict_json_and_say_so(tmp_path):
  workdir = str(tmp_path)
  result = make_result(
    workdir,
    profile=None,
    final_loss=float('nan'),  # As a run that found its steps done had it.
    steps_per_second=None,
    **dict.fromkeys(UNMEASURED),
  )
  path = outputs.write_result(result)
  with open(path) as f:
    text = f.read()
  # Strict JSON: Python's NaN and Infinity extensions are refused.
  stored = json.loads(text, parse_constant=lambda c: pytest.fail(c))
  for name in ('final_loss', 'steps_per_second', *UNMEASURED):
    assert stored[name] is None, name
  summary = recorded.read_result(workdir).summary()
  assert 'compile not measured, train not measured' in summary
  assert '(not measured;' in summary and 'final loss not measured' in summary
  assert '0 steps/s' not in summary and 'nan' not in summary
