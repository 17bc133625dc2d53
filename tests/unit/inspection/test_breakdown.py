"""The step breakdown, read from real captures of every jit mode made by
the command (hence `slow`), and its errors.

Every mode's capture is one of the shared compare run's profiled runs
(conftest's `compare_workdir`), whose figures test_compare checks as compare
reports them; here `from_capture` reads each capture itself. The HLO that
each XLA kernel is checked against needs runs of its own (`--dump_hlo`)."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
from support.cli import run_train
from support.compare import COMPARE_LOOP
from support.idx import make_idx_folder
from support.xplane import chrome_trace, event, tf_kernels_in_xplane

from xla_mnist.inspection import breakdown
from xla_mnist.runtime import layout
from xla_mnist.runtime.errors import DataError

MODES = ('off', 'on', 'auto', 'fused')
PROFILED = 2 * COMPARE_LOOP  # compare's profiled window: two fused calls.
DUMPED = {  # The XLA modes as compare runs them, their step's HLO dumped.
  'on': ('--jit=on', '--config.steps_per_loop=1', '--dump_hlo'),
  'fused': (
    '--jit=on',
    f'--config.steps_per_loop={COMPARE_LOOP}',
    '--dump_hlo',
  ),
}


def capture(workdir: str) -> str:
  """The capture a run wrote, as its result.json names it."""
  with open(os.path.join(workdir, layout.RESULT_FILE)) as f:
    return json.load(f)['profile']['xplane_path']


def read(workdir: str, mode: str) -> breakdown.Breakdown:
  per_call = COMPARE_LOOP if mode == 'fused' else 1
  return breakdown.from_capture(capture(workdir), per_call)


def profiled(compare_workdir: str, mode: str) -> str:
  """The workdir of compare's profiled `mode` run."""
  return os.path.join(compare_workdir, 'profiled', mode)


@pytest.fixture(scope='module')
def dumped(tmp_path_factory) -> dict[str, str]:
  """One CLI run per XLA mode that dumps its HLO and profiles its last
  steps, as compare profiles them; mode -> workdir."""
  root = tmp_path_factory.mktemp('breakdown')
  idx = str(root / 'idx')
  make_idx_folder(idx, train=300)
  workdirs = {}
  for mode, flags in DUMPED.items():
    workdir = str(root / mode)
    proc = run_train(
      '--config=fashion_mnist',
      f'--config.idx_dir={idx}',
      f'--data_dir={root / "tfds"}',  # Not the checkout's ./data.
      f'--config.num_steps={COMPARE_LOOP + PROFILED}',
      f'--config.profile_steps={PROFILED}',
      '--xla_cache_dir=',
      f'--workdir={workdir}',
      *flags,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    workdirs[mode] = workdir
  return workdirs


@pytest.mark.slow
@pytest.mark.parametrize('mode', MODES)
def test_parts_add_up_to_the_step(compare_workdir, mode):
  b = read(profiled(compare_workdir, mode), mode)
  assert b.steps == PROFILED
  assert b.kernels and b.launches_per_step > 0
  assert b.kernel_ms > 0 and b.host_ms > 0
  # The recipe's CPU threads are one: kernels do not overlap, so kernel
  # self times and the kernel-free time are two measures of one timeline.
  assert abs(b.kernel_ms + b.host_ms - b.step_ms) <= 0.15 * b.step_ms
  assert sum(k.ms_per_step for k in b.kernels) == pytest.approx(b.kernel_ms)


@pytest.mark.slow
@pytest.mark.parametrize('mode', DUMPED)
def test_xla_kernels_name_the_tf_ops_they_came_from(dumped, mode):
  b = read(dumped[mode], mode)
  assert b.steps == PROFILED
  assert all(k.kind == 'xla' for k in b.kernels)
  unnamed = [k.name for k in b.kernels if not k.ops]
  assert not unnamed
  hlo_path = os.path.join(dumped[mode], 'hlo', 'step.optimized_hlo.txt')
  with open(hlo_path) as f:
    in_hlo = set(re.findall(r'op_name="([^"]+)"', f.read())) - {'XLA_Args'}
  named = {op for k in b.kernels for op in k.ops}
  assert in_hlo and in_hlo <= named
  assert b.temp_bytes > 0 and b.written_bytes > 0


@pytest.mark.slow
def test_off_launches_are_the_tf_kernels_the_trace_shows(compare_workdir):
  workdir = profiled(compare_workdir, 'off')
  b = read(workdir, 'off')
  assert all(k.kind == 'tf' for k in b.kernels)
  assert b.launches_per_step == pytest.approx(
    tf_kernels_in_xplane(capture(workdir)) / PROFILED
  )
  assert b.temp_bytes == 0


@pytest.mark.slow
def test_auto_has_xla_and_tf_kernels_or_xla_only(compare_workdir):
  b = read(profiled(compare_workdir, 'auto'), 'auto')
  assert any(k.kind == 'xla' for k in b.kernels)
  assert all(k.ops for k in b.kernels if k.kind == 'xla')


def test_a_file_that_is_no_capture_is_a_data_error(tmp_path):
  path = tmp_path / 'x.xplane.pb'
  path.write_bytes(b'\xff\xfe not a protobuf')
  with pytest.raises(DataError, match='no profiler capture'):
    breakdown.from_capture(str(path), 1)


STEPPING, POOL, ITERATOR = (
  'train.py',
  'tf_data_private_threadpool/1',
  'tf_data_iterator_resource/2',
)


def marker(step: int, start: float, end: float) -> dict:
  return event(
    f'train {step}', start, end, step_num=str(step), group_id=str(step)
  )


def thunk(name: str, start: float, end: float, step: int = 1) -> dict:
  """An XLA thunk of the step's program (no HLO in the capture)."""
  args = {'hlo_op': name, 'hlo_module': 'm', 'group_id': str(step)}
  return event(name, start, end, **args)


def get_next(start: float, end: float, step: int = 1) -> list[dict]:
  """The stepping thread's wait for a batch, as TF 2.21 traces it."""
  group = {'group_id': str(step)}
  return [
    event('EagerLocalExecute: IteratorGetNext', start, end, **group),
    event('IteratorGetNextOp::DoCompute', start + 1, end - 1, **group),
    event(
      'Iterator::Prefetch',
      start + 2,
      end - 2,
      long_name='Iterator::Root::Prefetch',
      **group,
    ),
  ]


def from_trace(tmp_path, threads: dict[str, list[dict]], steps=1):
  """`from_capture` of a trace built by hand; the capture holds no HLO."""
  empty = tmp_path / 'host.xplane.pb'
  empty.write_bytes(b'')  # An XSpace without planes.
  return breakdown.from_capture(str(empty), steps, None, chrome_trace(threads))


def test_tf_datas_events_are_never_kernels(tmp_path):
  b = from_trace(
    tmp_path,
    {
      STEPPING: [marker(1, 0, 100), *get_next(0, 30), thunk('fusion', 40, 90)],
      POOL: [event('PyFunc', 10, 90, long_name='PyFunc:PyFunc')],
      ITERATOR: [
        event(
          'Iterator::ParallelMapV2',
          5,
          95,
          long_name='Iterator::Root::Prefetch::ParallelMapV2',
        ),
        event('IteratorGetNext', 50, 60, long_name='it:IteratorGetNext'),
      ],
    },
  )
  assert [k.name for k in b.kernels] == ['fusion']
  assert b.launches_per_step == 1
  assert b.kernel_ms == pytest.approx(0.05)


def test_the_wait_for_input_comes_out_of_host_time(tmp_path):
  b = from_trace(
    tmp_path,
    {STEPPING: [marker(1, 0, 100), *get_next(10, 40), thunk('fusion', 50, 70)]},
  )
  assert b.input_ms == pytest.approx(0.03)
  assert b.kernel_ms == pytest.approx(0.02)
  assert b.host_ms == pytest.approx(0.05)  # Neither kernels nor the wait.
  assert b.kernel_ms + b.host_ms + b.input_ms == pytest.approx(b.step_ms)
  assert b.input_busy_ms == 0  # A pipeline ran, outside these threads.


def test_pipeline_busy_is_its_threads_union_within_the_steps(tmp_path):
  b = from_trace(
    tmp_path,
    {
      STEPPING: [marker(1, 0, 100), marker(2, 200, 300)],
      # Overlapping across threads, over a step's edges, between steps.
      POOL: [event('a', -20, 30), event('c', 90, 130), event('d', 150, 180)],
      ITERATOR: [event('b', 20, 50), event('e', 250, 260)],
    },
  )
  assert b.steps == 2
  assert b.input_busy_ms == pytest.approx((50 + 10 + 10) / 1e3 / 2)
  assert b.input_ms == 0  # The steps took no batch.
  assert b.host_ms == pytest.approx(b.step_ms)  # tf.data's work is not.


def test_a_capture_without_tf_data_has_no_input_figures(tmp_path):
  b = from_trace(tmp_path, {STEPPING: [marker(1, 0, 100), thunk('f', 0, 60)]})
  assert b.input_ms is None and b.input_busy_ms is None
  assert b.kernel_ms + b.host_ms == pytest.approx(b.step_ms)


def test_a_breakdown_json_from_before_the_input_figures_loads(tmp_path):
  b = from_trace(tmp_path, {STEPPING: [marker(1, 0, 100), *get_next(0, 50)]})
  old = dataclasses.asdict(b)
  del old['input_ms'], old['input_busy_ms']
  path = tmp_path / 'breakdown.json'
  path.write_text(json.dumps(old))
  loaded = breakdown.Breakdown.load(str(path))
  assert loaded.input_ms is None and loaded.input_busy_ms is None
  assert loaded == dataclasses.replace(b, input_ms=None, input_busy_ms=None)
