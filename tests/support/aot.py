"""Where the tests keep XLA's AOT runtime: it takes minutes to build, so it
lives outside the session's temporary cache, in $XLA_MNIST_AOT_RUNTIME, else
~/.cache/xla_mnist-test. A machine builds it once for all sessions."""

import contextlib
import importlib.metadata
import os
from collections.abc import Iterator

from support.shared import locked

RUNTIME_DIR = os.environ.get('XLA_MNIST_AOT_RUNTIME') or os.path.expanduser(
  '~/.cache/xla_mnist-test/aot-runtime/'
  + importlib.metadata.version('tensorflow')
)


@contextlib.contextmanager
def building_lock() -> Iterator[None]:
  """Held around an export that may build the runtime: on a new machine,
  two test workers would otherwise both build it, at once, for minutes."""
  os.makedirs(os.path.dirname(RUNTIME_DIR), exist_ok=True)
  with locked(RUNTIME_DIR + '.lock'):
    yield
