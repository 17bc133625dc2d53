"""What a run leaves in its workdir, written so that nothing is half-written."""

from __future__ import annotations

import dataclasses
import json
import os

from xla_mnist import files

RESULT_FILE = 'result.json'


@dataclasses.dataclass(frozen=True)
class Result:
  """The figures of one finished run; `result.json` holds them too."""

  dataset: str
  jit: str
  device: str
  steps: int
  batch_size: int
  steps_per_loop: int  # Training steps per call of the compiled function.
  final_loss: float
  test_accuracy: float
  # XLA's compile (or a load from its cache), traced beforehand: a zero-step
  # call of the fused loop, or the first call (one update included) of the
  # per-step function.
  compile_seconds: float
  train_seconds: float  # The steps after that, without `other_seconds`.
  other_seconds: float  # Checkpoint saves and profiler set-up between steps.
  steps_per_second: float
  traces: int  # Python traces of the training function; 1 = no retracing.
  hlo_fusions: int | None  # --dump_hlo with --jit=on: fusions in the step.
  profile: dict | None  # The traced window's `profiling.ProfileSummary`.
  workdir: str

  def summary(self) -> str:
    return '\n'.join(
      [
        f'test accuracy {self.test_accuracy:.4f}'
        f'  ({self.dataset}, jit={self.jit}, device={self.device})',
        f'{self.steps} steps of {self.batch_size}:'
        f' compile {self.compile_seconds:.2f} s,'
        f' train {self.train_seconds:.2f} s'
        f' ({self.steps_per_second:,.0f} steps/s;'
        f' checkpoints and profiler {self.other_seconds:.2f} s),'
        f' final loss {self.final_loss:.4f}',
        f'outputs in {self.workdir} (tensorboard --logdir {self.workdir})'
        if self.workdir
        else 'outputs: none kept by this process',
      ]
    )


def prepare_workdir(workdir: str) -> str:
  """Creates `workdir` and checks that it can be written; returns its path."""
  files.ensure_writable_dir(workdir, 'workdir', 'workdir')
  return workdir


def read_result(workdir: str) -> Result | None:
  """The `result.json` of a finished run in `workdir`, if it has one."""
  try:
    with open(os.path.join(workdir, RESULT_FILE)) as f:
      return Result(**json.load(f))
  except (OSError, ValueError, TypeError):
    return None


def write_result(result: Result) -> str:
  path = os.path.join(result.workdir, RESULT_FILE)
  text = json.dumps(dataclasses.asdict(result), indent=2)
  files.write_atomically(path, text + '\n')
  return path
