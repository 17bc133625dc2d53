"""Shared fixtures: generated IDX folders, the real Debian data, the CLI."""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from xla_mnist.runtime import layout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_DIR = layout.DEBIAN_FASHION_MNIST
IDX_NAMES = layout.IDX_FILES


def write_idx(path: str, magic: int, array: np.ndarray) -> None:
  """Writes `array` (uint8) as an IDX file, gzipped when `path` ends in .gz."""
  header = struct.pack(f'>i{array.ndim}i', magic, *array.shape)
  payload = header + array.astype(np.uint8).tobytes()
  opener = gzip.open if path.endswith('.gz') else open
  with opener(path, 'wb') as f:
    f.write(payload)


def make_idx_folder(
  folder: str, train: int = 300, test: int = 100, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Writes four small, valid IDX files; returns the arrays written."""
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  arrays = {}
  for split, n in (('train', train), ('test', test)):
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    images_name, labels_name = IDX_NAMES[split]
    write_idx(os.path.join(folder, images_name), 2051, images)
    write_idx(os.path.join(folder, labels_name), 2049, labels)
    arrays[split] = (images, labels)
  return arrays


@pytest.fixture(scope='session', autouse=True)
def xla_cache_home(tmp_path_factory):
  """Points the CLI's default XLA cache away from the user's home.

  One cache for the session, as one user's runs share theirs.
  """
  with pytest.MonkeyPatch.context() as patch:
    home = str(tmp_path_factory.mktemp('cache_home'))
    patch.setenv('XDG_CACHE_HOME', home)
    yield home


@contextlib.contextmanager
def mounted_tmpfs(folder: str, size_kib: int) -> Iterator[str]:
  """A real filesystem of `size_kib` KiB at `folder`: a full disk on demand.

  Needs root (CI is root); elsewhere the test skips, except under CI.
  """
  os.makedirs(folder, exist_ok=True)
  mount = ['mount', '-t', 'tmpfs', '-o', f'size={size_kib}k', 'tmpfs', folder]
  proc = subprocess.run(mount, capture_output=True, text=True)
  if proc.returncode:
    reason = f'cannot mount a tmpfs ({proc.stderr.strip()}): run as root'
    if os.environ.get('CI'):
      pytest.fail(reason)
    pytest.skip(reason)
  try:
    yield folder
  finally:
    subprocess.run(['umount', '-l', folder], check=False)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Callable[[str, int], str]]:
  """Mounts tiny tmpfs folders under `tmp_path`: `small_disk(name, kib)`."""
  with contextlib.ExitStack() as stack:

    def mount(name: str, size_kib: int) -> str:
      return stack.enter_context(mounted_tmpfs(str(tmp_path / name), size_kib))

    yield mount


def fill(folder: str) -> None:
  """Fills the filesystem of `folder` to its last byte."""
  path = os.path.join(folder, 'filler')
  with open(path, 'ab', buffering=0) as f, contextlib.suppress(OSError):
    while True:
      f.write(b'\0' * 4096)
  with open(path, 'ab', buffering=0) as f, contextlib.suppress(OSError):
    while True:
      f.write(b'\0')  # The last partial block, byte by byte.


@pytest.fixture(scope='session', autouse=True)
def library_lines():
  """The library's lines on stdout, as the command lines show them."""
  from xla_mnist.runtime import console

  console.show()


def synthetic_split():
  """256 random images and labels in memory: a `data.Split` for the step."""
  import tensorflow as tf

  from xla_mnist import data

  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (256, 28, 28, 1), dtype=np.uint8)
  return data.Split(tf.constant(images), tf.constant(rng.integers(0, 10, 256)))


@pytest.fixture(scope='session')
def split():
  return synthetic_split()


def event_scalars(logdir: str, tag: str) -> list[tuple[int, float]]:
  """TF2's scalars as TensorBoard reads them (tensors), every one kept."""
  import tensorflow as tf
  from tensorboard.backend.event_processing import event_accumulator

  events = event_accumulator.EventAccumulator(
    logdir, size_guidance={event_accumulator.TENSORS: 0}
  )
  events.Reload()
  return [
    (e.step, float(tf.make_ndarray(e.tensor_proto)))
    for e in events.Tensors(tag)
  ]


@pytest.fixture
def idx_folder(tmp_path):
  folder = str(tmp_path / 'idx')
  return folder, make_idx_folder(folder)


def require_chromium() -> None:
  """Skips without Debian's Chromium, except under CI where that fails."""
  from support import tensorboard_ui

  if reason := tensorboard_ui.browser_missing():
    if os.environ.get('CI'):
      pytest.fail(reason)
    pytest.skip(reason)


def require_fashion_mnist() -> None:
  """Skips without Debian's files, except under CI where that is a failure."""
  if os.path.isfile(os.path.join(FASHION_DIR, IDX_NAMES['train'][0])):
    return
  message = (
    f'Fashion-MNIST is not in {FASHION_DIR}: make test installs it'
    ' (apt-get install dataset-fashion-mnist, as root)'
  )
  if os.environ.get('CI'):
    pytest.fail(message)
  pytest.skip(message)


@pytest.fixture(scope='session')
def fashion_data_dir(tmp_path_factory) -> str:
  """A TFDS data dir with the real Fashion-MNIST prepared once per session."""
  require_fashion_mnist()
  from xla_mnist import data

  data_dir = str(tmp_path_factory.mktemp('tfds'))
  data.load('fashion_mnist', '', data_dir)
  return data_dir


def run_train(*args: str, **kwargs):
  """Runs `python -m xla_mnist.train` as a user would, from the repo root."""
  return run_module('xla_mnist.train', *args, **kwargs)


def start_train(*args: str) -> subprocess.Popen:
  """`python -m xla_mnist.train` in the background, its output unbuffered,
  so that a test can act at a given progress line."""
  return subprocess.Popen(
    [sys.executable, '-m', 'xla_mnist.train', *args],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},
  )


def run_module(
  module: str, *args: str, cwd: str = REPO, timeout: float = 300, **env: str
):
  """Runs `python -m module` with `args` and `env` added to the environment."""
  return subprocess.run(
    [sys.executable, '-m', module, *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=timeout,
    env={**os.environ, **env},
  )


def run_compare(*args: str) -> subprocess.CompletedProcess:
  """Runs `python -m xla_mnist.compare` as a user would, from the repo root."""
  return subprocess.run(
    [sys.executable, '-m', 'xla_mnist.compare', *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )


COMPARE_STEPS = 50
# The fused mode's steps per call: its profiled window (two calls) and the
# sweep's runs hold whole calls, and the profiled runs stay short.
COMPARE_LOOP = 10
COMPARE_SWEEP = (10, 100)  # 100 is the main runs' size: they are reused.
COMPARE_REPEATS = 2  # Timed runs per mode: medians, and their spread.


@pytest.fixture(scope='session')
def compare_workdir(fashion_data_dir, tmp_path_factory) -> str:
  """One compare of every jit mode on Fashion-MNIST, timed, profiled and
  swept, shared by its tests."""
  workdir = str(tmp_path_factory.mktemp('compare'))
  proc = run_compare(
    '--config=fashion_mnist',
    f'--config.num_steps={COMPARE_STEPS}',
    f'--config.steps_per_loop={COMPARE_LOOP}',
    f'--sweep=batch_size={",".join(map(str, COMPARE_SWEEP))}',
    f'--repeats={COMPARE_REPEATS}',
    f'--workdir={workdir}',
    f'--data_dir={fashion_data_dir}',
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  return workdir
