"""A real TensorBoard serves a real run: scalars, graph and profile."""

from __future__ import annotations

import pytest
import tensorflow as tf
from conftest import synthetic_split
from support import tensorboard_ui
from test_profiling import BATCH, make, per_step, train

from xla_mnist.inspection import profiling


@pytest.fixture(scope='module')
def workdir(tmp_path_factory) -> str:
  """A short run of the XLA step: loss scalars, its graph, steps 3-6 traced."""
  workdir = str(tmp_path_factory.mktemp('run'))
  split = synthetic_split()
  _, train_step = make('on')
  profiler = profiling.Profiler(workdir, 3, 6)
  losses = train(train_step, profiler, split, per_step(8))
  assert profiler.summarize() is not None
  writer = tf.summary.create_file_writer(workdir)
  with writer.as_default(step=0):
    args = (split.images[:BATCH], split.labels[:BATCH])
    tf.summary.graph(train_step.get_concrete_function(*args).graph)
    for i, loss in enumerate(losses, start=1):
      tf.summary.scalar('loss', loss, step=i)
  writer.close()
  return workdir


@pytest.fixture(scope='module')
def tensorboard(workdir, tmp_path_factory):
  log_path = tmp_path_factory.mktemp('tensorboard') / 'log.txt'
  board = tensorboard_ui.TensorBoard(workdir, str(log_path))
  try:
    board.wait_until_serving()
    yield board
  finally:
    board.stop()


@pytest.mark.slow
def test_tensorboard_serves_scalars_graph_and_profile(tensorboard):
  tags = tensorboard.poll('/data/plugin/scalars/tags', bool, 30)
  (run,) = [r for r, run_tags in tags.items() if 'loss' in run_tags]
  series = tensorboard.get('/data/plugin/scalars/scalars', run=run, tag='loss')
  assert [point[1] for point in series] == list(range(1, 9))
  graphs = tensorboard.get('/data/plugin/graphs/info')
  assert graphs[run]['run_graph'], graphs

  runs = tensorboard.poll('/data/plugin/profile/runs', bool, 30)
  assert len(runs) == 1, runs  # The capture's <time> folder.
  capture = runs[0]
  tools = tensorboard.get('/data/plugin/profile/run_tools', run=capture)
  # `trace_viewer@` is the streaming trace viewer, the one the UI opens.
  assert {'trace_viewer@', 'overview_page', 'op_profile'} <= set(tools), tools
  hosts = tensorboard.get(
    '/data/plugin/profile/hosts', run=capture, tag='op_profile'
  )
  query = {'run': capture, 'host': hosts[0]['hostname']}
  trace = tensorboard.get(
    '/data/plugin/profile/data', tag='trace_viewer@', **query
  )
  names = {e.get('name', '') for e in trace['traceEvents']}
  assert {f'train {i}' for i in range(3, 7)} <= names
  assert any(name.endswith('_fusion') for name in names)
  overview = tensorboard.get(
    '/data/plugin/profile/data', tag='overview_page', **query
  )
  step_ms = [
    t['p']['steptime_ms_average']
    for t in overview
    if 'steptime_ms_average' in t.get('p', {})
  ]
  assert float(step_ms[0]) > 0
  # Answers, though XLA's per-op tables stay empty for CPU-only runs.
  op_profile = tensorboard.get(
    '/data/plugin/profile/data', tag='op_profile', **query
  )
  assert op_profile['deviceType'] == 'CPU_ONLY'
