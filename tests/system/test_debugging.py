"""Looking inside a run from outside: TF's profiler server, captured over
gRPC while the run trains, XLA's own dumps (XLA_FLAGS) on a warm cache, and
auto-clustering's dumps."""

from __future__ import annotations

import glob
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from support.cli import REPO, run_train, start_train
from support.tensorboard_ui import free_port

from xla_mnist.inspection import hlo

AUTO_SCRIPT = """
import json, os, sys
from xla_mnist.runtime import cluster_dumps, env
from xla_mnist.inspection import hlo
outdir = sys.argv[1]
env.autocluster()
cluster_dumps.request(outdir)
import numpy as np, tensorflow as tf
from xla_mnist import data, model, step
from xla_mnist.runtime import process
process.configure_jit('auto')
def train_step(net, optimizer, jit, batch):
  update = step.make_update(net, optimizer, batch)
  return tf.function(update, jit_compile=step.jit_compile(jit))
net = model.create_model(image_shape=(28, 28, 1), num_classes=10)
optimizer = tf.keras.optimizers.SGD(0.5)
optimizer.build(net.trainable_variables)
train_step = train_step(net, optimizer, 'auto', 32)
images = tf.constant(np.zeros((32, 28, 28, 1), np.uint8))
labels = tf.constant(np.zeros(32, np.int64))
for _ in range(3):
  train_step(images, labels).numpy()
cluster_dumps.publish()
report = hlo.summarize_clusters(outdir)
print(json.dumps([(c.name, c.op_types, c.hlo_files, c.fusions)
                  for c in report.clusters]))
print('\\n'.join(report.lines()))
"""


# Its fusions come from TF's CPU kernels: `make test` runs it with oneDNN on
# and off.
@pytest.mark.slow
@pytest.mark.kernels
def test_auto_clustering_dumps_name_each_cluster_and_its_hlo(tmp_path):
  outdir = str(tmp_path / 'clusters')
  proc = subprocess.run(
    [sys.executable, '-c', textwrap.dedent(AUTO_SCRIPT), outdir],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  clusters = json.loads(proc.stdout.splitlines()[0])
  step_clusters = [c for c in clusters if 'MatMul' in c[1]]
  assert len(step_clusters) == 1, clusters
  name, op_types, files, fusions = step_clusters[0]
  assert op_types['AssignSubVariableOp'] == 2  # Both SGD updates in XLA.
  assert [os.path.basename(f).split('.')[-2] for f in files] == [
    'before_optimizations',
    'cpu_after_optimizations',
  ]
  assert all(os.path.getsize(f) > 0 for f in files)
  assert fusions >= 1
  assert f'  {name}: ' in proc.stdout
  assert hlo.summarize_clusters(str(tmp_path / 'nothing')) is None


FIRST_LINE_SECONDS = 240


def start_with_lines(*args: str) -> tuple[subprocess.Popen, queue.Queue]:
  """A training process and a queue of its stdout lines, read as they come."""
  proc = start_train(*args)
  lines: queue.Queue = queue.Queue()

  def pump() -> None:
    for line in proc.stdout:
      lines.put(line)

  threading.Thread(target=pump, daemon=True).start()
  return proc, lines


def wait_for_line(lines: queue.Queue, prefix: str, seconds: float) -> str:
  deadline = time.monotonic() + seconds
  seen = []
  while time.monotonic() < deadline:
    try:
      line = lines.get(timeout=1)
    except queue.Empty:
      continue
    seen.append(line)
    if line.startswith(prefix):
      return line
  raise TimeoutError(f'no line starting {prefix!r} in {seconds} s: {seen}')


@pytest.mark.slow
def test_the_profiler_server_captures_the_fused_loop_while_it_trains(
  fashion_data_dir, tmp_path
):
  import tensorflow as tf
  from xprof.convert import raw_to_tool_data

  port = free_port()
  proc, lines = start_with_lines(
    '--config=fashion_mnist',
    f'--data_dir={fashion_data_dir}',
    f'--workdir={tmp_path / "run"}',
    '--config.num_steps=100000000',  # Trains until stopped.
    '--config.log_every=10000',
    '--config.checkpoint_every=0',
    '--config.profile_steps=0',
    f'--profiler_port={port}',
  )
  try:
    assert f'port {port}' in wait_for_line(lines, 'profiler server', 60)
    wait_for_line(lines, 'step ', FIRST_LINE_SECONDS)  # Compiled, training.
    logdir = str(tmp_path / 'capture')
    tf.profiler.experimental.client.trace(
      f'grpc://localhost:{port}', logdir, 500
    )
  finally:
    proc.send_signal(signal.SIGTERM)  # Saves a checkpoint, exits 143.
    _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
  (xplane,) = glob.glob(f'{logdir}/plugins/profile/*/*.xplane.pb')
  trace, _ = raw_to_tool_data.xspace_to_tool_data([xplane], 'trace_viewer', {})
  names = {e.get('name', '') for e in json.loads(trace)['traceEvents']}
  # XLA's fused ops, inside the calls the run marked as steps.
  assert any(name.endswith('fusion') for name in names), sorted(names)[:50]
  assert any(name.startswith('train ') for name in names)


@pytest.mark.slow  # Found once TF has started.
def test_a_taken_profiler_port_is_a_one_line_run_time_error():
  with socket.socket(socket.AF_INET6) as taken:
    taken.bind(('', 0))
    taken.listen()
    port = taken.getsockname()[1]
    proc = run_train(f'--profiler_port={port}', '--config.num_steps=1')
  assert proc.returncode == 1, proc.stderr  # Like a workdir another run holds.
  [line] = proc.stderr.splitlines()
  assert line.startswith(f'error: --profiler_port={port}: cannot listen')
  assert 'another --profiler_port=PORT' in line


@pytest.mark.slow
def test_xla_dumps_are_written_on_a_warm_cache(fashion_data_dir, tmp_path):
  args = (
    '--config=fashion_mnist',
    f'--data_dir={fashion_data_dir}',
    '--config.num_steps=100',
    '--config.profile_steps=0',
  )
  warm = run_train(*args, f'--workdir={tmp_path / "warm"}')
  assert warm.returncode == 0, warm.stderr[-2000:]
  assert 'XLA cache' in warm.stdout  # The program is in the cache now.
  dump_dir = tmp_path / 'dump'
  proc = run_train(
    *args,
    f'--workdir={tmp_path / "run"}',
    XLA_FLAGS=f'--xla_dump_to={dump_dir}',
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'the XLA cache is skipped' in proc.stdout
  dumped = os.listdir(dump_dir)
  # The fused loop's module, before and after XLA's passes.
  assert any('train_loop' in name for name in dumped), dumped
  assert any('after_optimizations' in name for name in dumped), dumped
