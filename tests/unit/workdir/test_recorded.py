"""`result.json` read back: an older schema's file still reads, and says
what it lacks; one without the figures counts as unfinished."""

from __future__ import annotations

import dataclasses
import json
import os

from support.results import make_result

from xla_mnist.workdir import outputs, recorded

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
  result = recorded.read_result(workdir)
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
  assert recorded.read_result(workdir) is None
  out = capsys.readouterr().out
  assert 'is unreadable' in out and 'lacks jit, device' in out
  assert recorded.read_result(str(tmp_path / 'none')) is None  # No file: quiet.
  assert capsys.readouterr().out == ''


def test_an_older_files_nan_reads_as_not_measured(tmp_path):
  workdir = str(tmp_path)
  old = dataclasses.asdict(make_result(workdir, profile=None))
  old.update(final_loss=float('nan'))
  write_json(workdir, old)  # Python's json writes NaN, as this project did.
  result = recorded.read_result(workdir)
  assert result.final_loss is None
  assert result.test_accuracy == old['test_accuracy']
