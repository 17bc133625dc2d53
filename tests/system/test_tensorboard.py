"""A real TensorBoard serves a real run: scalars, graph and profile."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import tensorflow as tf
from support import tensorboard_ui
from support.profiled import BATCH, make, per_step, train
from support.runs import train_here
from support.steps import synthetic_split

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


@pytest.fixture(scope='module')
def model_runs(fashion_data_dir, tmp_path_factory) -> Iterator[str]:
  """A logdir of two short runs, trained here: `cnn` and a user's factory
  (support.models.FACTORIES' `small`), each in the folder of its name."""
  from support.models import FACTORIES, importable

  root = tmp_path_factory.mktemp('models')
  (root / 'user').mkdir()
  (root / 'user' / 'user_models.py').write_text(FACTORIES)
  with pytest.MonkeyPatch.context() as patch:
    importable(patch, root / 'user')
    train_runs(fashion_data_dir, root / 'logs')
    yield str(root / 'logs')


def train_runs(data_dir: str, logs) -> None:
  for run, flags in {
    'cnn': ('--config=cnn', '--config.num_steps=2'),
    'user': (
      '--config=fashion_mnist',
      '--config.model=user_models:small',
      '--config.num_steps=4',
      '--config.steps_per_loop=2',
    ),
  }.items():
    train_here(
      *flags,
      f'--data_dir={data_dir}',
      f'--workdir={logs / run}',
      '--config.batch_size=20',
      '--config.profile_steps=0',
    )


@pytest.mark.slow
def test_tensorboard_shows_each_models_graph_and_name(
  model_runs, tmp_path_factory
):
  """The Graphs tab draws each run's own model's step; the HParams tab names
  the model of each run."""
  log_path = tmp_path_factory.mktemp('tensorboard') / 'log.txt'
  board = tensorboard_ui.TensorBoard(model_runs, str(log_path))
  try:
    board.wait_until_serving()
    info = board.poll(
      '/data/plugin/graphs/info', lambda runs: len(runs) == 2, 60
    )
    assert all(info[run]['run_graph'] for run in ('cnn', 'user')), info
    graphs = {
      run: board.text('/data/plugin/graphs/graph', run=run, conceptual='false')
      for run in ('cnn', 'user')
    }
    ops = {run: set(re.findall(r'op: "(\w+)"', g)) for run, g in graphs.items()}
    # The CNN's step: its convolutions and their gradients; the factory's
    # Sequential of dense layers: matrix products, no convolution.
    assert {'Conv2D', 'Conv2DBackpropFilter', 'AvgPool'} <= ops['cnn']
    assert 'MatMul' in ops['user'] and 'Conv2D' not in ops['user']
    assert 'sequential' in graphs['user'] and 'sequential' not in graphs['cnn']
    groups = board.post(
      '/data/plugin/hparams/session_groups',
      {
        'experimentName': '',
        'allowedStatuses': ['STATUS_UNKNOWN', 'STATUS_SUCCESS'],
        'colParams': [],
        'startIndex': 0,
        'sliceSize': 10,
      },
    )['sessionGroups']
    models = {
      session['name']: group['hparams']['model']
      for group in groups
      for session in group['sessions']
    }
    assert models == {'cnn': 'cnn', 'user': 'user_models:small'}, groups
  finally:
    board.stop()
