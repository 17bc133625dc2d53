"""`python -m xla_mnist.aot` and its `classify`: a real run, compiled and run.

XLA's AOT runtime takes minutes to build, so it lives outside the session's
temporary cache: in $XLA_MNIST_AOT_RUNTIME, else ~/.cache/xla_mnist-test.
A machine builds it once for all sessions.
"""

import importlib.metadata
import os
import subprocess
import time

import numpy as np
import pytest
from conftest import (
  FASHION_DIR,
  make_idx_folder,
  run_module,
  run_train,
  write_idx,
)
from test_train import assert_one_line_error

RUNTIME_DIR = os.environ.get('XLA_MNIST_AOT_RUNTIME') or os.path.expanduser(
  '~/.cache/xla_mnist-test/aot-runtime/'
  + importlib.metadata.version('tensorflow')
)


def run_aot(*args: str, timeout: float = 120, **env: str):
  return run_module('xla_mnist.aot', *args, timeout=timeout, **env)


def run_classify(binary: str, *args: str):
  return subprocess.run(
    [binary, *args], capture_output=True, text=True, timeout=60
  )


@pytest.fixture(scope='module')
def exported(tmp_path_factory, fashion_data_dir):
  """A 200-step run on Fashion-MNIST, exported with its check on the test set.

  Returns (workdir, the export's stdout).
  """
  workdir = str(tmp_path_factory.mktemp('aot') / 'run')
  train = run_train(
    '--config=fashion_mnist',
    '--config.num_steps=200',
    f'--workdir={workdir}',
    f'--data_dir={fashion_data_dir}',
  )
  assert train.returncode == 0, train.stderr
  # The first export on a machine builds the runtime: minutes.
  export = run_aot(
    f'--workdir={workdir}', f'--runtime_dir={RUNTIME_DIR}', timeout=3600
  )
  assert export.returncode == 0, export.stderr
  return workdir, export.stdout


def python_logits(workdir: str, images: np.ndarray) -> np.ndarray:
  """The Keras model, restored from the run's checkpoint, in this process."""
  import tensorflow as tf

  from xla_mnist import model

  net = model.create_model()
  path = tf.train.latest_checkpoint(os.path.join(workdir, 'checkpoints'))
  status = tf.train.Checkpoint(model=net).restore(path).expect_partial()
  status.assert_existing_objects_matched()
  return net(model.preprocess(images), training=False).numpy()


@pytest.mark.slow
def test_classify_agrees_with_python_on_every_test_image(exported, tmp_path):
  from xla_mnist import idx_builder

  workdir, stdout = exported
  assert 'classes agree on 10000/10000' in stdout, stdout
  binary = os.path.join(workdir, 'aot', 'classify')
  logits_path = str(tmp_path / 'logits.f32')
  proc = run_classify(binary, f'--logits={logits_path}', FASHION_DIR)
  assert proc.returncode == 0, proc.stderr
  images, labels = idx_builder.read_split(FASHION_DIR, 'test')
  expected = python_logits(workdir, images)
  got = np.fromfile(logits_path, np.float32).reshape(expected.shape)
  np.testing.assert_array_equal(got.argmax(1), expected.argmax(1))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
  accuracy = float((expected.argmax(1) == labels).mean())
  assert proc.stdout.startswith(f'test accuracy {accuracy:.4f} ('), proc.stdout
  assert 'us per image (batch 100;' in proc.stdout
  # Batch 1 gives the same classes through the other compiled function.
  one = run_classify(binary, '--batch=1', FASHION_DIR)
  assert one.stdout.splitlines()[0] == proc.stdout.splitlines()[0]
  assert 'us per image (batch 1;' in one.stdout


@pytest.mark.slow
@pytest.mark.parametrize('name', ['one.idx', 'one.idx.gz'])
def test_classify_one_image_starts_fast(exported, tmp_path, name):
  from xla_mnist import idx_builder

  workdir, _ = exported
  binary = os.path.join(workdir, 'aot', 'classify')
  images, _ = idx_builder.read_split(FASHION_DIR, 'test')
  path = str(tmp_path / name)
  write_idx(path, 2051, images[:1, ..., 0])
  starts = []
  for _ in range(3):  # The best of three: other processes share the CPU.
    start = time.perf_counter()
    proc = run_classify(binary, path)
    starts.append(time.perf_counter() - start)
    assert proc.returncode == 0, proc.stderr
  label = int(python_logits(workdir, images[:1]).argmax())
  assert proc.stdout == f'image 0: class {label}\n'
  assert min(starts) < 0.5, starts


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
