"""Profiling and HLO inspection on real steps of the real model."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import socket

import numpy as np
import pytest
import tensorflow as tf
from support.profiled import BATCH, make, per_step, train

from xla_mnist import loop
from xla_mnist.inspection import breakdown, hlo, profiling
from xla_mnist.runtime import cluster_dumps
from xla_mnist.runtime.errors import UserError

# Ops, fusions and rounding come from TF's CPU kernels: `make test` runs these
# with oneDNN on and off.
pytestmark = pytest.mark.kernels


def make_step(jit: str):
  return make(jit)[1]


def trace_events(path: str) -> list[dict]:
  with gzip.open(path) as f:
    return [e for e in json.load(f)['traceEvents'] if e.get('ph') == 'X']


def is_fusion(event: dict) -> bool:
  name = event['name']
  return 'hlo_op' in event.get('args', {}) and (
    'fusion' in name or name.startswith('wrapped_')
  )


@pytest.fixture(scope='module')
def jit_on_run(split, tmp_path_factory):
  """Steps 1-8 of the XLA step, with 3-7 profiled."""
  workdir = str(tmp_path_factory.mktemp('on'))
  net, train_step = make('on')
  profiler = profiling.Profiler(workdir, 3, 7)
  train(train_step, profiler, split, per_step(8))
  args = (split.images[:BATCH], split.labels[:BATCH])
  return workdir, profiler.summarize(), train_step, args, net


def test_capture_and_trace_land_in_the_workdir(jit_on_run):
  workdir, summary, *_ = jit_on_run
  capture = re.escape(os.path.join(workdir, 'plugins', 'profile'))
  host = re.escape(socket.gethostname())
  assert re.fullmatch(
    rf'{capture}/\d{{4}}(_\d\d){{5}}/{host}\.xplane\.pb', summary.xplane_path
  )
  assert os.path.getsize(summary.xplane_path) > 0
  assert summary.trace_path == os.path.join(workdir, 'trace.json.gz')
  events = trace_events(summary.trace_path)
  markers = [e['name'] for e in events if 'step_num' in e.get('args', {})]
  assert markers == [f'train {i}' for i in range(3, 8)]
  assert sum(map(is_fusion, events)) >= 5  # At least one per traced step.


def test_xla_summary_counts_what_the_optimized_hlo_holds(jit_on_run):
  workdir, summary, train_step, args, _ = jit_on_run
  assert summary.steps == 5
  assert summary.mean_step_ms > 0
  assert len(summary.top_ops) == profiling.TOP_OPS
  assert all(ms > 0 for _, ms in summary.top_ops)
  report = hlo.dump(train_step, args, os.path.join(workdir, 'hlo'))
  assert summary.fusions == report.fusions >= 1
  assert f'{summary.fusions} XLA fusions/step' in summary.lines()[0]


def test_the_profile_line_shows_the_input_where_a_pipeline_ran(jit_on_run):
  _, summary, *_ = jit_on_run  # Fed by tf.data, as a strategy's run is.
  assert summary.input_ms is not None and summary.input_busy_ms is not None
  ran = summary.lines()[0]
  assert (
    f' + host {summary.host_ms:.3f} + input {summary.input_ms:.3f} (tf.data'
    f' busy {summary.input_busy_ms:.3f} alongside), ' in ran
  )
  step = breakdown.Breakdown.load(summary.breakdown_path)
  resident = profiling.ProfileSummary.of(
    dataclasses.replace(step, input_ms=None, input_busy_ms=None),
    summary.xplane_path, summary.trace_path, summary.breakdown_path,
  )  # fmt: skip
  head, _, tail = ran.partition(' + input')
  assert resident.lines()[0] == head + tail[tail.index(',') :]  # As before.


def test_plain_tf_function_has_tf_ops_and_no_fusions(split, tmp_path):
  profiler = profiling.Profiler(str(tmp_path), 2, 4)
  train(make_step('off'), profiler, split, per_step(5))
  summary = profiler.summarize()
  assert summary.steps == 3 and summary.mean_step_ms > 0
  assert summary.fusions == 0
  events = trace_events(summary.trace_path)
  assert not any('hlo_op' in e.get('args', {}) for e in events)
  # TF's matmul kernel, by whatever name this CPU's kernel family gives it:
  # MatMul or _FusedMatMul, or with oneDNN _MklMatMul, _MklNativeFusedMatMul.
  # Among all the kernels, not the top few: the input pipeline's may lead.
  with open(summary.breakdown_path) as f:
    kernels = [k['name'] for k in json.load(f)['kernels']]
  assert any('MatMul' in name for name in kernels), kernels


def test_a_call_of_several_steps_counts_each_step(split, tmp_path):
  profiler = profiling.Profiler(str(tmp_path), 5, 8)
  calls = [(1, 3), (4, 6), (7, 9), (10, 12)]
  assert [profiler.covers(*c) for c in calls] == [False, True, True, False]
  train(make_step('on'), profiler, split, calls)
  summary = profiler.summarize()
  assert summary.steps == 6  # The calls 4-6 and 7-9, whole.
  markers = [
    e['name']
    for e in trace_events(summary.trace_path)
    if 'step_num' in e.get('args', {})
  ]
  assert markers == ['train 6', 'train 9']
  single = profiling.Profiler(str(tmp_path / 'single'), 4, 9)
  train(make_step('on'), single, split, per_step(9))
  assert summary.fusions == single.summarize().fusions


def test_training_that_ends_inside_the_window_is_summarized(split, tmp_path):
  profiler = profiling.Profiler(str(tmp_path), 3, 100)
  train(make_step('off'), profiler, split, per_step(5))
  assert profiler.summarize().steps == 3
  tf.profiler.experimental.start(str(tmp_path / 'next'))  # It was stopped.
  tf.profiler.experimental.stop()


def test_empty_window_traces_nothing(split, tmp_path):
  profiler = profiling.Profiler(str(tmp_path), 5, 4)
  assert not profiler.covers(1, 10)
  train(make_step('off'), profiler, split, per_step(6))
  assert profiler.summarize() is None
  assert os.listdir(tmp_path) == []


def assert_one_failure_line(capsys, *fragments: str) -> None:
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 1, lines
  assert lines[0].startswith('profiling failed: ')
  assert lines[0].endswith('; training goes on')
  for fragment in fragments:
    assert fragment in lines[0]


def test_a_running_profiler_session_is_left_alone(split, tmp_path, capsys):
  other = str(tmp_path / 'other')
  tf.profiler.experimental.start(other)
  try:
    profiler = profiling.Profiler(str(tmp_path / 'run'), 2, 3)
    train(make_step('off'), profiler, split, per_step(4))
  finally:
    tf.profiler.experimental.stop()  # Still running: ours did not stop it.
  assert_one_failure_line(capsys, 'Another profiler is running')
  assert profiler.summarize() is None
  assert os.listdir(os.path.join(other, 'plugins', 'profile'))


def test_unwritable_profile_dir_ends_profiling_not_training(
  split, tmp_path, capsys
):
  blocker = tmp_path / 'file'
  blocker.write_text('')
  profiler = profiling.Profiler(str(blocker / 'run'), 1, 2)
  train_step = make_step('off')
  train(train_step, profiler, split, per_step(4))
  assert_one_failure_line(capsys, 'is not a directory')
  assert profiler.summarize() is None
  tf.profiler.experimental.start(str(tmp_path / 'next'))  # It was stopped.
  tf.profiler.experimental.stop()


def test_training_error_goes_up_and_stops_the_profiler(split, tmp_path):
  profiler = profiling.Profiler(str(tmp_path), 1, 10)
  with pytest.raises(ZeroDivisionError):
    train(make_step('off'), profiler, split, per_step(1))
    with profiler.around(2, 2, loop.Clock().paused):
      raise ZeroDivisionError
  assert profiler.summarize().steps == 1  # What ran before is kept.
  assert not profiler.covers(3, 3)
  tf.profiler.experimental.start(str(tmp_path / 'next'))
  tf.profiler.experimental.stop()


def test_hlo_dump_writes_each_stage_and_leaves_the_step_alone(jit_on_run):
  workdir, _, train_step, args, net = jit_on_run
  traces = train_step.experimental_get_tracing_count()
  weights = [v.numpy() for v in net.trainable_variables]
  outdir = os.path.join(workdir, 'hlo_again')
  report = hlo.dump(train_step, args, outdir)
  names = [os.path.basename(p) for p in report.files]
  assert names == list(hlo.STAGES.values())
  texts = {}
  for path in report.files:
    with open(path) as f:
      texts[os.path.basename(path)] = f.read()
  assert 'ENTRY' in texts['step.hlo.txt']
  assert 'fusion(' in texts['step.optimized_hlo.txt']
  assert texts['step.optimized_hlo.dot'].lstrip().startswith('digraph')
  assert report.fusions >= 1
  assert sorted(os.listdir(outdir)) == sorted(names)  # No temp files left.
  assert train_step.experimental_get_tracing_count() == traces
  for before, after in zip(weights, net.trainable_variables, strict=True):
    np.testing.assert_array_equal(before, after)


def test_hlo_dump_of_a_plain_function_says_to_use_jit_on(split, tmp_path):
  args = (split.images[:BATCH], split.labels[:BATCH])
  with pytest.raises(UserError, match='config.jit=on'):
    hlo.dump(make_step('off'), args, str(tmp_path))


SMALL_MODULE = """\
HloModule m, is_scheduled=true

%inner (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %e = f32[4]{0} exponential(%p)
}

%fused (param_0: f32[4]) -> f32[4] {
  %param_0 = f32[4]{0} parameter(0)
  ROOT %nested = f32[4]{0} fusion(%param_0), kind=kLoop, calls=%inner
}

%wlog (param_0.1: f32[4]) -> f32[4] {
  %param_0.1 = f32[4]{0} parameter(0)
  ROOT %log = f32[4]{0} log(%param_0.1)
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %x = f32[4]{0} get-tuple-element(%t), index=1
  %i = s32[] get-tuple-element(%t), index=0
  %wrapped_log = f32[4]{0} fusion(%x), kind=kLoop, calls=%wlog
  ROOT %r = (s32[], f32[4]{0}) tuple(%i, %wrapped_log)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %no_fusion = f32[4]{0} add(%a, %a)
  %exp_fusion = f32[4]{0} fusion(%no_fusion), kind=kLoop, calls=%fused
  ROOT %add_fusion.1 = f32[4]{0} fusion(%exp_fusion), kind=kLoop, calls=%fused
}
"""


def test_count_fusions_skips_nested_ones_and_counts_loop_bodies():
  # Entry: exp_fusion, add_fusion.1; loop body: wrapped_log; not `nested`.
  assert hlo.count_fusions(SMALL_MODULE) == 3
  assert hlo.count_fusions('') == 0


def test_requested_cluster_dumps_keep_flags_and_replaces_old_dumps_once_trained(
  tmp_path, monkeypatch
):
  monkeypatch.setenv('TF_XLA_FLAGS', '--tf_xla_auto_jit=2')
  # Set, then deleted: so that monkeypatch restores them after the test
  # (a delenv of an unset variable records nothing, and the dump flags
  # leaked into later runs, which then skipped the XLA cache).
  for name in ('XLA_FLAGS', 'TF_DUMP_GRAPH_PREFIX'):
    monkeypatch.setenv(name, '')
    monkeypatch.delenv(name)
  stale = tmp_path / cluster_dumps.GRAPH_DIR / 'mark_for_compilation.pbtxt'
  stale.parent.mkdir()
  stale.write_text('')
  monkeypatch.setattr(cluster_dumps, '_DUMPS', None)
  cluster_dumps.request(str(tmp_path))
  assert os.environ['TF_XLA_FLAGS'] == (
    '--tf_xla_auto_jit=2 --tf_xla_clustering_debug'
  )
  # This process's dumps go to a folder of its own until it has trained.
  staging = tmp_path / f'.dumping-{os.getpid()}'
  assert os.environ['TF_DUMP_GRAPH_PREFIX'] == str(
    staging / cluster_dumps.GRAPH_DIR
  )
  xla_dir = staging / cluster_dumps.XLA_DIR
  assert os.environ['XLA_FLAGS'] == (
    f'--xla_dump_to={xla_dir} --xla_dump_hlo_as_text'
  )
  assert stale.exists()  # Kept until the run has trained.
  (staging / cluster_dumps.GRAPH_DIR).mkdir(parents=True)
  (staging / cluster_dumps.GRAPH_DIR / 'new.pbtxt').write_text('')
  cluster_dumps.publish()
  assert not stale.exists() and not staging.exists()
  assert (tmp_path / cluster_dumps.GRAPH_DIR / 'new.pbtxt').exists()
