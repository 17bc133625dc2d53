"""Whole processes: start-up, training and peak memory as a user meets them.

Each program runs as its own process (`timer.timed`), in alternating rounds;
each round's figures are kept, for the ratios round by round, and their
medians.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile
from collections.abc import Callable

from benchmarks import threads, timer
from xla_mnist.configs import fashion_mnist
from xla_mnist.runtime import layout

TRAIN = 'python -m xla_mnist.train'
JAX = 'JAX lax.scan program'
TF1 = 'TF1 program, XLA ON_1'
JAX_PROGRAM = os.path.join(os.path.dirname(__file__), 'jax_program.py')
# The trainer's thread counts (config.cpu_threads) timed in the process
# table, the config's own among them: one, TF's default of a thread per CPU,
# and two.
CPU_THREADS = (1, 0, 2)
# Scaling: batch sizes at the run's steps, and multiples of its steps.
BATCHES = (100, 1_000, 10_000)
STEP_MULTIPLES = (1, 10, 100)


@dataclasses.dataclass(frozen=True)
class _Program:
  command: list[str]
  env: dict[str, str]  # Added to `timer.environment()`.
  train_seconds: Callable[[str], float]  # From the program's stdout.
  threads: str  # Its thread setting, as the results page says it.


def _threads_flags(cpu_threads: int) -> list[str]:
  """The trainer's flags for `config.cpu_threads=cpu_threads`: none at the
  config's own."""
  if cpu_threads == fashion_mnist.get_config().cpu_threads:
    return []
  return [f'--config.cpu_threads={cpu_threads}']


def trainer_name(cpu_threads: int) -> str:
  """The process table's trainer at `config.cpu_threads=cpu_threads`."""
  return ' '.join([TRAIN, *_threads_flags(cpu_threads)])


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
  """`python -m xla_mnist.train` (warm XLA cache) at each of CPU_THREADS,
  against JAX's program at each of its thread settings (warm compilation
  cache; none without `jax_python`) and TF1's."""
  with tempfile.TemporaryDirectory(prefix='xla_mnist_process_') as scratch:
    programs = {
      trainer_name(n): _trainer(
        os.path.join(scratch, f'threads-{n}'), data_dir, n
      )
      for n in CPU_THREADS
    }
    if jax_python:
      programs |= _jax_programs(scratch, jax_python, data_dir)
    programs[TF1] = _Program(
      [
        sys.executable,
        '-m',
        'benchmarks.tf1_program',
        '--xla',
        f'--trace={scratch}/timeline.json',
      ],
      {},
      _printed_train_seconds,
      threads.TF1,
    )
    rows = _rounds(programs, runs)
  return [
    {
      'program': name,
      'threads': programs[name].threads,
      **{k: statistics.median(r[k] for r in rounds) for k in rounds[0]},
      'rounds': rounds,
    }
    for name, rounds in rows.items()
  ]


def _trainer(folder: str, data_dir: str, cpu_threads: int) -> _Program:
  """The trainer at `config.cpu_threads=cpu_threads`, with a workdir and XLA
  cache of its own in `folder`."""
  workdir = os.path.join(folder, 'run')
  return _Program(
    train_command(workdir, data_dir, *_threads_flags(cpu_threads)),
    {},
    lambda _: _train_result(workdir)['train_seconds'],
    threads.tf(cpu_threads),
  )


def _rounds(programs: dict[str, _Program], runs: int) -> dict[str, list[dict]]:
  """Each program once, to fill caches; then `runs` alternating rounds."""
  for program in programs.values():
    timer.timed(program.command, program.env)
  rows: dict[str, list[dict]] = {name: [] for name in programs}
  for round_ in range(runs):
    for name in list(programs)[:: 1 if round_ % 2 == 0 else -1]:
      program = programs[name]
      run = timer.timed(program.command, program.env)
      accuracy = re.search(r'test accuracy ([\d.]+)', run.stdout).group(1)
      rows[name].append(
        {
          'wall_seconds': run.wall_seconds,
          'peak_mib': run.peak_mib,
          'train_seconds': program.train_seconds(run.stdout),
          'test_accuracy': float(accuracy),
        }
      )
  return rows


def _jax_programs(
  scratch: str, python: str, data_dir: str
) -> dict[str, _Program]:
  """JAX's program at each of its thread settings, on the default run's
  data and batch order, written to `scratch` as prepared data (imports TF:
  the benchmark has set it up by now); a compilation cache per setting."""
  from benchmarks import baselines  # noqa: PLC0415
  from xla_mnist import data  # noqa: PLC0415

  config = fashion_mnist.get_config()  # What `train_command` runs.
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  path = os.path.join(scratch, 'jax_data.npz')
  baselines.write_jax_data(path, dataset.train, config, dataset.test)
  return {
    JAX + setting.suffix: _Program(
      [python, JAX_PROGRAM, path, os.path.join(scratch, f'jax_cache_{i}')],
      threads.jax_variables(setting),
      _printed_train_seconds,
      setting.threads,
    )
    for i, setting in enumerate(threads.JAX_SETTINGS)
  }


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
