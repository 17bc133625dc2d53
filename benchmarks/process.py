"""Whole processes: start-up, training and peak memory as a user meets them.

Each program runs as its own process (`timer.timed`), in alternating rounds;
each round's figures are kept, for the ratios round by round, and their
medians.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile

from benchmarks import timer
from xla_mnist.configs import fashion_mnist
from xla_mnist.runtime import layout

TRAIN = 'python -m xla_mnist.train'
JAX = 'JAX lax.scan program'
TF1 = 'TF1 program, XLA ON_1'
JAX_PROGRAM = os.path.join(os.path.dirname(__file__), 'jax_program.py')
# Scaling: batch sizes at the run's steps, and multiples of its steps.
BATCHES = (100, 1_000, 10_000)
STEP_MULTIPLES = (1, 10, 100)


def train_command(workdir: str, data_dir: str, *flags: str) -> list[str]:
  """A fresh run of the `fashion_mnist` recipe into `workdir`."""
  return [
    sys.executable,
    '-m',
    'xla_mnist.train',
    '--config=fashion_mnist',
    f'--workdir={workdir}',
    f'--data_dir={os.path.abspath(data_dir)}',
    f'--xla_cache_dir={os.path.dirname(workdir)}/xla_cache',
    '--fresh',
    *flags,
  ]


def _train_result(workdir: str) -> dict:
  with open(os.path.join(workdir, layout.RESULT_FILE)) as f:
    return json.load(f)


def _printed_train_seconds(stdout: str) -> float:
  return float(re.search(r'train ([\d.]+) s', stdout).group(1))


def whole_processes(
  runs: int, data_dir: str, jax_python: str = ''
) -> list[dict]:
  """`python -m xla_mnist.train` (warm XLA cache) against JAX's program
  (warm compilation cache; none without `jax_python`) and TF1's."""
  with tempfile.TemporaryDirectory(prefix='xla_mnist_process_') as scratch:
    workdir = os.path.join(scratch, 'run')
    # Each program's command, its environment, and its train time.
    programs = {
      TRAIN: (
        train_command(workdir, data_dir),
        {},
        lambda _: _train_result(workdir)['train_seconds'],
      )
    }
    if jax_python:
      programs[JAX] = (
        *_jax_program(scratch, jax_python, data_dir),
        _printed_train_seconds,
      )
    programs[TF1] = (
      [
        sys.executable,
        '-m',
        'benchmarks.tf1_program',
        '--xla',
        f'--trace={scratch}/timeline.json',
      ],
      {},
      _printed_train_seconds,
    )
    rows = _rounds(programs, runs)
  return [
    {
      'program': name,
      **{k: statistics.median(r[k] for r in rounds) for k in rounds[0]},
      'rounds': rounds,
    }
    for name, rounds in rows.items()
  ]


def _rounds(programs: dict, runs: int) -> dict[str, list[dict]]:
  """Each program once, to fill caches; then `runs` alternating rounds."""
  for command, env, _ in programs.values():
    timer.timed(command, env)
  rows: dict[str, list[dict]] = {name: [] for name in programs}
  for round_ in range(runs):
    for name in list(programs)[:: 1 if round_ % 2 == 0 else -1]:
      command, env, train_seconds = programs[name]
      run = timer.timed(command, env)
      accuracy = re.search(r'test accuracy ([\d.]+)', run.stdout).group(1)
      rows[name].append(
        {
          'wall_seconds': run.wall_seconds,
          'peak_mib': run.peak_mib,
          'train_seconds': train_seconds(run.stdout),
          'test_accuracy': float(accuracy),
        }
      )
  return rows


def _jax_program(
  scratch: str, python: str, data_dir: str
) -> tuple[list[str], dict[str, str]]:
  """JAX's program and environment, on the default run's data and batch
  order, written to `scratch` as prepared data (imports TF: the benchmark
  has set it up by now)."""
  from benchmarks import baselines  # noqa: PLC0415
  from xla_mnist import data  # noqa: PLC0415

  config = fashion_mnist.get_config()  # What `train_command` runs.
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  path = os.path.join(scratch, 'jax_data.npz')
  baselines.write_jax_data(path, dataset.train, config, dataset.test)
  command = [python, JAX_PROGRAM, path, os.path.join(scratch, 'jax_cache')]
  return command, baselines.JAX_ENV


def scaling(data_dir: str, steps: int) -> list[dict]:
  """The trainer's steps/s and peak memory for larger batches and runs."""
  cases = [(b, steps) for b in BATCHES] + [
    (BATCHES[0], steps * m) for m in STEP_MULTIPLES[1:]
  ]
  rows = []
  with tempfile.TemporaryDirectory(prefix='xla_mnist_scaling_') as scratch:
    workdir = os.path.join(scratch, 'run')
    for batch, num_steps in cases:
      run = timer.timed(
        train_command(
          workdir,
          data_dir,
          f'--config.batch_size={batch}',
          f'--config.num_steps={num_steps}',
          '--config.profile_steps=0',
          '--config.checkpoint_every=0',
        )
      )
      result = _train_result(workdir)
      rows.append(
        {
          'batch_size': batch,
          'steps': num_steps,
          'steps_per_second': result['steps_per_second'],
          'examples_per_second': result['steps_per_second'] * batch,
          'peak_mib': run.peak_mib,
          'wall_seconds': run.wall_seconds,
        }
      )
  return rows
