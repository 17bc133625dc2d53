"""The machine and versions a benchmark's figures were measured on."""

from __future__ import annotations

import os
import platform

from xla_mnist.workdir import outputs


def describe() -> dict[str, str | int | bool]:
  """CPU, cores, AVX-512, oneDNN as this process's TF decided, versions.

  Imports TF: call it after the benchmark has set TF's environment.
  """
  import numpy as np  # noqa: PLC0415 - after the environment is set.
  import tensorflow as tf  # noqa: PLC0415
  from tensorflow.python.util import _pywrap_util_port  # noqa: PLC0415

  return {
    'cpu': outputs.cpu_model(),
    'cores': os.cpu_count() or 0,
    'avx512': 'avx512f' in _cpu_flags(),
    # TF_ENABLE_ONEDNN_OPTS if set, else the CPU's default (on with AVX-512
    # VNNI and the like).
    'onednn': bool(_pywrap_util_port.IsMklEnabled()),
    'python': platform.python_version(),
    'tensorflow': tf.__version__,
    'numpy': np.__version__,
  }


def _cpu_flags() -> list[str]:
  """The CPU's feature flags (Linux's /proc/cpuinfo), else none."""
  return outputs.cpuinfo('flags').split()
