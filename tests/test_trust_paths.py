"""Config files and paths a user picks: any name a filesystem allows is a
workdir, a data dir or a config path; a config file holds exactly the
recipe's fields, or the run is refused in one line (issue 28)."""

import os

import numpy as np
import pytest
from conftest import make_idx_folder, run_train

DEFAULT = 'from xla_mnist.configs import default\n'


def assert_one_line_error(proc, code: int, *fragments: str) -> None:
  assert proc.returncode == code, proc.stderr
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


def changed(*lines: str) -> str:
  """A config file: the default recipe with `lines` run on it."""
  body = ''.join(f'  {line}\n' for line in lines)
  head = f'{DEFAULT}def get_config():\n  c = default.get_config()\n'
  return f'{head}{body}  return c\n'


def rebuilt(field: str, value: str) -> str:
  """A config file whose ConfigDict is made anew, `field` set to `value`
  (so that ConfigDict's own type check does not see it)."""
  return (
    f'import ml_collections\n{DEFAULT}def get_config():\n'
    f'  d = default.get_config().to_dict()\n  d[{field!r}] = {value}\n'
    '  return ml_collections.ConfigDict(d)\n'
  )


BAD_FILES = {
  'misspelt field': (
    changed('c.learning_rat = 0.01'),
    'rename it learning_rate',
  ),
  'unknown field': (changed('c.colour = 1'), 'config.colour'),
  'missing field': (
    changed('del c["batch_size"]'),
    'no field config.batch_size',
  ),
  'string rate': (rebuilt('learning_rate', "'0.01'"), "learning_rate is '0"),
  'number for a folder': (rebuilt('idx_dir', '3'), 'make it a str'),
  'int for a bool': (rebuilt('dump_hlo', '1'), 'True or False'),
  'get_config raises': (
    'def get_config():\n  raise RuntimeError("boom")\n',
    'boom',
  ),
  'not a ConfigDict': ('def get_config():\n  return {"a": 1}\n', 'a dict, not'),
  'syntax error': ('def get_config(:\n', 'line 1'),
  'no get_config': ('x = 1\n', 'defines no get_config()'),
  'import fails': ('import no_such_module_here\n', 'No module named'),
  'null bytes': ('x = 1\0\n', 'null bytes'),
  'not utf-8': (b'x = "\xff"\n'.decode('latin-1'), 'line 1'),
}


BY_CHECK = {'string rate', 'int for a bool'}


@pytest.mark.parametrize('case', sorted(BAD_FILES))
def test_a_bad_config_file_is_one_line_and_the_usage_exit(case, tmp_path):
  text, fragment = BAD_FILES[case]
  path = tmp_path / 'cfg[1] x.py'
  path.write_bytes(text.encode('latin-1'))
  proc = run_train(f'--config={path}', f'--workdir={tmp_path / "w"}')
  assert_one_line_error(proc, 2, fragment)
  if case not in BY_CHECK:  # `config.check` names the field, not the file.
    assert str(path) in proc.stderr
  assert not (tmp_path / 'w').exists()  # Nothing half-written.


@pytest.mark.parametrize('kind', ['missing', 'folder', 'below a file'])
def test_a_config_path_that_is_no_file_is_one_line(kind, tmp_path):
  path = tmp_path / 'c.py'
  if kind == 'folder':
    path.mkdir()
  if kind == 'below a file':
    (tmp_path / 'f').write_text('')
    path = tmp_path / 'f' / 'c.py'
  proc = run_train(f'--config={path}')
  problem = 'is a folder' if kind == 'folder' else 'does not exist'
  assert_one_line_error(proc, 2, f'{path} {problem}')


@pytest.mark.skipif(os.geteuid() == 0, reason='root reads any file')
def test_an_unreadable_config_file_is_one_line(tmp_path):
  path = tmp_path / 'c.py'
  path.write_text(changed())
  path.chmod(0)
  assert_one_line_error(run_train(f'--config={path}'), 2, 'cannot read')


def test_the_misspelt_override_is_refused_as_before(tmp_path):
  proc = run_train('--config.learning_rat=0.01', f'--workdir={tmp_path}')
  assert_one_line_error(proc, 2, 'learning_rat')


NAMES = ['exp[lr=0.5]', 'a*b?c', 'back\\slash', 'sp ace é %20', '-lead', '~x']


def _train(base, name, steps, *extra):
  return run_train(
    f'--config={base / f"cfg] {name}.py"}',
    f'--workdir={base / name}',
    f'--data_dir={base / ("data " + name)}',
    f'--config.idx_dir={base / ("idx " + name)}',
    f'--config.num_steps={steps}',
    '--config.checkpoint_every=10',
    '--config.profile_steps=2',
    '--config.steps_per_loop=1',
    '--jit=on',
    # Not named: TF_XLA_FLAGS splits a path at its spaces (left open).
    f'--xla_cache_dir={base / "cache"}',
    *extra,
  )


@pytest.mark.slow
@pytest.mark.parametrize('name', NAMES)
def test_any_name_trains_and_resumes_bit_exact(name, tmp_path):
  """A config path, workdir, data dir and IDX folder named `name`: trained
  to 20 steps then resumed to 30 ends with the weights of 30 in one go."""
  from xla_mnist import model
  from xla_mnist.workdir import checkpointing

  make_idx_folder(str(tmp_path / ('idx ' + name)))
  (tmp_path / f'cfg] {name}.py').write_text(changed('c.log_every = 10'))
  first = _train(tmp_path, name, 20)
  assert first.returncode == 0, first.stderr
  resumed = _train(tmp_path, name, 30)
  assert resumed.returncode == 0, resumed.stderr
  assert 'resuming at step 20' in resumed.stdout
  straight = run_train(
    f'--config={tmp_path / f"cfg] {name}.py"}',
    f'--workdir={tmp_path / "straight"}',
    f'--data_dir={tmp_path / ("data " + name)}',
    f'--config.idx_dir={tmp_path / ("idx " + name)}',
    '--config.num_steps=30',
    '--config.checkpoint_every=10',
    '--config.profile_steps=2',
    '--config.steps_per_loop=1',
    '--jit=on',
    f'--xla_cache_dir={tmp_path / "cache"}',
  )
  assert straight.returncode == 0, straight.stderr
  a, b = model.create_model(), model.create_model()
  checkpointing.restore_model(a, str(tmp_path / name))
  checkpointing.restore_model(b, str(tmp_path / 'straight'))
  for x, y in zip(a.weights, b.weights, strict=True):
    assert np.array_equal(x.numpy(), y.numpy())
