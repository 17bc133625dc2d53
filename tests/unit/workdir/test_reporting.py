"""One voice for a run: the reporter's lines and events."""

from __future__ import annotations

import os

from support.events import event_scalars

from xla_mnist.runtime import console
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
