"""Where the tests keep XLA's AOT runtime: it takes minutes to build, so it
lives outside the session's temporary cache, in $XLA_MNIST_AOT_RUNTIME, else
~/.cache/xla_mnist-test. A machine builds it once for all sessions."""

import importlib.metadata
import os

RUNTIME_DIR = os.environ.get('XLA_MNIST_AOT_RUNTIME') or os.path.expanduser(
  '~/.cache/xla_mnist-test/aot-runtime/'
  + importlib.metadata.version('tensorflow')
)
