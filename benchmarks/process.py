"""Whole processes: start-up, training and peak memory as a user meets them.

Each program runs as its own process (wall time from launch to exit, peak
resident memory from the kernel's rusage), in alternating rounds, medians.
Runs without the benchmark's XLA flags, which would cluster or dump.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = 'python -m xla_mnist.train'
TF1 = 'TF1 program, XLA ON_1'
# Scaling: batch sizes at the run's steps, and multiples of its steps.
BATCHES = (100, 1_000, 10_000)
STEP_MULTIPLES = (1, 10, 100)


def _env() -> dict[str, str]:
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ('TF_XLA_FLAGS', 'XLA_FLAGS')
  }
  env['PYTHONPATH'] = os.pathsep.join(
    p for p in (REPO, env.get('PYTHONPATH', '')) if p
  )
  return env


# Forks the program from a small Python and reports its wall time and peak
# memory. A child forked straight from the benchmark (1 GB resident) would
# report the benchmark's peak: Linux carries the high-water mark over exec.
_LAUNCHER = """
import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
  os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], 'w') as f:
  f.write(f'{time.perf_counter() - start} {usage.ru_maxrss}')
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _timed(command: list[str]) -> tuple[float, float, str]:
  """Runs `command` in the repository: (wall s, peak MiB, its output)."""
  with tempfile.TemporaryDirectory() as scratch:
    figures = os.path.join(scratch, 'figures')
    proc = subprocess.run(
      [sys.executable, '-c', _LAUNCHER, figures, *command],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      errors='replace',
      env=_env(),
    )
    if proc.returncode:
      raise RuntimeError(
        f'{" ".join(command)} exited {proc.returncode}:\n{proc.stdout}'
      )
    with open(figures) as f:
      wall, peak_kib = f.read().split()
  return float(wall), int(peak_kib) / 1024, proc.stdout


def _train_command(scratch: str, data_dir: str, *flags: str) -> list[str]:
  return [
    sys.executable,
    '-m',
    'xla_mnist.train',
    '--config=fashion_mnist',
    f'--workdir={scratch}/run',
    f'--data_dir={os.path.abspath(data_dir)}',
    f'--xla_cache_dir={scratch}/xla_cache',
    '--fresh',
    *flags,
  ]


def _train_result(scratch: str) -> dict:
  with open(os.path.join(scratch, 'run', 'result.json')) as f:
    return json.load(f)


def whole_processes(runs: int, data_dir: str) -> list[dict]:
  """`python -m xla_mnist.train` (warm XLA cache) against TF1's program."""
  with tempfile.TemporaryDirectory(prefix='xla_mnist_process_') as scratch:
    commands = {
      TRAIN: _train_command(scratch, data_dir),
      TF1: [
        sys.executable,
        '-m',
        'benchmarks.tf1_program',
        '--xla',
        f'--trace={scratch}/timeline.json',
      ],
    }
    _timed(commands[TRAIN])  # Prepares the data and fills the XLA cache.
    rows: dict[str, list[dict]] = {name: [] for name in commands}
    for round_ in range(runs):
      for name in list(commands)[:: 1 if round_ % 2 == 0 else -1]:
        wall, peak, text = _timed(commands[name])
        if name == TRAIN:
          train_seconds = _train_result(scratch)['train_seconds']
        else:
          train_seconds = float(re.search(r'train ([\d.]+) s', text).group(1))
        accuracy = float(re.search(r'test accuracy ([\d.]+)', text).group(1))
        rows[name].append(
          {
            'wall_seconds': wall,
            'peak_mib': peak,
            'train_seconds': train_seconds,
            'test_accuracy': accuracy,
          }
        )
  return [
    {
      'program': name,
      **{k: statistics.median(r[k] for r in runs_) for k in runs_[0]},
    }
    for name, runs_ in rows.items()
  ]


def scaling(data_dir: str, steps: int) -> list[dict]:
  """The trainer's steps/s and peak memory for larger batches and runs."""
  cases = [(b, steps) for b in BATCHES] + [
    (BATCHES[0], steps * m) for m in STEP_MULTIPLES[1:]
  ]
  rows = []
  with tempfile.TemporaryDirectory(prefix='xla_mnist_scaling_') as scratch:
    for batch, num_steps in cases:
      wall, peak, _ = _timed(
        _train_command(
          scratch,
          data_dir,
          f'--config.batch_size={batch}',
          f'--config.num_steps={num_steps}',
          '--config.profile_steps=0',
          '--config.checkpoint_every=0',
        )
      )
      result = _train_result(scratch)
      rows.append(
        {
          'batch_size': batch,
          'steps': num_steps,
          'steps_per_second': result['steps_per_second'],
          'examples_per_second': result['steps_per_second'] * batch,
          'peak_mib': peak,
          'wall_seconds': wall,
        }
      )
  return rows
