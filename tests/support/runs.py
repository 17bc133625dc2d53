"""Runs interrupted at a step, runs in this process, and their checkpoints
read back and damaged."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import tensorflow as tf
from support.cli import start_train


def checkpoint_bytes(folder) -> dict[str, bytes]:
  """Every checkpoint file under `folder`, by relative path, but the pointer."""
  return {
    str(p.relative_to(folder)): p.read_bytes()
    for p in sorted(folder.rglob('*'))
    if p.is_file() and p.name != 'checkpoint'
  }


def cut(path) -> None:
  path.write_bytes(path.read_bytes()[:100])


def interrupt(args: list[str], after_step: int, signum: int):
  """Starts a run, sends `signum` once it logged `after_step`, waits."""
  proc = start_train(*args)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    match = re.match(r'step +(\d+)/', line)
    if match and int(match.group(1)) >= after_step:
      proc.send_signal(signum)
      break
  out, err = proc.communicate(timeout=120)
  return subprocess.CompletedProcess(
    proc.args, proc.returncode, ''.join(lines) + out, err
  )


def train_here(*flags: str):
  """train's `flags` run in this process, as a notebook trains: the config
  train takes from them (`parse.config_of`), in their --workdir, with their
  --data_dir, by `trainer.train_and_evaluate`. Where the command is not what
  a test checks, this spares it a process and TF's import. TF's threads stay
  as this process started them (TF takes them once); auto-clustering is off
  again after, for the next test."""
  from xla_mnist import parse, trainer
  from xla_mnist.runtime import process

  workdir = parse.value_of('--workdir', [*flags])
  data_dir = parse.value_of('--data_dir', [*flags])
  assert workdir and data_dir, f'--workdir and --data_dir, please: {flags}'
  threads = tf.config.threading.get_intra_op_parallelism_threads()
  config = parse.config_of([*flags, f'--config.cpu_threads={threads}'])
  try:
    return trainer.train_and_evaluate(config, workdir, data_dir)
  finally:
    process.configure_jit('on')


def final_state(workdir) -> dict[str, np.ndarray]:
  """Every value of the workdir's latest checkpoint but the save counter."""
  reader = tf.train.load_checkpoint(
    tf.train.latest_checkpoint(str(workdir / 'checkpoints'))
  )
  return {
    key: reader.get_tensor(key)
    for key in reader.get_variable_to_shape_map()
    if not key.startswith(('save_counter', '_CHECKPOINTABLE'))
  }
