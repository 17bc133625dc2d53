"""Runs interrupted at a step, and their checkpoints read back and damaged."""

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
