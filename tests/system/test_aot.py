"""`python -m xla_mnist.aot` and its `classify`: a real run, compiled and
run; their own files checked, oversized ones refused.

XLA's AOT runtime takes minutes to build, so it lives outside the session's
temporary cache: in $XLA_MNIST_AOT_RUNTIME, else ~/.cache/xla_mnist-test.
A machine builds it once for all sessions."""

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from support import folders
from support.aot import RUNTIME_DIR, building_lock
from support.cli import (
  REPO,
  assert_one_line_error,
  run_module,
  run_train,
  start_train,
)
from support.idx import (
  FASHION_DIR,
  IDX_NAMES,
  bomb,
  idx_header,
  make_idx_folder,
  more_than_memory,
  sparse,
  write_idx,
)
from support.models import FACTORIES, importable
from support.runs import train_here

IMAGES = IDX_NAMES['train'][0]


# classify and the export name their own files and their own fix.


@pytest.mark.slow
def test_the_exports_check_folder_names_the_exports_files_and_fix(
  tmp_path, fashion_data_dir
):
  workdir = str(tmp_path / 'run')
  train_briefly(workdir, fashion_data_dir, '--config=fashion_mnist', steps=2)
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  test_images, test_labels = IDX_NAMES['test']
  os.remove(os.path.join(folder, test_labels))
  for name in IDX_NAMES['train']:  # Training's files play no part.
    os.remove(os.path.join(folder, name))
  proc = run_module(
    'xla_mnist.aot', f'--workdir={workdir}', f'--check_dir={folder}'
  )
  assert_one_line_error(
    proc,
    1,
    f'{folder} lacks {test_labels}: put {test_images}, {test_labels} there',
    'point --check_dir at the IDX test set, or --check_dir= to skip',
  )
  assert 'train-' not in proc.stderr and 'idx_dir' not in proc.stderr
  # A file beyond memory is refused before the build, in one line too.
  os.remove(os.path.join(folder, test_images))
  bomb(
    os.path.join(folder, test_images), idx_header(2051, more_than_memory()), 0
  )
  write_idx(os.path.join(folder, test_labels), 2049, np.zeros(3, np.uint8))
  proc = run_module(
    'xla_mnist.aot', f'--workdir={workdir}', f'--check_dir={folder}'
  )
  assert_one_line_error(proc, 1, test_images, 'free memory')


@pytest.mark.slow
def test_classify_refuses_oversized_files_and_names_its_own_fix(
  exported,  # noqa: F811 - test_aot's fixture.
  tmp_path,
):
  workdir, _ = exported
  binary = os.path.join(workdir, 'aot', 'classify')
  cases = {
    'sparse': sparse(str(tmp_path / 'sparse'), idx_header(2051, 10), 40 << 30),
    'short': sparse(str(tmp_path / 'short'), idx_header(2051, 60000), 1000),
    'memory': bomb(
      str(tmp_path / 'memory.gz'), idx_header(2051, more_than_memory()), 0
    ),
    'bomb': bomb(str(tmp_path / 'bomb.gz'), idx_header(2051, 1000), 64 << 20),
    'negative': sparse(str(tmp_path / 'negative'), idx_header(2051, -5), 16),
  }
  for name, fragment in [
    ('sparse', '42949672960 bytes, its header announces 10 items'),
    ('short', '1000 bytes, its header announces 60000 items'),
    ('memory', 'MiB available: use a smaller IDX file or free memory'),
    ('bomb', '784017 bytes, its header announces 1000 items'),
    ('negative', 'announces -5 items: not an IDX file'),
  ]:
    assert_one_line_error(run_classify(binary, cases[name]), 1, fragment)
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder)
  os.remove(os.path.join(folder, IDX_NAMES['test'][1]))
  assert_one_line_error(
    run_classify(binary, folder),
    1,
    'is missing: classify reads the IDX test set',
    'or give it an IDX image file alone',
  )


def run_aot(*args: str, timeout: float = 120, **env: str):
  return run_module('xla_mnist.aot', *args, timeout=timeout, **env)


def run_classify(binary: str, *args: str):
  return subprocess.run(
    [binary, *args], capture_output=True, text=True, timeout=60
  )


@pytest.fixture(scope='module')
def trained(tmp_path_factory, fashion_data_dir) -> str:
  """A 200-step run on Fashion-MNIST; tests that change it take a copy."""
  workdir = str(tmp_path_factory.mktemp('aot') / 'run')
  train = run_train(  # A command's run: a live command resumes a copy.
    '--config=fashion_mnist',
    '--config.num_steps=200',
    f'--workdir={workdir}',
    f'--data_dir={fashion_data_dir}',
  )
  assert train.returncode == 0, train.stderr
  return workdir


@pytest.fixture(scope='module')
def exported(trained):
  """The trained run, exported with its check on the test set.

  Returns (workdir, the export's stdout).
  """
  workdir = trained
  # The first export on a machine builds the runtime: minutes.
  with building_lock():
    export = run_aot(
      f'--workdir={workdir}', f'--runtime_dir={RUNTIME_DIR}', timeout=3600
    )
  assert export.returncode == 0, export.stderr
  return workdir, export.stdout


def python_logits(workdir: str, images: np.ndarray) -> np.ndarray:
  """The run's Keras model, restored from its checkpoint, in this process."""
  from xla_mnist import model
  from xla_mnist.export import trained

  net = model.create_model(**trained.model_recipe(workdir))
  trained.restore_model(net, workdir)
  return net(model.inputs(net, images), training=False).numpy()


def assert_classify_agrees(
  binary: str, workdir: str, tmp_path, folder: str = FASHION_DIR, split=None
) -> np.ndarray:
  """`binary` predicts the class of the run's Python model on every test
  image of `folder` (`split`: its images and labels; by default read from
  it), logits within float rounding, at batch 100 and batch 1; returns the
  Python model's logits."""
  from xla_mnist.datasets import idx_builder

  logits_path = str(tmp_path / 'logits.f32')
  proc = run_classify(binary, f'--logits={logits_path}', folder)
  assert proc.returncode == 0, proc.stderr
  images, labels = split or idx_builder.read_split(folder, 'test')
  expected = python_logits(workdir, images)
  got = np.fromfile(logits_path, np.float32).reshape(expected.shape)
  np.testing.assert_array_equal(got.argmax(1), expected.argmax(1))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
  accuracy = float((expected.argmax(1) == labels).mean())
  assert proc.stdout.startswith(f'test accuracy {accuracy:.4f} ('), proc.stdout
  assert 'us per image (batch 100;' in proc.stdout
  # Batch 1 gives the same classes through the other compiled function.
  one = run_classify(binary, '--batch=1', folder)
  assert one.stdout.splitlines()[0] == proc.stdout.splitlines()[0]
  assert 'us per image (batch 1;' in one.stdout
  return expected


def train_briefly(workdir: str, data_dir: str, *flags: str, steps: int) -> None:
  """A short run, unprofiled, in this process: the export is the subject."""
  train_here(
    *flags,
    f'--config.num_steps={steps}',
    '--config.profile_steps=0',
    f'--workdir={workdir}',
    f'--data_dir={data_dir}',
  )


def export_with_test_runtime(workdir: str, **env: str):
  """The export of `workdir`, with the tests' AOT runtime (built once)."""
  return run_aot(
    f'--workdir={workdir}', f'--runtime_dir={RUNTIME_DIR}', timeout=3600, **env
  )


@pytest.mark.slow
@pytest.mark.parametrize('name', ['mlp', 'cnn'])
def test_each_packaged_model_exports_and_agrees(
  name, tmp_path, fashion_data_dir
):
  """A short run of each packaged model exports that model (the checkpoint
  names it): the export's own check found classify and the Python model in
  agreement on every test image, and batch 1 gives batch 100's classes.
  (test_classify_agrees_with_python_on_every_test_image checks the seed's
  model against Python here, logit by logit.)"""
  workdir = str(tmp_path / name)
  train_briefly(workdir, fashion_data_dir, f'--config={name}', steps=30)
  export = export_with_test_runtime(workdir)
  assert export.returncode == 0, export.stderr
  agree = re.search(
    r'classes agree on 10000/10000, logits differ by at most (\S+)\n',
    export.stdout,
  )
  assert agree and float(agree.group(1)) <= 1e-4, export.stdout
  accuracy = re.search(
    r'test accuracy: classify (\S+), Python model (\S+),', export.stdout
  )
  assert accuracy and accuracy[1] == accuracy[2], export.stdout
  binary = os.path.join(workdir, 'aot', 'classify')
  from xla_mnist.datasets import idx_builder

  images, _ = idx_builder.read_split(FASHION_DIR, 'test')
  some = str(tmp_path / 'some.idx')
  write_idx(some, 2051, images[:100, ..., 0])
  runs = [run_classify(binary, some), run_classify(binary, '--batch=1', some)]
  for proc in runs:
    assert proc.returncode == 0, proc.stderr
  by_100, by_1 = (
    [line for line in proc.stdout.splitlines() if line.startswith('image ')]
    for proc in runs
  )
  assert len(by_100) == 100 and by_1 == by_100


@pytest.mark.slow
def test_a_users_model_exports_or_says_why_not(
  tmp_path, fashion_data_dir, monkeypatch
):
  """A user's factory exports as the packaged models do (built once here,
  twice in training: the weights' names still match); one with an op XLA
  cannot compile is one line, and nothing is left in the workdir."""
  (tmp_path / 'user_models.py').write_text(FACTORIES)
  factories = {'PYTHONPATH': str(tmp_path)}
  importable(monkeypatch, tmp_path)  # For the runs, trained here.
  runs = {}
  for factory, jit in (('small', 'on'), ('stringly', 'off')):
    runs[factory] = workdir = str(tmp_path / factory)
    train_briefly(
      workdir,
      fashion_data_dir,
      '--config=fashion_mnist',
      f'--config.model=user_models:{factory}',
      f'--jit={jit}',
      steps=20,
    )
  export = export_with_test_runtime(runs['small'], **factories)
  assert export.returncode == 0, export.stderr
  assert 'classes agree on 10000/10000' in export.stdout, export.stdout
  before = snapshot(runs['stringly'])
  refused = export_with_test_runtime(runs['stringly'], **factories)
  assert_one_line_error(
    refused, 2, 'cannot compile (AsString)', 'cannot be exported', 'jit=off'
  )
  assert snapshot(runs['stringly']) == before
  # The checkpoint holds the weights, not the factory: it must be importable.
  unknown = run_aot(f'--workdir={runs["small"]}', '--check_dir=')
  assert_one_line_error(
    unknown, 2, 'cannot import user_models', 'PYTHONPATH, as when it trained'
  )


@pytest.mark.slow
def test_classify_agrees_with_python_on_every_test_image(exported, tmp_path):
  workdir, stdout = exported
  assert 'classes agree on 10000/10000' in stdout, stdout
  assert_classify_agrees(
    os.path.join(workdir, 'aot', 'classify'), workdir, tmp_path
  )


@pytest.mark.slow
def test_export_is_a_python_call(trained, tmp_path, capsys):
  """A notebook's export: no flags parsed, its check's figures returned (the
  export ran classify beside the Python model on every test image) and its
  lines on the `xla_mnist` logger."""
  from absl import flags

  from xla_mnist import model
  from xla_mnist.export import classifier
  from xla_mnist.export import trained as checkpoints

  assert not flags.FLAGS.is_parsed()  # A flag read would raise.
  out_dir = str(tmp_path / 'aot')
  net = model.create_model(**checkpoints.model_recipe(trained))
  exported = classifier.export(
    net,
    functools.partial(model.inputs, net),
    trained,
    out_dir=out_dir,
    runtime_dir=RUNTIME_DIR,
  )
  assert exported.binary == os.path.join(out_dir, 'classify')
  assert exported.checkpoint == os.path.join(trained, 'checkpoints', 'ckpt-200')
  check = exported.check
  assert (check.check_dir, check.images, check.agree) == (
    FASHION_DIR,
    10000,
    10000,
  )
  assert check.max_logit_difference <= 1e-4
  assert check.classify_accuracy == pytest.approx(
    check.python_accuracy, abs=1e-4
  )
  with open(os.path.join(trained, 'result.json')) as f:
    assert check.run_accuracy == json.load(f)['test_accuracy']
  said = capsys.readouterr().out
  assert f'checkpoint: {exported.checkpoint}\n' in said, said
  assert '\n'.join(check.lines()) in said


# A notebook's session: it trains with jit on (XLA compiles the loop in its
# process), then exports in that same process.
TRAIN_THEN_EXPORT = """
import functools, json, os, sys
from xla_mnist import model, trainer
from xla_mnist.configs import default
from xla_mnist.export import classifier, trained

idx, workdir, data_dir, runtime_dir = sys.argv[1:]
config = default.get_config()
config.update(
  dataset='fashion_mnist', idx_dir=idx, num_steps=20, batch_size=20,
  steps_per_loop=10, profile_steps=0, jit='on',
)
trainer.train_and_evaluate(config, workdir, data_dir, quiet=True)
flags = os.environ.get('XLA_FLAGS')
net = model.create_model(**trained.model_recipe(workdir))
exported = classifier.export(
  net, functools.partial(model.inputs, net), workdir, check_dir=idx,
  runtime_dir=runtime_dir, quiet=True,
)
assert os.environ.get('XLA_FLAGS') == flags, os.environ.get('XLA_FLAGS')
print(json.dumps([exported.binary, exported.check.agree]))
"""


@pytest.mark.slow
def test_export_after_training_in_the_same_process(idx_folder, tmp_path):
  """XLA reads its flags once per process: an export after an XLA compile
  still gets tfcompile's, and leaves the process's XLA_FLAGS as they were."""
  folder, arrays = idx_folder
  workdir = str(tmp_path / 'run')
  with building_lock():
    proc = subprocess.run(
      [
        sys.executable,
        '-c',
        TRAIN_THEN_EXPORT,
        folder,
        workdir,
        str(tmp_path / 'data'),
        RUNTIME_DIR,
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=3600,
    )
  assert proc.returncode == 0, proc.stderr[-3000:]
  binary, agree = json.loads(proc.stdout.splitlines()[-1])
  assert agree == len(arrays['test'][1])  # classify and Python, every image.
  assert binary == os.path.join(workdir, 'aot', 'classify')
  run = run_classify(binary, folder)
  assert run.returncode == 0, run.stderr
  assert run.stdout.startswith('test accuracy '), run.stdout


@pytest.mark.slow
@pytest.mark.parametrize('name', ['one.idx', 'one.idx.gz'])
def test_classify_one_image_needs_nothing_but_itself(exported, tmp_path, name):
  """What makes one image quick, checked without a clock: no interpreter and
  no model files to load (the weights are constants in the binary), and no
  labels for an image file. A copy of classify, alone with the image in an
  empty folder, classifies it as Python does."""
  from xla_mnist.datasets import idx_builder

  workdir, _ = exported
  binary = str(tmp_path / 'classify')
  shutil.copy(os.path.join(workdir, 'aot', 'classify'), binary)
  images, _ = idx_builder.read_split(FASHION_DIR, 'test')
  write_idx(str(tmp_path / name), 2051, images[:1, ..., 0])
  proc = subprocess.run(
    [binary, name], cwd=tmp_path, capture_output=True, text=True, timeout=60
  )
  assert proc.returncode == 0, proc.stderr
  label = int(python_logits(workdir, images[:1]).argmax())
  assert proc.stdout == f'image 0: class {label}\n'


@pytest.mark.slow
def test_classify_bad_input(exported, tmp_path):
  workdir, _ = exported
  binary = os.path.join(workdir, 'aot', 'classify')
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder, train=10, test=10)
  images = os.path.join(folder, 't10k-images-idx3-ubyte.gz')
  labels = os.path.join(folder, 't10k-labels-idx1-ubyte.gz')
  truncated = str(tmp_path / 'truncated.idx')
  with open(truncated, 'wb') as f:
    f.write(b'\x00\x00\x08\x03\x00\x00\x00\x05\x00\x00\x00\x1c\x00\x00\x00\x1c')
  not_gzip = str(tmp_path / 'broken.gz')
  with open(images, 'rb') as f:
    with open(not_gzip, 'wb') as out:
      out.write(f.read()[:100])
  assert run_classify(binary, folder).returncode == 0
  assert_one_line_error(run_classify(binary), 2, 'usage: classify')
  assert_one_line_error(run_classify(binary, '--bogus', folder), 2, '--bogus')
  assert_one_line_error(run_classify(binary, '/nope'), 1, '/nope does not')
  assert_one_line_error(run_classify(binary, truncated), 1, 'truncated')
  assert_one_line_error(run_classify(binary, labels), 1, 'magic number 2049')
  assert_one_line_error(run_classify(binary, not_gzip), 1, 'cannot be read')
  empty = str(tmp_path / 'empty.idx')
  write_idx(empty, 2051, np.zeros((0, 28, 28), np.uint8))
  assert_one_line_error(run_classify(binary, empty), 1, 'holds no images')
  assert_one_line_error(run_classify(binary, '/dev/null'), 1, 'neither')
  write_idx(labels, 2049, np.zeros(9, np.uint8))
  assert_one_line_error(run_classify(binary, folder), 1, '9 labels')
  os.remove(labels)
  assert_one_line_error(run_classify(binary, folder), 1, 'is missing')


def test_export_bad_input(tmp_path):
  empty = str(tmp_path)
  assert_one_line_error(run_aot(), 2, '--workdir is required')
  assert_one_line_error(run_aot('--workdir=/nope'), 1, 'does not exist')
  bad_cpu = run_aot('--workdir=/nope', '--target_cpu=bogus')
  assert_one_line_error(bad_cpu, 2, '--target_cpu=bogus')
  assert_one_line_error(run_aot(f'--workdir={empty}'), 1, 'train first')
  os.makedirs(os.path.join(empty, 'checkpoints'))
  open(os.path.join(empty, 'checkpoints', 'checkpoint'), 'w').close()
  no_tools = run_aot(f'--workdir={empty}', PATH='/nonexistent')
  assert_one_line_error(no_tools, 1, 'not found', 'make toolchain')


@pytest.mark.slow
def test_export_bad_check_data_leaves_nothing(exported, tmp_path):
  workdir, _ = exported
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder, train=10, test=10)
  labels = os.path.join(folder, 't10k-labels-idx1-ubyte.gz')
  write_idx(labels, 2049, np.full(10, 12, np.uint8))
  out_dir = str(tmp_path / 'out')
  proc = run_aot(
    f'--workdir={workdir}', f'--out_dir={out_dir}', f'--check_dir={folder}'
  )
  assert_one_line_error(proc, 1, 'label 12')
  assert os.listdir(tmp_path) == ['idx']


# Faults of the export's inputs and outputs: each is one line, and the run's
# folder (its checkpoints, an earlier export) is left byte for byte.


def snapshot(folder: str) -> dict[str, bytes]:
  """Every file under `folder` (hidden ones too) and its bytes."""
  found = {}
  for root, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        found[os.path.relpath(path, folder)] = f.read()
  return found


def copy_run(trained: str, tmp_path) -> str:
  workdir = str(tmp_path / 'run')
  shutil.copytree(trained, workdir)
  return workdir


def checkpoint_file(workdir: str, suffix: str) -> str:
  folder = os.path.join(workdir, 'checkpoints')
  (name,) = [n for n in os.listdir(folder) if n.endswith(suffix)]
  return os.path.join(folder, name)


def cut_data(workdir: str) -> None:
  path = checkpoint_file(workdir, '.data-00000-of-00001')
  os.truncate(path, os.path.getsize(path) // 2)


def drop_index(workdir: str) -> None:
  os.remove(checkpoint_file(workdir, '.index'))


def garble_pointer(workdir: str) -> None:
  with open(os.path.join(workdir, 'checkpoints', 'checkpoint'), 'wb') as f:
    f.write(b'model_checkpoint_path: \xff\x00garbage')


def drop_pointer(workdir: str) -> None:
  os.remove(os.path.join(workdir, 'checkpoints', 'checkpoint'))


def other_model(workdir: str) -> None:
  """A checkpoint as Checkpointer writes it, of a model of 5 classes."""
  import tensorflow as tf

  from xla_mnist.configs import default
  from xla_mnist.workdir import checkpointing

  shutil.rmtree(os.path.join(workdir, 'checkpoints'))
  net = tf.keras.Sequential(
    [tf.keras.Input((784,)), tf.keras.layers.Dense(5, name='linear')]
  )
  # Recorded as trained on (Fashion-)MNIST: the export builds its softmax.
  facts = checkpointing.data_facts('x' * 64, (28, 28, 1), 10)
  recipe = checkpointing.fingerprint(net, default.get_config(), 'CPU:0', facts)
  stored = json.dumps(recipe)
  checkpoint = tf.train.Checkpoint(model=net, fingerprint=tf.Variable(stored))
  folder = os.path.join(workdir, 'checkpoints')
  tf.train.CheckpointManager(checkpoint, folder, 1, 'ckpt').save(5)


@pytest.mark.slow
@pytest.mark.parametrize(
  'damage, code, fragments',
  [
    (cut_data, 1, ('cannot be restored', 'checkpoint=ckpt-N')),
    (drop_index, 1, ('cannot be restored', 'checkpoint=ckpt-N')),
    (
      other_model,
      2,
      ('holds a run with model', 'kernel:784x5', 'trained with'),
    ),
  ],
)
def test_export_refuses_a_damaged_checkpoint(
  trained, tmp_path, damage, code, fragments
):
  workdir = copy_run(trained, tmp_path)
  damage(workdir)
  before = snapshot(workdir)
  proc = run_aot(
    f'--workdir={workdir}', f'--runtime_dir={RUNTIME_DIR}', '--check_dir='
  )
  assert_one_line_error(proc, code, *fragments)
  assert snapshot(workdir) == before


@pytest.mark.slow
@pytest.mark.parametrize(
  'damage, by_name', [(garble_pointer, False), (drop_pointer, True)]
)
def test_export_reads_past_a_damaged_pointer(
  trained, tmp_path, damage, by_name
):
  workdir = copy_run(trained, tmp_path)
  damage(workdir)
  before = snapshot(workdir)
  name = os.path.basename(checkpoint_file(workdir, '.index'))[: -len('.index')]
  out_dir = str(tmp_path / 'out')
  proc = run_aot(
    f'--workdir={workdir}',
    *([f'--checkpoint={name}'] if by_name else []),
    f'--out_dir={out_dir}',
    f'--runtime_dir={RUNTIME_DIR}',
    '--check_dir=',
    timeout=3600,
  )
  assert proc.returncode == 0, proc.stderr
  assert f'checkpoint: {workdir}/checkpoints/{name}\n' in proc.stdout
  if not by_name:  # The newest complete one, said so; nothing repaired.
    assert 'the newest complete one' in proc.stdout
  assert snapshot(workdir) == before
  assert os.access(os.path.join(out_dir, 'classify'), os.X_OK)


def test_export_refuses_an_out_dir_it_would_destroy(tmp_path):
  workdir = str(tmp_path / 'run')
  os.makedirs(os.path.join(workdir, 'checkpoints'))
  open(os.path.join(workdir, 'checkpoints', 'checkpoint'), 'w').close()
  a_file = str(tmp_path / 'a_file')
  with open(a_file, 'w') as f:
    f.write('kept')
  other = str(tmp_path / 'other')
  os.makedirs(other)
  with open(os.path.join(other, 'notes.txt'), 'w') as f:
    f.write('kept')
  before = snapshot(str(tmp_path))
  for out_dir, code, fragment in (
    (a_file, 1, 'is a file'),
    (other, 1, 'holds files other than an export'),
    (workdir, 2, 'would replace the training run'),
    (str(tmp_path), 2, 'would replace the training run'),
  ):
    proc = run_aot(
      f'--workdir={workdir}', f'--out_dir={out_dir}', '--check_dir='
    )
    assert_one_line_error(proc, code, fragment)
  assert snapshot(str(tmp_path)) == before


@pytest.mark.slow
def test_export_to_a_read_only_or_full_disk_leaves_nothing(
  trained, tmp_path, small_disk
):
  read_only = small_disk('read_only', 512)
  subprocess.run(['mount', '-o', 'remount,ro', read_only], check=True)
  # Too small for the export: a write fails part-way, in TF's SavedModel
  # (about 100 KiB) or, with room for that, in tfcompile's own process (its
  # files, about 250 KiB).
  full = small_disk('full', 64)
  tfcompile_full = small_disk('tfcompile_full', 160)
  for out_dir, fragments in (
    (read_only, ('Read-only file system', '--out_dir')),
    (full, ('No space left on device', 'free space', '--out_dir')),
    (tfcompile_full, ('tfcompile failed', 'No space left', '--out_dir')),
  ):
    proc = run_aot(
      f'--workdir={trained}',
      f'--out_dir={out_dir}/aot',
      f'--runtime_dir={RUNTIME_DIR}',
      '--check_dir=',
    )
    assert_one_line_error(proc, 1, *fragments)
    assert os.listdir(out_dir) == []


def corrupt_deflate(path: str) -> None:
  """Flips bits inside the compressed stream: zlib's own error, not EOF."""
  with open(path, 'r+b') as f:
    f.seek(30)
    flipped = bytes(b ^ 0x5A for b in f.read(170))
    f.seek(30)
    f.write(flipped)


def truncate_half(path: str) -> None:
  os.truncate(path, os.path.getsize(path) // 2)


def empty_split(path: str) -> None:
  write_idx(path, 2051, np.zeros((0, 28, 28), np.uint8))
  labels = path.replace('images-idx3', 'labels-idx1')
  write_idx(labels, 2049, np.zeros(0, np.uint8))


@pytest.mark.slow
@pytest.mark.parametrize(
  'damage, fragment',
  [
    (truncate_half, 'cannot be read'),
    (empty_split, 'hold no examples'),
    (corrupt_deflate, 'cannot be read'),
  ],
)
def test_export_bad_check_file_leaves_nothing(
  trained, tmp_path, damage, fragment
):
  folder = str(tmp_path / 'idx')
  make_idx_folder(folder, train=10, test=10)
  damage(os.path.join(folder, 't10k-images-idx3-ubyte.gz'))
  out_dir = str(tmp_path / 'out')
  proc = run_aot(
    f'--workdir={trained}',
    f'--out_dir={out_dir}',
    f'--check_dir={folder}',
    f'--runtime_dir={RUNTIME_DIR}',
  )
  assert_one_line_error(proc, 1, fragment)
  assert os.listdir(tmp_path) == ['idx']


KEPT = ('checkpoints', 'aot')  # An earlier export's aot/, or none.


@pytest.mark.slow
def test_export_respects_a_live_runs_lock(trained, fashion_data_dir, tmp_path):
  workdir = copy_run(trained, tmp_path)
  live = start_train(
    '--config=fashion_mnist',
    '--config.num_steps=100000000',
    '--config.checkpoint_every=0',
    '--config.log_every=1000000',
    '--config.profile_steps=0',
    f'--workdir={workdir}',
    f'--data_dir={fashion_data_dir}',
  )
  try:
    # Its first line ("using ..." or "resuming ...") comes with the lock held.
    assert live.stdout.readline(), live.communicate()[1]
    # Stopped, it is still alive and holds the lock, and leaves the export
    # the CPU that its endless training would take.
    live.send_signal(signal.SIGSTOP)
    # What the export may not touch; the live run writes its own files.
    kept = {name: snapshot(os.path.join(workdir, name)) for name in KEPT}
    inside = run_aot(f'--workdir={workdir}', '--check_dir=')
    assert_one_line_error(
      inside, 1, f'(process {live.pid})', 'wait for it to end', '--out_dir'
    )
    out_dir = str(tmp_path / 'out')
    outside = run_aot(
      f'--workdir={workdir}',
      f'--out_dir={out_dir}',
      f'--runtime_dir={RUNTIME_DIR}',
      '--check_dir=',
      timeout=3600,
    )
    assert outside.returncode == 0, outside.stderr
    assert f'in use by another run (process {live.pid})' in outside.stdout
    assert 'not its final one' in outside.stdout
    assert os.path.isfile(os.path.join(out_dir, 'classify'))
    assert {
      name: snapshot(os.path.join(workdir, name)) for name in KEPT
    } == kept
  finally:
    live.send_signal(signal.SIGTERM)
    live.send_signal(signal.SIGCONT)
    live.communicate(timeout=120)


# A run on other images: a folder of 16x16 RGB images in 3 classes.

RGB = (16, 16, 3)


def write_rgb_folder(
  root: str, per_class: dict[str, int]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """`root/<split>/c<label>/<i>.png`, random RGB images whose class is their
  brightest channel; returns each split's images and labels as written."""
  rng = np.random.default_rng(0)
  arrays = {}
  for split, count in per_class.items():
    images, labels = [], []
    for label in range(RGB[-1]):
      folder = os.path.join(root, split, f'c{label}')
      os.makedirs(folder)
      for i in range(count):
        pixels = rng.integers(0, 128, RGB, dtype=np.uint8)
        pixels[..., label] += 120
        with open(os.path.join(folder, f'{i:03d}.png'), 'wb') as f:
          f.write(folders.encode(pixels, 'png'))
        images.append(pixels)
        labels.append(label)
    arrays[split] = (np.stack(images), np.array(labels, np.uint8))
  return arrays


def write_test_folder(folder: str, images: np.ndarray, labels: np.ndarray):
  """A test split as classify reads it: images [N, H, W, C] as 4-dim IDX
  (magic 2052), [N, H, W] as 3-dim (2051)."""
  os.makedirs(folder, exist_ok=True)
  colour = images.ndim == 4
  name = 't10k-images-idx4-ubyte.gz' if colour else IDX_NAMES['test'][0]
  magic = 2052 if colour else 2051
  write_idx(os.path.join(folder, name), magic, images)
  write_idx(os.path.join(folder, 't10k-labels-idx1-ubyte.gz'), 2049, labels)
  return folder


@pytest.fixture(scope='module')
def rgb_run(tmp_path_factory):
  """A 30-step run on a folder of 16x16x3 PNGs in 3 classes (120 test
  images: one batch of 100 and 20 at batch 1), exported by the command,
  whose check loads the run's own test split from --data_dir.

  Returns (workdir, data dir, the folder's arrays, the export's stdout).
  """
  root = tmp_path_factory.mktemp('rgb')
  arrays = write_rgb_folder(str(root / 'images'), {'train': 40, 'test': 40})
  workdir, data_dir = str(root / 'run'), str(root / 'data')
  train_briefly(
    workdir,
    data_dir,
    f'--config.image_dir={root / "images"}',
    '--config.batch_size=20',
    steps=30,
  )
  with building_lock():
    export = run_aot(
      f'--workdir={workdir}',
      f'--data_dir={data_dir}',
      f'--runtime_dir={RUNTIME_DIR}',
      timeout=3600,
    )
  assert export.returncode == 0, export.stderr
  return workdir, data_dir, arrays, export.stdout


@pytest.mark.slow
def test_a_run_on_rgb_images_exports_and_agrees(rgb_run, tmp_path):
  """The export takes the run's shape and classes: its check ran classify
  beside the Python model on the run's own test split, and classify reads
  4-dim IDX files of 16x16x3, logits within float rounding of Python's,
  at batch 100 and batch 1."""
  workdir, _, arrays, stdout = rgb_run
  assert (
    "checked on 120 test images of the run's test split (images in"
  ) in stdout, stdout
  assert 'classes agree on 120/120' in stdout, stdout
  accuracy = re.search(
    r'test accuracy: classify (\S+), Python model (\S+), training run (\S+)',
    stdout,
  )
  assert accuracy and accuracy[1] == accuracy[2] == accuracy[3], stdout
  # The check's IDX files were the check's: the export keeps none.
  assert 'check' not in os.listdir(os.path.join(workdir, 'aot'))
  binary = os.path.join(workdir, 'aot', 'classify')
  images, labels = arrays['test']
  folder = write_test_folder(str(tmp_path / 'idx'), images, labels)
  expected = assert_classify_agrees(
    binary, workdir, tmp_path, folder, (images, labels)
  )
  assert expected.shape == (120, 3)
  # One image, of 4 dims, alone.
  write_idx(str(tmp_path / 'one.idx'), 2052, images[7:8])
  single = run_classify(binary, str(tmp_path / 'one.idx'))
  assert single.stdout == f'image 0: class {expected[7].argmax()}\n'


@pytest.mark.slow
def test_classify_refuses_images_of_another_shape(rgb_run, exported, tmp_path):
  """Each classify reads its model's shape only, and says which in one
  line: the shape a file has, the one it needs and its IDX format."""
  rgb = os.path.join(rgb_run[0], 'aot', 'classify')
  fashion = os.path.join(exported[0], 'aot', 'classify')
  grey = str(tmp_path / 'grey.idx')
  write_idx(grey, 2051, np.zeros((2, 28, 28), np.uint8))
  assert_one_line_error(
    run_classify(rgb, grey),
    1,
    f'{grey} holds images of 28x28x1, classify takes 16x16x3: give it an IDX'
    ' file of magic 2052 with dimensions N, 16, 16, 3',
  )
  big = str(tmp_path / 'big.idx.gz')
  write_idx(big, 2052, np.zeros((2, 32, 32, 3), np.uint8))
  assert_one_line_error(
    run_classify(rgb, big), 1, 'holds images of 32x32x3, classify takes 16x16x3'
  )
  colour = str(tmp_path / 'colour.idx')
  write_idx(colour, 2052, np.zeros((2, *RGB), np.uint8))
  assert_one_line_error(
    run_classify(fashion, colour),
    1,
    f'{colour} holds images of 16x16x3, classify takes 28x28x1: give it an'
    ' IDX file of magic 2051 with dimensions N, 28, 28',
  )
  # Labels are the model's classes; a folder holds the files of its shape.
  folder = write_test_folder(
    str(tmp_path / 'idx'), np.zeros((2, *RGB), np.uint8), np.array([0, 3])
  )
  assert_one_line_error(run_classify(rgb, folder), 1, 'label 3, outside 0..2')
  write_test_folder(folder, np.zeros((2, 28, 28), np.uint8), np.zeros(2))
  os.remove(os.path.join(folder, 't10k-images-idx4-ubyte.gz'))
  assert_one_line_error(
    run_classify(rgb, folder), 1, 't10k-images-idx4-ubyte.gz is missing'
  )


@pytest.mark.slow
def test_an_rgb_runs_check_needs_images_of_its_shape(rgb_run, tmp_path):
  """Without a test split of the run's shape, the export stops before the
  build, in one line naming the fix, and leaves nothing."""
  from xla_mnist import model
  from xla_mnist.export import classifier, trained
  from xla_mnist.runtime import errors

  workdir, data_dir, arrays, _ = rgb_run
  before = snapshot(workdir)
  # A --check_dir of (Fashion-)MNIST's shape, under the 4-dim file's name.
  folder = str(tmp_path / 'idx')
  write_test_folder(folder, np.zeros((2, *RGB), np.uint8), np.zeros(2))
  write_idx(
    os.path.join(folder, 't10k-images-idx4-ubyte.gz'),
    2051,
    np.zeros((2, 28, 28), np.uint8),
  )
  out_dir = str(tmp_path / 'out')
  proc = run_aot(
    f'--workdir={workdir}', f'--out_dir={out_dir}', f'--check_dir={folder}'
  )
  assert_one_line_error(
    proc,
    1,
    'holds images of 28x28x1, the model takes 16x16x3',
    'magic 2052 with dimensions N, 16, 16, 3',
    '--check_dir= to skip',
  )
  # A run whose result.json is gone (unfinished): no test split to load.
  unfinished = str(tmp_path / 'unfinished')
  shutil.copytree(workdir, unfinished, ignore=shutil.ignore_patterns('aot'))
  os.remove(os.path.join(unfinished, 'result.json'))
  proc = run_aot(f'--workdir={unfinished}', f'--data_dir={data_dir}')
  assert_one_line_error(
    proc, 1, 'has no result.json', '--check_dir=DIR holding an IDX file'
  )
  assert not os.path.exists(os.path.join(unfinished, 'aot'))
  # From Python: no default check folder for these images; check_data's
  # shape checked.
  net = model.create_model(**trained.model_recipe(workdir))
  export = functools.partial(
    classifier.export,
    net,
    functools.partial(model.inputs, net),
    workdir,
    out_dir=out_dir,
    runtime_dir=RUNTIME_DIR,
  )
  with pytest.raises(errors.UsageError, match='pass check_data='):
    export()
  grey = classifier.CheckData(np.zeros((2, 28, 28, 1), np.uint8), [0, 1])
  with pytest.raises(errors.UsageError, match='uint8 images of 16x16x3'):
    export(check_data=grey)
  assert sorted(os.listdir(tmp_path)) == ['idx', 'unfinished']
  assert snapshot(workdir) == before


def test_a_check_folder_of_colour_images_reads_as_classify_does(tmp_path):
  """The export's Python side of the check reads what classify reads: 4-dim
  IDX images for more than one channel."""
  from xla_mnist.export import classifier

  images = np.arange(2 * 16 * 16 * 3).astype(np.uint8).reshape(2, *RGB)
  folder = write_test_folder(str(tmp_path), images, np.array([2, 0]))
  read = classifier._read_check_split(folder, RGB, 3)  # noqa: SLF001
  np.testing.assert_array_equal(read[0], images)
  np.testing.assert_array_equal(read[1], [2, 0])
