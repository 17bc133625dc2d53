"""One voice for a run: its lines (`runtime.console`), and its TensorBoard
events in the one writer the reporter opens and closes, no ambient default."""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator

import tensorflow as tf
from tensorboard.plugins.hparams import api as hp

from xla_mnist.runtime import console, errors, layout
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files


class Reporter:
  """The run's lines, and its events in `logdir` ('' for none). A context
  manager, so that the writer closes on every way out; it opens at the first
  event, so that a run with nothing to write leaves no file."""

  def __init__(self, logdir: str):
    self._logdir = logdir
    self._writer: tf.summary.SummaryWriter | None = None
    pattern = os.path.join(glob.escape(logdir), layout.EVENTS_PREFIX + '*')
    self._earlier = sorted(glob.glob(pattern)) if logdir else []

  def __enter__(self) -> Reporter:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()

  def line(self, *texts: str) -> None:  # Each text a line of its own.
    console.say(*texts)

  def progress(self, step: int, end: int, loss: float, rate: float) -> None:
    self.line(f'step {step:>6}/{end}  loss {loss:.4f}  {rate:,.0f} steps/s')
    self.scalars(step, {'train/loss': loss, 'perf/steps_per_second': rate})

  def scalars(self, step: int, values: dict[str, float]) -> None:
    with self._events(step):
      for tag, value in values.items():
        tf.summary.scalar(tag, value)

  def text(self, step: int, tag: str, text: str) -> None:
    with self._events(step):
      tf.summary.text(tag, text)

  def hparams(self, step: int, values: dict[str, str | int | float]) -> None:
    """No experiment summary: TensorBoard's HParams tab builds one from all
    the runs, the differing hyperparameters first, every scalar a metric."""
    with self._events(step):
      hp.hparams(values)

  def graph(self, graph: tf.Graph) -> None:
    with self._events(0):
      tf.summary.graph(graph)

  def discard_earlier_runs(self) -> None:
    """Deletes earlier runs' event files: TensorBoard draws every file of a
    run's folder, and old scalars would cross the new at the same steps."""
    for path in self._earlier:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    self._earlier = []

  @contextlib.contextmanager
  def _events(self, step: int) -> Iterator[None]:
    """The writer as TF's default at `step`; nothing without a logdir."""
    if not self._logdir:
      yield
      return
    with self._writing():
      if self._writer is None:
        logdir = files.tf_path(self._logdir, 'workdir')
        self._writer = tf.summary.create_file_writer(logdir)
      with self._writer.as_default(step=step):
        yield

  @contextlib.contextmanager
  def _writing(self) -> Iterator[None]:
    """A failed write of the events (a full disk) as one line to act on."""
    try:
      yield
    except tf.errors.OpError as e:
      reason = errors.first_line(e).rpartition('; ')[2]
      raise UserError(
        f'cannot write the TensorBoard events into {self._logdir} ({reason}):'
        ' free space there and run the same command again, or pass another'
        f' {errors.arg("workdir", "DIR")}'
      ) from None

  def flush(self) -> None:
    """Writes the events so far (before a checkpoint: all of its steps)."""
    if self._writer is not None:
      with self._writing():
        self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      writer, self._writer = self._writer, None
      with self._writing():
        writer.close()
