"""`env` loads the user's flag check, and cluster dumps, only when set."""

from __future__ import annotations

import os
import sys

from xla_mnist.runtime import env


def test_nothing_is_checked_when_the_user_set_no_flags(monkeypatch, tmp_path):
  monkeypatch.setattr(env, '_USER_FLAGS', dict.fromkeys(env.FLAG_VARIABLES))
  monkeypatch.setitem(sys.modules, 'xla_mnist.runtime.user_flags', None)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  env.check_user_flags()  # Nothing loaded, no child, no file.
  assert not os.listdir(tmp_path)


def test_a_run_without_cluster_dumps_loads_none_of_their_code(monkeypatch):
  dumps = 'xla_mnist.runtime.cluster_dumps'
  monkeypatch.delitem(sys.modules, dumps, raising=False)
  assert not env.dumping_to('logs/run/clusters')
  assert dumps not in sys.modules
