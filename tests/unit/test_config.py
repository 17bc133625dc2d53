"""`config.check`: numbers bounded by this machine's cores and memory."""

from __future__ import annotations

import pytest

from xla_mnist import config as config_lib
from xla_mnist.configs import default
from xla_mnist.runtime import process
from xla_mnist.runtime.errors import UsageError


def test_the_bounds_follow_the_cores_and_memory():
  config = default.get_config()
  config.cpu_threads = process.PER_CORE * process.cores()
  config_lib.check(config)  # The bound itself is allowed.
  config.cpu_threads += 1
  with pytest.raises(UsageError, match='config.cpu_threads to at most'):
    config_lib.check(config)
  config = default.get_config()
  config.update(num_steps=2**40, steps_per_loop=2**31 - 1)
  with pytest.raises(UsageError, match='more than half of this machine'):
    config_lib.check(config)
