"""`streams`: a quiet stderr silences its descriptor and gives it back."""

from __future__ import annotations

import os

from xla_mnist.runtime import streams


def test_quiet_stderr_silences_the_descriptor_and_gives_it_back(tmp_path):
  """C++ writes to descriptor 2: it goes to the file, then stderr is back."""
  saved = os.dup(2)
  out = (tmp_path / 'stderr').open('w+b')
  os.dup2(out.fileno(), 2)
  try:
    with open(tmp_path / 'into', 'w+b') as into:
      with streams.quiet_stderr(into=into):
        os.write(2, b'kept aside\n')
      with streams.quiet_stderr():
        os.write(2, b'gone\n')
      os.write(2, b'shown\n')
      into.seek(0)
      assert into.read() == b'kept aside\n'
  finally:
    os.dup2(saved, 2)
    os.close(saved)
  out.seek(0)
  assert out.read() == b'shown\n'
