"""`env.check_user_flags`: nothing is checked when the user set no flags."""

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
