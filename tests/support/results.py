"""A run's `result.json`, made up."""

from __future__ import annotations

import os

from xla_mnist.workdir import outputs


def make_result(workdir: str, **changes) -> outputs.Result:
  capture = os.path.join(workdir, 'plugins', 'profile', '2026_12_02_20_14_42')
  fields = dict(
    dataset='fashion_mnist',
    jit='on',
    device='CPU:0',
    steps=300,
    batch_size=100,
    steps_per_loop=100,
    final_loss=0.9692,
    test_accuracy=0.723,
    compile_seconds=1.004,
    train_seconds=0.25,
    paused_seconds=0.05,
    steps_per_second=1207.4,
    traces=1,
    hlo_fusions=16,
    profile={
      'xplane_path': os.path.join(capture, 'vm.xplane.pb'),
      'trace_path': os.path.join(workdir, 'trace.json.gz'),
      'steps': 100,
      'mean_step_ms': 0.2277,
      'kernel_ms': 0.2101,
      'host_ms': 0.0176,
      'launches_per_step': 20.04,
      'top_ops': [('MatMul.9', 0.0774), ('multiply_bitcast_fusion', 0.0339)],
      'fusions': 16,
      'why': ['  MatMul.9 = MatMul: 77.4 µs'],
      'said': '100 steps, 0.228 ms/step = kernels 0.210 + host 0.018, 20.04'
      ' launches, 16 XLA fusions/step',
      'input_ms': None,
      'input_busy_ms': None,
    },
    workdir=workdir,
  )
  return outputs.Result(**{**fields, **changes})
