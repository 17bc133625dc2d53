"""Profiles a window of training steps and sums up what ran in it
(docs/profiling.md). A diagnostic: when the profiler fails, training goes
on, after one line that says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import gzip
import logging
import os
import re
from collections.abc import Callable, Iterator

import tensorflow as tf

from xla_mnist.inspection import breakdown
from xla_mnist.runtime import errors, layout
from xla_mnist.workdir import files

LOGGER = logging.getLogger(__name__)
_Paused = Callable[[], contextlib.AbstractContextManager]
TRACE_FILE, BREAKDOWN_FILE = layout.TRACE_FILE, layout.BREAKDOWN_FILE
TOP_OPS = 5
WHY_KERNELS = 3  # Printed with the TF ops each was made of.
# XLA's fusions: `add_reduce_fusion`, `fusion.3`, one op's `wrapped_<op>`.
_FUSION_NAME = re.compile(r'^wrapped_|fusion(\.\d+)?$')


@dataclasses.dataclass(frozen=True)
class ProfileSummary:
  """The traced window's figures, all per training step (`breakdown`)."""

  xplane_path: str  # The capture, for TensorBoard's Profile tab.
  trace_path: str  # The same as a gzipped Chrome trace.
  breakdown_path: str  # The whole `breakdown.Breakdown`, as JSON.
  steps: int  # Training steps run by the traced calls.
  mean_step_ms: float  # A call of K steps counts K.
  kernel_ms: float  # Inside kernels: TF ops, XLA's thunks and fusions.
  host_ms: float  # Outside them: Python, dispatch, waits.
  launches_per_step: float
  top_ops: list[tuple[str, float]]  # (kernel, self time ms), top first.
  fusions: int  # XLA fusions executed per step; 0 without XLA.
  why: list[str]  # The top kernels and the TF ops each was made of.
  # The figures above in words, as the run's line and report.md give them.
  said: str
  input_ms: float | None = None  # Waiting for tf.data; None: no pipeline.
  input_busy_ms: float | None = None  # tf.data's threads at work meanwhile.

  @classmethod
  def of(cls, step: breakdown.Breakdown, *paths: str) -> ProfileSummary:
    """`paths`: the capture, trace and breakdown files."""
    fusions = sum(
      k.runs_per_step
      for k in step.kernels
      if k.kind == 'xla'
      and (k.opcode == 'fusion' or _FUSION_NAME.search(k.name))
    )
    fed = step.input_ms is not None  # Both figures, or neither.
    waits = f' + input {step.input_ms:.3f}' if fed else ''
    busy = f' (tf.data busy {step.input_busy_ms:.3f} alongside)' if fed else ''
    return cls(
      *paths,
      said=f'{step.steps} steps, {step.step_ms:.3f} ms/step = kernels'
      f' {step.kernel_ms:.3f} + host {step.host_ms:.3f}{waits}{busy},'
      f' {step.launches_per_step:g} launches, {round(fusions)} XLA'
      ' fusions/step',
      steps=step.steps,
      mean_step_ms=step.step_ms,
      kernel_ms=step.kernel_ms,
      host_ms=step.host_ms,
      launches_per_step=step.launches_per_step,
      top_ops=[(k.name, k.ms_per_step) for k in step.kernels[:TOP_OPS]],
      fusions=round(fusions),
      why=[
        f'  {k.name} = {_made_of(k)}: {k.ms_per_step * 1e3:.1f} µs'
        for k in step.kernels[:WHY_KERNELS]
      ],
      input_ms=step.input_ms,
      input_busy_ms=step.input_busy_ms,
    )

  def lines(self) -> list[str]:
    return [
      f'profile: {self.said}',
      *self.why,
      f'  trace {self.trace_path} (chrome://tracing, ui.perfetto.dev)',
      f'  capture {self.xplane_path} (TensorBoard, Profile tab)',
    ]


def _made_of(k: breakdown.Kernel) -> str:
  ops = k.made_of()
  if ops is None:
    return 'ops unknown (the capture lacks its HLO)'
  return ' + '.join(ops) or 'no framework op'


class Profiler:
  """Traces the training calls that run any of steps `first_step..last_step`
  (1-based, inclusive; none if first > last), each whole. The loop wraps
  every call in `around`, with its clock: starting and stopping the profiler
  is paused time. `markers` marks every call, for a profiler server."""

  def __init__(
    self, workdir: str, first_step: int, last_step: int, markers: bool = False
  ):
    self._workdir, self._markers = workdir, markers
    self._first, self._last = first_step, last_step
    self._enabled = first_step <= last_step
    self._running = False
    self._before: dict[str, int] = {}  # Captures already in the workdir.
    self._calls: dict[int, int] = {}  # Last step of a traced call -> steps.
    self._xplane: str | None = None

  @classmethod
  def last_steps(
    cls, workdir: str, count: int, start: int, end: int, markers: bool
  ) -> Profiler:
    """The last `count` steps of `start..end`, as TF1 traced its last one;
    never the first call, which compiles. No workdir (a worker that writes
    no outputs) traces nothing."""
    first = max(end - count + 1, start + 2) if workdir else end + 1
    return cls(workdir, first, end, markers)

  def covers(self, first: int, last: int) -> bool:
    """Whether a call running steps `first..last` is to be traced."""
    return self._enabled and first <= self._last and last >= self._first

  @contextlib.contextmanager
  def around(self, first: int, last: int, paused: _Paused) -> Iterator[bool]:
    """Wraps one training call; yields whether the caller must wait for its
    result inside (the marker must span the work)."""
    if self.covers(first, last) and not self._running:
      with paused():
        self._start()
    if not self._running:
      with _marker(last) if self._markers else contextlib.nullcontext():
        yield self._markers
      return
    try:
      with _marker(last):
        yield True
    except BaseException:
      self._stop()  # Training failed: keep what was captured.
      raise
    self._calls[last] = last - first + 1
    if last >= self._last:
      with paused():
        self._stop()

  def summarize(self, graph: tf.Graph | None = None) -> ProfileSummary | None:
    """Writes `trace.json.gz` and `breakdown.json`, and sums up the capture
    (None without one); `graph`, the step's, sizes its TF ops' outputs."""
    if self._running:  # Training ended inside the window.
      self._stop()
    if self._xplane is None:
      return None
    try:
      # Converted once, for both; a non-UTF-8 workdir through its descriptor.
      trace = breakdown.chrome_trace(files.tf_path(self._xplane, 'workdir'))
      trace_path = os.path.join(self._workdir, TRACE_FILE)
      # Level 1: a tenth of the default level's time, for 1.5x its ~0.1 MB.
      packed = gzip.compress(trace.encode(), compresslevel=1)
      files.write_atomically(trace_path, packed)
      step = breakdown.from_capture(self._xplane, self._calls, graph, trace)
      path = os.path.join(self._workdir, BREAKDOWN_FILE)
      files.write_atomically(path, step.to_json() + '\n')
      return ProfileSummary.of(step, self._xplane, trace_path, path)
    except Exception as e:  # noqa: BLE001 - a report must not end the run.
      LOGGER.warning(f'profile summary failed: {_reason(e)}')
      return None

  def _start(self) -> None:
    self._before = self._captures()
    try:
      tf.profiler.experimental.start(files.tf_path(self._workdir, 'workdir'))
      self._running = True
    except Exception as e:  # noqa: BLE001 - any failure ends profiling only.
      self._fail(e)

  def _stop(self) -> None:
    self._running = self._enabled = False
    try:
      tf.profiler.experimental.stop()
      new = [p for p, t in self._captures().items() if self._before.get(p) != t]
      if not new:
        raise FileNotFoundError(
          f'the profiler wrote no capture under {self._workdir}'
        )
      self._xplane = max(new)
    except Exception as e:  # noqa: BLE001 - any failure ends profiling only.
      self._fail(e)

  def _fail(self, error: Exception) -> None:
    LOGGER.warning(f'profiling failed: {_reason(error)}; training goes on')
    self._running = self._enabled = False

  def _captures(self) -> dict[str, int]:
    """Capture files -> mtime, to find the one a run wrote."""
    pattern = os.path.join(glob.escape(self._workdir), layout.CAPTURE_PATTERN)
    return {p: os.stat(p).st_mtime_ns for p in glob.glob(pattern)}


def _marker(last: int) -> tf.profiler.experimental.Trace:
  """The step marker of a call ending at step `last`, for the Profile tab."""
  return tf.profiler.experimental.Trace('train', step_num=last, _r=1)


def _reason(error: Exception) -> str:
  """A failure in a warning's parentheses: no full stop of its own."""
  return errors.first_line(error, named=True).rstrip('.')
