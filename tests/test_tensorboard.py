"""A real TensorBoard serves a real run: scalars, graph and profile."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import tensorflow as tf
from test_profiling import BATCH, make, per_step, synthetic_split, train

from xla_mnist import profiling

STARTUP_SECONDS = 90


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


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class TensorBoard:
  """A TensorBoard process and its HTTP API."""

  def __init__(self, logdir: str, log_path: str):
    self.log_path = log_path
    port = free_port()
    self.base = f'http://127.0.0.1:{port}'
    with open(log_path, 'wb') as log:
      self.process = subprocess.Popen(
        [
          sys.executable,
          '-m',
          'tensorboard.main',
          '--logdir',
          logdir,
          '--host',
          '127.0.0.1',
          '--port',
          str(port),
          '--reload_interval',
          '1',
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
      )

  def stop(self) -> None:
    self.process.terminate()
    try:
      self.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()

  def get(self, path: str, **query: str):
    url = f'{self.base}{path}?{urllib.parse.urlencode(query)}'
    with urllib.request.urlopen(url, timeout=30) as response:
      body = response.read()
      if response.headers.get('Content-Encoding') == 'gzip':
        body = gzip.decompress(body)  # The profile plugin always gzips.
    return json.loads(body)

  def poll(self, path: str, ready, seconds: float, **query: str):
    """GETs `path` until `ready(answer)`: TensorBoard loads logs lazily."""
    deadline = time.monotonic() + seconds
    while self.process.poll() is None and time.monotonic() < deadline:
      try:
        answer = self.get(path, **query)
        if ready(answer):
          return answer
      except (urllib.error.URLError, ConnectionError):
        pass  # Not listening yet.
      time.sleep(0.5)
    with open(self.log_path, errors='replace') as log:
      tail = log.read()[-3000:]
    pytest.fail(f'TensorBoard gave no answer to {path} in {seconds} s:\n{tail}')


@pytest.fixture(scope='module')
def tensorboard(workdir, tmp_path_factory):
  log_path = tmp_path_factory.mktemp('tensorboard') / 'log.txt'
  board = TensorBoard(workdir, str(log_path))
  try:
    board.poll('/data/plugins_listing', bool, STARTUP_SECONDS)
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
