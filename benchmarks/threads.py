"""The thread settings the benchmark's programs run at, as the page names them.

A fair table holds each program at its own best setting: JAX at its
defaults (and at one thread, beside), this project's trainer at each
`config.cpu_threads` worth trying. Imports neither TF nor numpy: the
benchmark reads it before they start.
"""

from __future__ import annotations

import dataclasses
import os

TF1_POOL_THREADS = 1  # The TF1 program's session pools, one thread each.
TF1 = f'TF1 ConfigProto, {TF1_POOL_THREADS} thread a pool'


def tf(cpu_threads: int) -> str:
  """TF's pools at `config.cpu_threads=cpu_threads` (0: TF's default)."""
  return f'TF cpu_threads={cpu_threads}' + (
    ' (a thread per CPU)' * (not cpu_threads)
  )


def blas() -> str:
  """numpy's BLAS threads in this process."""
  return f'OPENBLAS_NUM_THREADS={os.environ.get("OPENBLAS_NUM_THREADS")}'


@dataclasses.dataclass(frozen=True)
class JaxSetting:
  """A thread setting JAX runs at, in processes of its own: XLA:CPU sizes
  its thread pools once, as JAX starts, from $PJRT_NPROC, else a thread per
  CPU. `--xla_cpu_multi_thread_eigen=false`, the flag JAX's issues suggest,
  leaves jaxlib 0.10's pool of a thread per CPU at work (measured)."""

  suffix: str  # Appended to the rows' names; '' for JAX's defaults.
  variables: dict[str, str]  # Added to the environment.
  threads: str  # What the results page says it ran with.


JAX_DEFAULTS = JaxSetting('', {}, "JAX's defaults")
JAX_ONE_THREAD = JaxSetting(', 1 thread', {'PJRT_NPROC': '1'}, 'PJRT_NPROC=1')
# Defaults first: JAX as users run it, which the worker profiles.
JAX_SETTINGS = (JAX_DEFAULTS, JAX_ONE_THREAD)


def jax_variables(setting: JaxSetting) -> dict[str, str]:
  """What a JAX process of `setting` adds to `timer.environment()`."""
  return {'JAX_PLATFORMS': 'cpu', **setting.variables}
