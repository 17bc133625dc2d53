"""Whole processes timed as a user meets them: wall time and peak memory.

The one timer of the benchmark's processes (trainer, TF1 program, scaling,
inference). Each command runs from the repository, without the XLA flags the
benchmark sets for its own process, which would cluster or dump.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile

from xla_mnist.runtime.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The benchmark's own settings, for its auto-clustering variant, and the
# sizes of JAX's XLA:CPU thread pools, which each JAX setting sets itself
# (`threads.JAX_SETTINGS`).
_OWN_VARIABLES = ('TF_XLA_FLAGS', 'XLA_FLAGS', 'PJRT_NPROC', 'NPROC')

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


@dataclasses.dataclass(frozen=True)
class Timed:
  wall_seconds: float  # Launch to exit.
  peak_mib: float  # The largest resident set.
  stdout: str


def timed(command: list[str], env: dict[str, str] | None = None) -> Timed:
  """Runs `command` (its program a path), with the variables `env` added;
  UserError when it fails."""
  with tempfile.TemporaryDirectory(prefix='xla_mnist_timer_') as scratch:
    figures = os.path.join(scratch, 'figures')
    proc = subprocess.run(
      [sys.executable, '-c', _LAUNCHER, figures, *command],
      cwd=REPO,
      capture_output=True,
      text=True,
      errors='replace',
      env={**environment(), **(env or {})},
    )
    if proc.returncode:
      said = proc.stderr.strip().splitlines() or ['no output']
      raise UserError(
        f'{" ".join(command)} exited {proc.returncode} ({said[-1]}): run it'
        ' alone to see why'
      )
    with open(figures) as f:
      wall, peak_kib = f.read().split()
  return Timed(float(wall), int(peak_kib) / 1024, proc.stdout)


def environment() -> dict[str, str]:
  """This process's variables less the benchmark's own XLA settings, with
  the repository importable: what every program it starts runs in."""
  env = {k: v for k, v in os.environ.items() if k not in _OWN_VARIABLES}
  env['PYTHONPATH'] = os.pathsep.join(
    p for p in (REPO, env.get('PYTHONPATH', '')) if p
  )
  return env
