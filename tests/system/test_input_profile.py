"""A run's profile beside its input: a streamed run's tf.data work is input,
not kernels, and a run without a pipeline says nothing of it (issue 50)."""

from __future__ import annotations

import pytest
from support.idx import make_idx_folder
from support.runs import train_here

from xla_mnist.inspection import breakdown


@pytest.fixture(scope='module')
def idx(tmp_path_factory) -> str:
  folder = str(tmp_path_factory.mktemp('idx'))
  make_idx_folder(folder, train=300)
  return folder


def profiled_run(idx: str, tmp_path, source: str) -> breakdown.Breakdown:
  """Four fused calls of 10 steps, the last two profiled; its breakdown."""
  trained = train_here(
    f'--workdir={tmp_path / "run"}',
    f'--data_dir={tmp_path / "tfds"}',
    f'--config.idx_dir={idx}',
    '--config.dataset=fashion_mnist',
    '--config.num_steps=40',
    '--config.steps_per_loop=10',
    '--config.batch_size=10',
    '--config.profile_steps=20',
    '--config.checkpoint_every=0',
    f'--config.input={source}',
  )
  return breakdown.Breakdown.load(trained.result.profile['breakdown_path'])


def test_a_streamed_runs_pipeline_is_input_not_kernels(idx, tmp_path):
  b = profiled_run(idx, tmp_path, 'stream')
  assert b.steps == 20
  # Before, tf.data's threads counted as kernels: more than the step.
  assert 0 < b.kernel_ms <= b.step_ms
  assert all(k.kind == 'xla' for k in b.kernels)  # No tf.data op among them.
  assert b.input_ms is not None and b.input_busy_ms is not None
  assert 0 <= b.input_ms <= b.step_ms and 0 <= b.input_busy_ms <= b.step_ms
  # The parts cover the step; more only where kernels ran side by side.
  assert b.kernel_ms + b.host_ms + b.input_ms >= b.step_ms * (1 - 1e-9)


def test_a_resident_run_has_no_input_figures(idx, tmp_path):
  b = profiled_run(idx, tmp_path, 'resident')
  assert b.input_ms is None and b.input_busy_ms is None
