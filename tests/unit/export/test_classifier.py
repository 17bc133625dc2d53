"""`classifier.export` called from Python: its errors name arguments."""

import os

import pytest


def test_export_errors_name_arguments_from_python(tmp_path):
  """The command's checks, worded for a library caller: `out_dir=...`, not
  `--out_dir=...`; all before TensorFlow is needed."""
  from xla_mnist.export import classifier
  from xla_mnist.runtime import errors

  workdir = str(tmp_path / 'run')
  os.makedirs(os.path.join(workdir, 'checkpoints'))
  open(os.path.join(workdir, 'checkpoints', 'checkpoint'), 'w').close()
  for kwargs, error, said in (
    ({'workdir': ''}, errors.UsageError, 'workdir is required'),
    ({'batch_size': 0}, errors.UsageError, 'batch_size=0: must be at least'),
    ({'checkpoint': ''}, errors.UsageError, 'checkpoint=: pass the name'),
    ({'target_cpu': 'bogus'}, errors.UsageError, 'target_cpu=bogus: pass one'),
    ({'check_dir': '/nope'}, errors.DataError, 'or check_dir= to skip'),
    ({'out_dir': workdir}, errors.UsageError, f'out_dir={workdir} would'),
  ):
    with pytest.raises(error) as raised:
      classifier.check(**{'workdir': workdir, 'check_dir': '', **kwargs})
    assert said in str(raised.value)
    assert '--' not in str(raised.value)
  assert classifier.check(workdir, check_dir='') == os.path.join(workdir, 'aot')
