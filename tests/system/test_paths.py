"""Config files and paths a user picks (issues 28 and 39): any name a
filesystem allows is a workdir, a data dir or a config path; a config file
holds exactly the recipe's fields; a relative path is the same folder given
absolute; an IDX folder a user brings trains or is refused in one line; a
workdir whose name is not UTF-8 trains, resumes and reports."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from support import mnist
from support.cli import (
  FASHION,
  REPO,
  assert_one_line_error,
  run_module,
  run_train,
)
from support.idx import IDX_NAMES, make_idx_folder, write_idx

from xla_mnist.runtime import streams
from xla_mnist.runtime.errors import DataError, UsageError
from xla_mnist.workdir import files

DEFAULT = 'from xla_mnist.configs import default\n'


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


# Characters that globs, shells, URLs, flag parsers or `~` read otherwise,
# several in each name: one run and resume tries them all. The workdir's
# folder is the name itself: it starts with '-' or '~'.
NAMES = ['-lead exp[lr=0.5] a*b?c', '~x back\\slash sp ace é %20']


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


def _named(base, name: str) -> None:
  """The IDX folder and config file of `_train`'s runs named `name`."""
  make_idx_folder(str(base / ('idx ' + name)))
  (base / f'cfg] {name}.py').write_text(changed('c.log_every = 10'))


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """The same 30 steps in one go, under a plain name: the weights that each
  name's stopped and resumed run must end with."""
  base = tmp_path_factory.mktemp('straight')
  _named(base, 'straight')
  proc = _train(base, 'straight', 30)
  assert proc.returncode == 0, proc.stderr
  return base / 'straight'


@pytest.mark.slow
@pytest.mark.parametrize('name', NAMES)
def test_any_name_trains_and_resumes_bit_exact(name, straight, tmp_path):
  """A config path, workdir, data dir and IDX folder named `name`: trained
  to 20 steps then resumed to 30 ends with the weights of 30 in one go."""
  from xla_mnist import model
  from xla_mnist.export import trained

  _named(tmp_path, name)
  first = _train(tmp_path, name, 20)
  assert first.returncode == 0, first.stderr
  resumed = _train(tmp_path, name, 30)
  assert resumed.returncode == 0, resumed.stderr
  assert 'resuming at step 20' in resumed.stdout
  a, b = model.create_model(**mnist.FACTS), model.create_model(**mnist.FACTS)
  trained.restore_model(a, str(tmp_path / name))
  trained.restore_model(b, str(straight))
  for x, y in zip(a.weights, b.weights, strict=True):
    assert np.array_equal(x.numpy(), y.numpy())


TRAIN_IMAGES, TRAIN_LABELS = IDX_NAMES['train']


TEST_IMAGES, TEST_LABELS = IDX_NAMES['test']


# A name of bytes that are not UTF-8, as Python holds it (surrogateescape).
NOT_UTF8 = os.fsdecode(b'run-\xff\xfe')


# A short run: two checkpoints.
SHORT = ['--config.checkpoint_every=10', '--config.steps_per_loop=1']


# --- Relative paths ----------------------------------------------------------


def test_a_relative_idx_dir_prepares_as_the_same_folder_absolute(
  tmp_path, monkeypatch
):
  """Was: 'changed while the dataset was being prepared: run again', every
  time, as the source's files were named relative and looked up absolute."""
  from xla_mnist import data

  make_idx_folder(str(tmp_path / 'idx'))
  (tmp_path / 'elsewhere').mkdir()
  monkeypatch.chdir(tmp_path / 'elsewhere')
  relative = data.load('fashion_mnist', '../idx', '../tfds')
  assert relative.prepared_now
  assert str(tmp_path / 'idx') in relative.source  # Named as one folder.
  absolute = data.load('fashion_mnist', str(tmp_path / 'idx'), '../tfds')
  assert not absolute.prepared_now
  assert absolute.source_digest == relative.source_digest
  np.testing.assert_array_equal(relative.train.images, absolute.train.images)


def test_cluster_dumps_asked_for_a_folder_match_it_named_either_way(tmp_path):
  """`trainer` checks `dumping_to(<workdir>/clusters)` against what the
  notebook passed `cluster_dumps.request`: the same folder, relative or
  absolute.
  A process of its own: the dump flags are process-wide."""
  script = textwrap.dedent(
    """
    import os, sys
    from xla_mnist.runtime import cluster_dumps, env
    cluster_dumps.request('logs/nb/clusters')
    print(env.dumping_to(os.path.abspath('logs/nb/clusters')),
          env.dumping_to('./logs/nb/clusters'),
          env.dumping_to('logs/other/clusters'),
          any(f.startswith('--xla_dump_to=/')
              for f in os.environ['XLA_FLAGS'].split()))
    """
  )
  # Without the flags an earlier test's dumps left in this process.
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ('XLA_FLAGS', 'TF_XLA_FLAGS')
  }
  proc = subprocess.run(
    [sys.executable, '-c', script],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    check=True,
    env=env,
  )
  assert proc.stdout.split() == ['True', 'True', 'False', 'True']


def _relative_run(cwd, base: str, steps: int, *extra: str):
  """A run whose every path is relative to `cwd`, `base` leading to them."""
  return run_module(
    'xla_mnist.train',
    f'--config={base}cfg/recipe.py',
    f'--config.idx_dir={base}idx',
    f'--workdir={base}run',
    f'--data_dir={base}tfds',
    f'--xla_cache_dir={base}cache',
    f'--config.num_steps={steps}',
    *SHORT,
    *extra,
    cwd=str(cwd),
  )


@pytest.mark.slow
def test_every_relative_path_is_the_same_folder_given_absolute(tmp_path):
  """Config file, IDX folder, workdir, data dir and XLA cache given relative
  from two folders and absolute: one run, trained, resumed, found finished."""
  make_idx_folder(str(tmp_path / 'idx'))
  (tmp_path / 'cfg').mkdir()
  (tmp_path / 'cfg' / 'recipe.py').write_text(
    'from xla_mnist.configs import fashion_mnist\n\n\n'
    'def get_config():\n  return fashion_mnist.get_config()\n'
  )
  (tmp_path / 'a' / 'b').mkdir(parents=True)
  first = _relative_run(tmp_path / 'a' / 'b', '../../', 20)
  assert first.returncode == 0, first.stderr
  assert (tmp_path / 'run' / 'checkpoints' / 'ckpt-20.index').exists()
  assert list((tmp_path / 'cache').iterdir())  # XLA stored its programs.
  absolute = _relative_run(tmp_path / 'a', f'{tmp_path}/', 30)
  assert absolute.returncode == 0, absolute.stderr
  assert 'resuming at step 20' in absolute.stdout
  cache = f'XLA cache {os.path.realpath(tmp_path / "cache")}:'
  assert cache in first.stdout and cache in absolute.stdout  # One cache.
  assert 'using fashion_mnist IDX' in absolute.stdout  # Prepared once.
  again = _relative_run(tmp_path, '', 30)
  assert again.returncode == 0, again.stderr
  assert 'holds this finished run (30 steps)' in again.stdout


# --- IDX folders a user brings -----------------------------------------------


def _path(folder: str, name: str) -> str:
  return os.path.join(folder, name)


def images_32x32(folder: str) -> None:
  write_idx(_path(folder, TRAIN_IMAGES), 2051, np.zeros((300, 32, 32)))


def gz_name_not_gzipped(folder: str) -> None:
  path = _path(folder, TRAIN_IMAGES)
  with gzip.open(path) as f:
    unzipped = f.read()
  with open(path, 'wb') as f:
    f.write(unzipped)


def gzipped_without_gz(folder: str) -> None:
  path = _path(folder, TRAIN_LABELS)
  os.replace(path, path.removesuffix('.gz'))


def float_images(folder: str) -> None:
  """An IDX file of float32 (type 0x0D), as some exports write them."""
  header = struct.pack('>4i', 0x0D03, 300, 28, 28)
  with gzip.open(_path(folder, TRAIN_IMAGES), 'wb') as f:
    f.write(header + np.zeros((300, 28, 28), '>f4').tobytes())


def empty_test_split(folder: str) -> None:
  write_idx(_path(folder, TEST_IMAGES), 2051, np.zeros((0, 28, 28)))
  write_idx(_path(folder, TEST_LABELS), 2049, np.zeros(0))


def empty_file(folder: str) -> None:
  open(_path(folder, TEST_LABELS), 'wb').close()


def negative_count(folder: str) -> None:
  with gzip.open(_path(folder, TRAIN_LABELS), 'wb') as f:
    f.write(struct.pack('>2i', 2049, -1))


def label_255(folder: str) -> None:
  write_idx(_path(folder, TEST_LABELS), 2049, np.full(100, 255))


BAD_FOLDERS = {
  images_32x32: [TRAIN_IMAGES, '(32, 32)', 'resize the images to 28x28'],
  gz_name_not_gzipped: [
    TRAIN_IMAGES,
    'is not gzipped',
    f'rename it {TRAIN_IMAGES.removesuffix(".gz")}',
  ],
  gzipped_without_gz: [
    TRAIN_LABELS.removesuffix('.gz'),
    'is gzipped',
    f'rename it {TRAIN_LABELS}',
  ],
  float_images: [TRAIN_IMAGES, 'magic number 3331', "put the release's image"],
  empty_test_split: [TEST_IMAGES, 'hold no examples', 'put files that hold'],
  empty_file: [TEST_LABELS, 'no full header', 'replace the file'],
  negative_count: [TRAIN_LABELS, 'announces -1 items', 'replace the file'],
  label_255: [TEST_LABELS, 'label 255', 'map the labels into that range'],
}


@pytest.mark.parametrize(
  'damage', list(BAD_FOLDERS), ids=[f.__name__ for f in BAD_FOLDERS]
)
def test_an_odd_idx_folder_is_refused_naming_the_file_and_the_fix(
  damage, tmp_path
):
  from xla_mnist import data

  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  damage(folder)
  with pytest.raises(DataError) as error:
    data.load('fashion_mnist', folder, str(tmp_path / 'tfds'))
  message = str(error.value)
  assert '\n' not in message
  for fragment in BAD_FOLDERS[damage]:
    assert fragment in message, message
  written = [p for p in (tmp_path / 'tfds').rglob('*') if p.is_file()]
  assert not [p for p in written if 'tfrecord' in p.name], written


@pytest.mark.slow
@pytest.mark.parametrize(
  'damage',
  [
    # All fail as the IDX folder is loaded: TF's start-up lines, which
    # differ with oneDNN on and off, are checked with it flipped for one.
    pytest.param(images_32x32, marks=pytest.mark.kernels),
    gz_name_not_gzipped,
    empty_test_split,
  ],
  ids=lambda f: f.__name__,
)
def test_an_odd_idx_folder_is_one_line_from_the_command(damage, tmp_path):
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  damage(folder)
  proc = run_train(
    FASHION,
    f'--config.idx_dir={folder}',
    f'--data_dir={tmp_path / "tfds"}',
    f'--workdir={tmp_path / "run"}',
  )
  assert_one_line_error(proc, 1, *BAD_FOLDERS[damage])
  run = tmp_path / 'run'
  assert not run.exists() or list(run.iterdir()) == []


# --- Names that are not UTF-8 ------------------------------------------------


def test_a_path_tf_cannot_take_is_given_through_its_folder(tmp_path):
  folder = tmp_path / NOT_UTF8
  folder.mkdir()
  (folder / 'ckpt-1.index').write_text('x')
  plain = str(tmp_path / 'plain')
  assert files.tf_path(plain, 'workdir') == plain  # UTF-8: as it is.
  given = files.tf_path(str(folder), 'workdir')
  given.encode()  # TF encodes its paths as UTF-8: this must not fail.
  assert os.path.samefile(given, folder)
  prefix = files.tf_path(str(folder / 'ckpt-1.index'), 'workdir')
  with open(prefix) as f:
    assert f.read() == 'x'
  globbed = tmp_path / 'exp[lr=0.5]'
  globbed.mkdir()
  literal = files.tf_path(str(globbed / 'ckpt-1'), 'workdir', literal=True)
  assert '[' not in literal and literal.endswith('/ckpt-1')
  assert files.tf_path(str(globbed), 'workdir') == str(globbed)


def test_a_line_with_a_name_not_utf8_prints_on_any_stdout():
  assert streams.printable(f'outputs in {NOT_UTF8}') == (
    'outputs in run-\\xff\\xfe'
  )
  assert streams.printable('exp é [1]') == 'exp é [1]'
  assert streams.printable('\ud800') == '\\ud800'  # No name's byte.


def test_a_data_dir_not_utf8_is_refused_before_anything_is_written(tmp_path):
  """TFDS passes its paths on as text: refused at once (before TF), not in
  TFDS's traceback after it began writing."""
  proc = run_train(
    FASHION,
    f'--data_dir={tmp_path / NOT_UTF8}',
    f'--workdir={tmp_path / "run"}',
    f'--xla_cache_dir={tmp_path / "cache"}',
  )
  assert_one_line_error(proc, 2, 'run-\\xff\\xfe is not UTF-8', '--data_dir')
  assert list(tmp_path.iterdir()) == []
  from xla_mnist import data

  make_idx_folder(str(tmp_path / 'idx'))
  with pytest.raises(UsageError, match='data_dir=DIR whose name is UTF-8'):
    data.load('fashion_mnist', str(tmp_path / 'idx'), str(tmp_path / NOT_UTF8))
  assert sorted(p.name for p in tmp_path.iterdir()) == ['idx']


def _events(workdir: str) -> dict[str, list[int]]:
  """The steps of each scalar tag in `workdir`'s event files, read through
  TF (which cannot open the path as named)."""
  import tensorflow as tf

  tags: dict[str, list[int]] = {}
  for name in sorted(os.listdir(workdir)):
    if name.startswith('events.out.tfevents'):
      path = files.tf_path(os.path.join(workdir, name), 'workdir')
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          tags.setdefault(value.tag, []).append(event.step)
  return tags


def _check_outputs(workdir: str, steps: int) -> None:
  with open(os.path.join(workdir, 'result.json')) as f:
    result = json.load(f)
  assert result['steps'] == steps
  assert result['workdir'].endswith(NOT_UTF8)  # The name, byte for byte.
  assert os.path.isfile(os.path.join(workdir, 'report.md'))
  tags = _events(workdir)
  assert tags['train/loss'][-1] == steps
  assert tags['eval/test_accuracy'][-1] == steps  # Each run's, in turn.


@pytest.mark.slow
def test_not_utf8_workdir_trains_resumes_and_reports_from_the_command(
  tmp_path,
):
  """Was a 67-line traceback from TF's conversion of the path: every output,
  the profile's too, goes through the folder's descriptor."""
  make_idx_folder(str(tmp_path / 'idx'))
  workdir = str(tmp_path / NOT_UTF8)
  args = [
    FASHION,
    f'--config.idx_dir={tmp_path / "idx"}',
    f'--data_dir={tmp_path / "tfds"}',
    f'--workdir={workdir}',
    '--config.profile_steps=5',
    *SHORT,
  ]
  first = run_train(*args, '--config.num_steps=20', PYTHONIOENCODING='utf-8')
  assert first.returncode == 0, first.stderr
  assert first.stderr == ''
  assert 'outputs in ' in first.stdout and 'run-\\xff\\xfe' in first.stdout
  _check_outputs(workdir, 20)
  assert 'profiling failed' not in first.stdout
  for name in ('breakdown.json', 'trace.json.gz'):
    assert os.path.isfile(os.path.join(workdir, name)), name
  resumed = run_train(*args, '--config.num_steps=30')
  assert resumed.returncode == 0, resumed.stderr
  assert 'resuming at step 20' in resumed.stdout
  _check_outputs(workdir, 30)
  names = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  assert 'ckpt-30.index' in names and 'checkpoint' in names


@pytest.mark.slow
def test_not_utf8_workdir_trains_from_python(tmp_path):
  """`train_and_evaluate` in a process of its own, given the name as Python
  holds it; a relative workdir and data dir, as a notebook passes them."""
  make_idx_folder(str(tmp_path / 'idx'))
  script = textwrap.dedent(
    f"""
    import os
    from xla_mnist import trainer
    from xla_mnist.configs import fashion_mnist

    config = fashion_mnist.get_config()
    config.idx_dir = 'idx'
    config.num_steps = 20
    config.profile_steps = 0
    config.checkpoint_every = 10
    workdir = os.fsdecode({os.fsencode(NOT_UTF8)!r})
    trained = trainer.train_and_evaluate(config, workdir, 'tfds', quiet=True)
    again = trainer.train_and_evaluate(config, workdir, 'tfds', quiet=True)
    print(trained.result.steps, again.was_finished)
    """
  )
  proc = subprocess.run(
    [sys.executable, '-c', script],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split()[-2:] == ['20', 'True']
  _check_outputs(str(tmp_path / NOT_UTF8), 20)


@pytest.mark.parametrize(
  'module, args, named',
  [
    ('xla_mnist.train', ['--config=fashion_mnist'], 'logs/fashion_mnist-on'),
    ('xla_mnist.train', ['--workdir=/tmp/w', '--data_dir=d'], 'd is'),
    (
      'xla_mnist.train',
      ['--workdir=/w', '--data_dir=/d', '--config.idx_dir=idx'],
      'idx is',
    ),
    ('xla_mnist.compare', [], 'logs/compare-default'),
    ('xla_mnist.aot', ['--workdir=run'], 'run, ./data are'),
  ],
)
def test_relative_paths_with_the_current_folder_gone_are_one_line(
  module, args, named, tmp_path
):
  """A shell whose folder was deleted since it entered it: every relative
  path is refused in one line, before anything is written or imported."""
  gone = tmp_path / 'gone'
  gone.mkdir()
  script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
  proc = subprocess.run(
    ['sh', '-c', script, 'sh', str(gone), sys.executable, '-m', module, *args],
    capture_output=True, text=True, timeout=120,
    env={**os.environ, 'PYTHONPATH': REPO},
  )  # fmt: skip
  assert_one_line_error(proc, 1, 'the current folder is gone', named)
