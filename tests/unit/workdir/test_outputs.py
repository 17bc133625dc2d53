"""`result.json` across versions: schema 2 records what the figures came from;
an older file still reads, and says what it lacks."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from support.results import make_result

from xla_mnist.workdir import outputs

NEW_FIELDS = {
  'schema_version',
  'peak_host_mib',
  'device_peak_mib',
  'config',
  'versions',
  'cpu_model',
}


def write_json(workdir: str, stored: dict) -> None:
  with open(os.path.join(workdir, outputs.RESULT_FILE), 'w') as f:
    json.dump(stored, f)


def test_a_schema_1_file_reads_with_defaults_and_names_what_it_lacks(
  tmp_path, capsys
):
  workdir = str(tmp_path)
  old = dataclasses.asdict(make_result(workdir, profile=None))
  write_json(workdir, {k: v for k, v in old.items() if k not in NEW_FIELDS})
  result = outputs.read_result(workdir)
  assert result.test_accuracy == old['test_accuracy']
  assert result.schema_version == 1 and result.peak_host_mib is None
  assert result.versions == {} and result.config == {}
  [note] = capsys.readouterr().out.splitlines()
  assert note.startswith(
    f'note: {workdir}/result.json is schema 1 (now {outputs.SCHEMA_VERSION})'
  )
  for name in NEW_FIELDS - {'schema_version'}:
    assert name in note


def test_a_file_without_the_figures_is_unreadable_and_says_why(
  tmp_path, capsys
):
  workdir = str(tmp_path)
  write_json(workdir, {'dataset': 'mnist'})
  assert outputs.read_result(workdir) is None
  out = capsys.readouterr().out
  assert 'is unreadable' in out and 'lacks jit, device' in out
  assert outputs.read_result(str(tmp_path / 'none')) is None  # No file: quiet.
  assert capsys.readouterr().out == ''


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
  assert outputs.read_result(workdir) == result
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
  summary = outputs.read_result(workdir).summary()
  assert 'compile not measured, train not measured' in summary
  assert '(not measured;' in summary and 'final loss not measured' in summary
  assert '0 steps/s' not in summary and 'nan' not in summary


def test_an_older_files_nan_reads_as_not_measured(tmp_path):
  workdir = str(tmp_path)
  old = dataclasses.asdict(make_result(workdir, profile=None))
  old.update(final_loss=float('nan'))
  with open(os.path.join(workdir, outputs.RESULT_FILE), 'w') as f:
    json.dump(old, f)  # Python's json writes NaN, as this project did.
  result = outputs.read_result(workdir)
  assert result.final_loss is None
  assert result.test_accuracy == old['test_accuracy']
