"""The notebook runs top to bottom, offline, in a real Jupyter kernel."""

from __future__ import annotations

import glob
import json
import os
import signal
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from support.cli import REPO

NOTEBOOK = os.path.join(REPO, 'notebooks', 'xla_mnist.ipynb')


STEPS = 200  # Enough for the fused loop's two calls and a profile.


def with_parameters(notebook, **values) -> None:
  """Papermill's convention: a cell after the `parameters` cell sets them."""
  (index,) = [
    i
    for i, cell in enumerate(notebook.cells)
    if 'parameters' in cell.metadata.get('tags', [])
  ]
  source = '\n'.join(f'{name} = {value!r}' for name, value in values.items())
  notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(source))


def stop_tensorboards(tmpdir: str) -> None:
  """Ends the TensorBoards `%tensorboard` launched, by the pids they record."""
  for path in glob.glob(os.path.join(tmpdir, '.tensorboard-info', '*.info')):
    with open(path) as f:
      pid = json.load(f)['pid']
    try:
      os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
      pass


def outputs_text(cell) -> str:
  texts = []
  for output in cell.get('outputs', []):
    texts.append(output.get('text', ''))
    for value in output.get('data', {}).values():
      texts.append(value if isinstance(value, str) else json.dumps(value))
  return '\n'.join(texts)


@pytest.mark.slow
def test_the_notebook_trains_compares_and_shows_tensorboard_and_hlo(
  fashion_data_dir, tmp_path, monkeypatch
):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  with_parameters(notebook, num_steps=STEPS, data_dir=fashion_data_dir)
  # The kernel inherits these: this checkout's code, the venv's
  # `tensorboard` for %tensorboard, and a TMPDIR where TensorBoard records
  # what it launched.
  tmpdir = str(tmp_path / 'tmp')
  os.makedirs(tmpdir)
  monkeypatch.setenv('TMPDIR', tmpdir)
  monkeypatch.setenv(
    'PATH', os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH']
  )
  monkeypatch.setenv(
    'PYTHONPATH',
    os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')])),
  )
  workdir = tmp_path / 'nb'
  workdir.mkdir()
  client = NotebookClient(
    notebook,
    timeout=600,
    kernel_name='python3',
    resources={'metadata': {'path': str(workdir)}},
  )
  try:
    client.execute()
  finally:
    stop_tensorboards(tmpdir)
  code = [cell for cell in notebook.cells if cell.cell_type == 'code']
  texts = [outputs_text(cell) for cell in code]
  assert f'{STEPS} steps of 100' in texts[2]  # The fused run's summary.
  table = texts[3]
  for mode in ('off', 'on', 'fused'):
    assert f'| {mode} |' in table, table
  assert 'Launching TensorBoard' not in texts[4] or 'iframe' in texts[4], texts[
    4
  ]
  assert 'ERROR' not in texts[4], texts[4]
  assert 'fusions execute per step' in texts[5], texts[5]
  # A model defined in the notebook, a function: trained, named, and its
  # softmax output trained as fit trains it.
  assert '__main__:small_mlp probabilities float32' in texts[6], texts[6]
  assert 'test accuracy 0.' in texts[6], texts[6]
  for run in ('fused', 'off', 'on', 'mine'):
    assert (workdir / 'logs' / 'notebook' / run / 'result.json').is_file()
