"""Shared fixtures: generated IDX folders, the real Debian data, a full disk,
the session's XLA cache and one compare run. Helpers live in support/."""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Callable, Iterator

import pytest
from support.cli import run_compare
from support.compare import (
  COMPARE_LOOP,
  COMPARE_REPEATS,
  COMPARE_STEPS,
  COMPARE_SWEEP,
)
from support.disk import mounted_tmpfs
from support.idx import make_idx_folder, require_fashion_mnist
from support.shared import built_once


def pytest_configure(config) -> None:
  """The signal tests send SIGINT to the commands they start, which inherit
  an ignored SIGINT: restore it where a shell started the suite in the
  background (`make test &` ignores SIGINT), or they would train through."""
  if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items) -> None:
  """Files go out to the workers in this order: whole in the main pass (the
  Makefile's `--dist=loadfile --no-loadscope-reorder`), test by test in the
  kernels pass. First the file whose test builds the shared compare run
  (`compare_workdir`, a minute and more on one core), so that the other
  worker trains meanwhile rather than waiting for it later; then the files
  with a test marked `early`, whose many trainings in the worker's own
  process would otherwise end the run on one worker while the other idles;
  the rest as collected."""
  builder = next(
    (item.path for item in items if 'compare_workdir' in item.fixturenames),
    None,
  )
  early = {item.path for item in items if item.get_closest_marker('early')}
  # Stable: within each rank, as collected.
  items.sort(key=lambda item: (item.path != builder, item.path not in early))


@pytest.fixture(scope='session', autouse=True)
def session_tmpdir(tmp_path_factory) -> Iterator[str]:
  """The temp folder of this process and the processes it starts, inside
  pytest's own: what the suite leaves there (TFDS's empty folder for a data
  dir with nothing prepared, AutoGraph's sources, the scratch folder of a
  worker a test kills) goes when pytest drops its old runs, not into /tmp."""
  with pytest.MonkeyPatch.context() as patch:
    folder = str(tmp_path_factory.mktemp('tmp'))
    patch.setenv('TMPDIR', folder)
    patch.setattr(tempfile, 'tempdir', folder)
    yield folder


@pytest.fixture(scope='session', autouse=True)
def xla_cache_home(tmp_path_factory):
  """Points the CLI's default XLA cache away from the user's home.

  One cache for the session, as one user's runs share theirs.
  """
  with pytest.MonkeyPatch.context() as patch:
    home = str(tmp_path_factory.mktemp('cache_home'))
    patch.setenv('XDG_CACHE_HOME', home)
    yield home


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Callable[[str, int], str]]:
  """Mounts tiny tmpfs folders under `tmp_path`: `small_disk(name, kib)`."""
  with contextlib.ExitStack() as stack:

    def mount(name: str, size_kib: int) -> str:
      return stack.enter_context(mounted_tmpfs(str(tmp_path / name), size_kib))

    yield mount


@pytest.fixture(scope='session', autouse=True)
def library_lines():
  """The library's lines on stdout, as the command lines show them."""
  from xla_mnist.runtime import console

  console.show()


@pytest.fixture(scope='session')
def split():
  from support.steps import synthetic_split  # Imports TF: when asked.

  return synthetic_split()


@pytest.fixture
def idx_folder(tmp_path):
  folder = str(tmp_path / 'idx')
  return folder, make_idx_folder(folder)


@pytest.fixture(scope='session')
def fashion_data_dir(tmp_path_factory) -> str:
  """A TFDS data dir with the real Fashion-MNIST prepared once per session."""
  require_fashion_mnist()

  def prepare(data_dir: str) -> None:
    from xla_mnist import data

    data.load('fashion_mnist', '', data_dir)

  return built_once(tmp_path_factory, 'tfds', prepare)


@pytest.fixture(scope='session')
def compare_workdir(fashion_data_dir, tmp_path_factory) -> str:
  """One compare of every jit mode on Fashion-MNIST, timed, profiled and
  swept, shared by its tests."""

  def compare(workdir: str) -> None:
    proc = run_compare(
      '--config=fashion_mnist',
      f'--config.num_steps={COMPARE_STEPS}',
      f'--config.steps_per_loop={COMPARE_LOOP}',
      f'--sweep=batch_size={",".join(map(str, COMPARE_SWEEP))}',
      f'--repeats={COMPARE_REPEATS}',
      '--nofit',  # Keras's fit: the model sweep's test (test_compare.py).
      f'--workdir={workdir}',
      f'--data_dir={fashion_data_dir}',
    )
    assert proc.returncode == 0, proc.stderr[-2000:]

  return built_once(tmp_path_factory, 'compare', compare)
