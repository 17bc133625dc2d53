"""`report.md`: the run's figures, config, profile and links to its files."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
from support.results import make_result

from xla_mnist.configs import fashion_mnist
from xla_mnist.inspection import breakdown, profiling
from xla_mnist.workdir import outputs, report


def touch(*paths: str) -> None:
  for path in paths:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, 'wb').close()


def links(text: str) -> list[str]:
  return re.findall(r'\]\(([^)]+)\)', text)


@pytest.fixture
def config():
  config = fashion_mnist.get_config()
  config.num_steps = 300
  return config


def test_report_holds_figures_config_profile_and_links(tmp_path, config):
  workdir = str(tmp_path)
  result = make_result(workdir)
  touch(
    result.profile['xplane_path'],
    result.profile['trace_path'],
    os.path.join(workdir, outputs.RESULT_FILE),
    os.path.join(workdir, 'hlo', 'step.hlo.txt'),
    os.path.join(workdir, 'hlo', 'step.optimized_hlo.txt'),
    os.path.join(workdir, 'clusters', 'graphs', 'x.pbtxt'),
  )
  path = report.write_report(result, config)

  assert path == os.path.join(workdir, report.REPORT_FILE)
  assert sorted(os.listdir(workdir)) == sorted(
    [
      'clusters',
      'hlo',
      'plugins',
      'report.md',
      'result.json',
      'trace.json.gz',
    ]
  )  # Written atomically: no temp file left beside it.
  with open(path) as f:
    text = f.read()
  assert 'jit=on, CPU:0' in text
  for figure in (
    '| test accuracy | 0.7230 |',
    '| compile | 1.00 s |',
    '| speed | 1,207 steps/s |',
    '| XLA fusions in the optimized step | 16 |',
    'Traced: 100 steps, 0.228 ms/step = kernels 0.210 + host 0.018, 20.04'
    ' launches, 16 XLA fusions/step.',
    '- MatMul.9 = MatMul: 77.4 µs',
    '| `MatMul.9` | 0.077 |',
    '| `multiply_bitcast_fusion` | 0.034 |',
  ):
    assert figure in text
  for key, value in config.items():
    if key.endswith('_args'):  # A group: its fields set, by their paths.
      continue
    assert f'| `{key}` | `{value!r}` |' in text
  assert '_args' not in text  # Nothing of them set.
  config.optimizer_args.beta_2 = 0.99
  config.optimizer = 'adam'
  text = report.render(result, config)
  assert "| `optimizer` | `'adam'` |" in text
  assert '| `optimizer_args.beta_2` | `0.99` |' in text
  assert text.count('_args.') == 1
  assert links(text) == [
    'plugins/profile/2026_12_02_20_14_42/',
    'result.json',
    'trace.json.gz',
    'hlo/step.hlo.txt',
    'hlo/step.optimized_hlo.txt',
    'clusters/',
  ]
  for link in links(text):
    assert os.path.exists(os.path.join(workdir, link)), link


def test_a_report_of_a_run_fed_by_tf_data_shows_its_input(tmp_path, config):
  result = make_result(str(tmp_path))
  step = breakdown.Breakdown(
    steps=100, step_ms=0.2689, kernel_ms=0.2101, host_ms=0.0176,
    launches_per_step=20.04, temp_bytes=None, written_bytes=None, kernels=[],
    input_ms=0.0412, input_busy_ms=0.1504,
  )  # fmt: skip
  paths = [result.profile[f'{p}_path'] for p in ('xplane', 'trace', 'trace')]
  fed = dataclasses.asdict(profiling.ProfileSummary.of(step, *paths))
  text = report.render(dataclasses.replace(result, profile=fed), config)
  assert '+ host 0.018 + input 0.041 (tf.data busy 0.150 alongside),' in text
  profile = report.render(result, config).split('## Profile')[1]
  assert 'input' not in profile.split('## Files')[0]


def test_report_without_profile_or_dumps_links_only_what_exists(
  tmp_path, config
):
  workdir = str(tmp_path)
  touch(os.path.join(workdir, outputs.RESULT_FILE))
  result = make_result(workdir, profile=None, hlo_fusions=None, jit='off')
  with open(report.write_report(result, config)) as f:
    text = f.read()
  assert 'jit=off' in text
  assert 'XLA fusions' not in text
  assert 'None: `--config.profile_steps=0`' in text
  assert links(text) == ['result.json']


def test_report_reads_a_profile_loaded_from_result_json(tmp_path, config):
  """JSON turns the (op, ms) tuples into lists; the report reads both."""
  workdir = str(tmp_path)
  result = make_result(workdir)
  outputs.write_result(result)
  with open(os.path.join(workdir, outputs.RESULT_FILE)) as f:
    loaded = outputs.Result(**json.load(f))
  assert report.render(loaded, config) == report.render(result, config)


def test_figures_not_measured_say_so(tmp_path, config):
  result = make_result(
    str(tmp_path),
    profile=None,
    compile_seconds=None,
    train_seconds=None,
    paused_seconds=None,
    steps_per_second=None,
  )
  text = report.render(result, config)
  for row in ('compile', 'train', 'checkpoints, logging and profiler', 'speed'):
    assert f'| {row} | not measured |' in text
  assert '| final loss | 0.9692 |' in text
  assert 'trained no step' in text  # Why the profile is missing.
