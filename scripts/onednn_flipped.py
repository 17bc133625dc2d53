"""Prints the TF_ENABLE_ONEDNN_OPTS value that flips this machine's default.

TF turns its oneDNN kernels on by itself on some CPUs (AVX-512 with VNNI,
among others) and says so as it starts; `make test` runs the tests that
depend on TF's CPU kernels a second time with this value, so that a machine
of either kind checks both kernel families.
"""

import os
import subprocess
import sys

probe = subprocess.run(
  [sys.executable, '-c', 'import tensorflow'],
  env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '0'},
  capture_output=True,
  text=True,
  check=True,
)
print('0' if 'oneDNN custom operations are on' in probe.stderr else '1')
