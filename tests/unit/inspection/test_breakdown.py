"""The step breakdown, read from real captures of every jit mode made by
the command (hence `slow`), and its errors.

Every mode's capture is one of the shared compare run's profiled runs
(conftest's `compare_workdir`), whose figures test_compare checks as compare
reports them; here `from_capture` reads each capture itself. The HLO that
each XLA kernel is checked against needs runs of its own (`--dump_hlo`)."""

from __future__ import annotations

import os
import re

import pytest
from support.cli import run_train
from support.compare import COMPARE_LOOP
from support.idx import make_idx_folder
from support.xplane import tf_kernels_in_xplane

from xla_mnist.inspection import breakdown
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


def read(workdir: str, mode: str) -> breakdown.Breakdown:
  per_call = COMPARE_LOOP if mode == 'fused' else 1
  return breakdown.from_capture(breakdown.find_capture(workdir), per_call)


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
    tf_kernels_in_xplane(breakdown.find_capture(workdir)) / PROFILED
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


def test_a_workdir_without_a_capture_is_a_data_error(tmp_path):
  with pytest.raises(DataError, match='profile_steps'):
    breakdown.find_capture(str(tmp_path))
