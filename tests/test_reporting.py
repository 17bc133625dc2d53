"""One voice for a run: the reporter's lines and events, and a run that a
notebook quiets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, event_scalars

from xla_mnist.runtime import console, errors, streams
from xla_mnist.workdir import reporting


def test_a_reporter_with_nothing_to_write_leaves_no_file(tmp_path):
  reporting.Reporter(str(tmp_path)).close()
  assert os.listdir(tmp_path) == []


def test_flushed_events_are_on_disk_before_the_writer_closes(tmp_path):
  logdir = str(tmp_path)
  reporter = reporting.Reporter(logdir)
  reporter.scalars(10, {'train/loss': 1.5})
  reporter.flush()
  # Read while the writer is open, as a run killed here would leave it.
  assert event_scalars(logdir, 'train/loss') == [(10, 1.5)]
  reporter.close()


def test_earlier_runs_events_go_only_when_asked(tmp_path):
  logdir = str(tmp_path)
  with reporting.Reporter(logdir) as old:
    old.scalars(1, {'train/loss': 9.0})
  with reporting.Reporter(logdir) as new:
    new.scalars(1, {'train/loss': 1.0})
    new.flush()
    assert sorted(v for _, v in event_scalars(logdir, 'train/loss')) == [
      1.0,
      9.0,
    ]
    new.discard_earlier_runs()
  assert event_scalars(logdir, 'train/loss') == [(1, 1.0)]


def test_lines_go_to_the_logger_and_quiet_keeps_only_warnings(capsys):
  reporter = reporting.Reporter('')
  with console.lines(quiet=False):
    reporter.progress(5, 10, 0.25, 100.0)
  with console.lines(quiet=True):
    reporter.line('hidden')
    console.LOGGER.warning('shown')
  assert capsys.readouterr().out.splitlines() == [
    'step      5/10  loss 0.2500  100 steps/s',
    'shown',
  ]


# What TensorFlow's libraries print as they load is theirs, not the run's:
# the marker separates the two.
MARKER = '-- the run starts --'
QUIET_RUN = f"""
import sys
from xla_mnist import trainer
from xla_mnist.configs import default

print({MARKER!r}, flush=True)
print({MARKER!r}, file=sys.stderr, flush=True)

config = default.get_config()
config.update(
  dataset='fashion_mnist', idx_dir=sys.argv[1], num_steps=30, batch_size=20,
  log_every=10, profile_steps=5,
)
trainer.train_and_evaluate(config, sys.argv[2], sys.argv[3], quiet=True)
"""


@pytest.mark.slow
def test_a_quiet_run_prints_nothing_and_writes_its_outputs(
  idx_folder, tmp_path
):
  folder, _ = idx_folder
  workdir = str(tmp_path / 'run')
  # As a notebook's kernel runs it, with TF's own C++ log off.
  proc = subprocess.run(
    [sys.executable, '-c', QUIET_RUN, folder, workdir, str(tmp_path / 'd')],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'},
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  out, err = (t.split(MARKER + '\n', 1)[1] for t in (proc.stdout, proc.stderr))
  assert (out, err) == ('', '')
  with open(os.path.join(workdir, 'result.json')) as f:
    assert json.load(f)['steps'] == 30
  assert [s for s, _ in event_scalars(workdir, 'train/loss')] == [10, 20, 30]


@pytest.mark.parametrize(
  'error, named, line',
  [
    (ValueError('bad value\nmore'), False, 'bad value'),
    (ValueError('  \n bad value.\n'), True, 'ValueError: bad value.'),
    (OSError(), False, 'OSError'),
    (
      RuntimeError(
        '{{function_node __wrapped__SaveV2_dtypes_2_device_/job:localhost}}'
        ' /w/ckpt; No space left on device [Op:SaveV2]'
      ),
      False,
      '/w/ckpt; No space left on device [Op:SaveV2]',
    ),
    (KeyError('a}} b'), False, "'a}} b'"),  # Only TF's tag goes.
  ],
)
def test_an_errors_first_line(error, named, line):
  assert errors.first_line(error, named=named) == line


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
