"""TensorBoard as the dashboard of compare's runs: HParams, grouped scalars,
the report in the Text tab; read from the event files and in Chromium."""

from __future__ import annotations

import json
import os

import pytest
from support import tensorboard_ui
from support.compare import COMPARE_STEPS
from support.tensorboard_ui import require_chromium
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata
from tensorboard.util import tensor_util

from xla_mnist.workdir import outputs

MODES = ('off', 'on', 'auto', 'fused')


BATCH = 100  # The fashion_mnist config's, as compare runs it.


SCALARS = {
  'train/loss',
  'train/learning_rate',
  'perf/steps_per_second',
  'perf/compile_seconds',
  'perf/run_steps_per_second',
  'eval/test_accuracy',
  'memory/peak_host_mib',
}

pytestmark = pytest.mark.slow


def read_events(run_dir: str) -> event_accumulator.EventAccumulator:
  events = event_accumulator.EventAccumulator(
    run_dir, size_guidance={event_accumulator.TENSORS: 0}
  )
  events.Reload()
  return events


def last_value(events: event_accumulator.EventAccumulator, tag: str) -> float:
  return float(tensor_util.make_ndarray(events.Tensors(tag)[-1].tensor_proto))


@pytest.mark.parametrize('mode', MODES)
def test_events_hold_grouped_scalars_hparams_and_the_report(
  compare_workdir, mode
):
  run_dir = os.path.join(compare_workdir, mode)
  with open(os.path.join(run_dir, 'result.json')) as f:
    result = json.load(f)
  events = read_events(run_dir)
  tags = set(events.Tags()['tensors'])
  assert SCALARS <= tags, tags
  assert result['schema_version'] == outputs.SCHEMA_VERSION
  assert result['config']['jit'] == result['jit']
  assert set(result['versions']) == {
    'tensorflow',
    'keras',
    'tensorflow-datasets',
    'xprof',
  }
  assert last_value(events, 'perf/compile_seconds') == pytest.approx(
    result['compile_seconds'], rel=1e-6
  )
  assert last_value(events, 'memory/peak_host_mib') == pytest.approx(
    result['peak_host_mib'], rel=1e-6
  )
  # The HParams plugin's record of the run: its hyperparameters.
  content = events.SummaryMetadata(
    metadata.SESSION_START_INFO_TAG
  ).plugin_data.content
  start = metadata.parse_session_start_info_plugin_data(content)
  hparams = {
    name: value.WhichOneof('kind') and getattr(value, value.WhichOneof('kind'))
    for name, value in start.hparams.items()
  }
  assert hparams['jit'] == result['jit']
  assert hparams['steps_per_loop'] == result['steps_per_loop']
  assert {'device', 'strategy', 'batch_size', 'learning_rate', 'seed'} <= set(
    hparams
  )
  # The report, as the Text tab shows it.
  (report,) = events.Tensors('report')
  text = tensor_util.make_ndarray(report.tensor_proto).item().decode()
  with open(os.path.join(run_dir, 'report.md')) as f:
    assert text == f.read()


@pytest.fixture(scope='module')
def browser(compare_workdir, tmp_path_factory):
  require_chromium()
  log_path = tmp_path_factory.mktemp('tensorboard') / 'log.txt'
  with tensorboard_ui.browsing(compare_workdir, str(log_path)) as browser:
    yield browser


def test_hparams_tab_lists_a_row_per_jit_mode_with_its_compile_time(
  browser, compare_workdir
):
  rows = browser.hparams_table()
  # compare's profiled runs and its sweep are runs too; its timed runs are
  # those of its own steps and batch size. jit and steps_per_loop differ
  # between them: TensorBoard lists them first, and shows them without the
  # user ticking them.
  timed = [
    r
    for r in rows
    if float(r.get('num_steps', COMPARE_STEPS)) == COMPARE_STEPS
    and float(r.get('batch_size', BATCH)) == BATCH
  ]
  drawn = {(r['jit'], float(r['steps_per_loop'])): r for r in timed}
  assert len(timed) == len(MODES) == len(drawn), rows
  for mode in MODES:
    with open(os.path.join(compare_workdir, mode, 'result.json')) as f:
      result = json.load(f)
    row = drawn[result['jit'], result['steps_per_loop']]
    # The table rounds to five significant digits.
    assert float(row['perf/compile_seconds']) == pytest.approx(
      result['compile_seconds'], rel=1e-3
    )
