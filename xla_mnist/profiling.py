"""Profiles a window of training steps and sums up what ran in it.

TensorFlow's profiler writes the capture TensorBoard's Profile tab reads,
`<workdir>/plugins/profile/<time>/<host>.xplane.pb`. xprof converts it to a
Chrome trace, `<workdir>/trace.json.gz`, and the printed summary is computed
from that trace, so its figures are the ones a trace viewer shows.

Profiling is a diagnostic: when the profiler fails, training goes on without
it, after one line that says why.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import gzip
import json
import logging
import os
import re
import sys
from collections.abc import Iterator

import tensorflow as tf
from xprof.convert import raw_to_tool_data

from xla_mnist import env, files, loop

LOGGER = logging.getLogger(__name__)
TRACE_FILE = 'trace.json.gz'
TOP_OPS = 5
# XLA names a fusion after its fused ops (`add_reduce_fusion`, `fusion.3`) or,
# when it wraps a single op, `wrapped_<op>`.
_FUSION_NAME = re.compile(r'^wrapped_|fusion(\.\d+)?$')


@dataclasses.dataclass(frozen=True)
class ProfileSummary:
  """The traced window's figures, all per training step."""

  xplane_path: str  # The capture, for TensorBoard's Profile tab.
  trace_path: str  # The same as a gzipped Chrome trace.
  steps: int  # Training steps run by the traced calls.
  mean_step_ms: float  # A call of K steps counts K.
  top_ops: list[tuple[str, float]]  # (op, self time ms per step), top first.
  fusions: int  # XLA fusions executed per step; 0 without XLA.

  def lines(self) -> list[str]:
    ops = ', '.join(f'{name} {ms:.3f}' for name, ms in self.top_ops)
    return [
      f'profile: {self.steps} steps, {self.mean_step_ms:.3f} ms/step,'
      f' {self.fusions} XLA fusions/step',
      f'  top ops by self time (ms/step): {ops}',
      f'  trace {self.trace_path} (chrome://tracing, ui.perfetto.dev)',
      f'  capture {self.xplane_path} (TensorBoard, Profile tab)',
    ]


class Profiler:
  """Traces the training calls that run steps `first_step..last_step`.

  Steps are 1-based and inclusive; `first_step > last_step` disables it. A
  call that runs several steps is traced whole when any of them is in the
  window. A window that holds step 1 times XLA's compile too. The loop calls
  `around` for every call, with its clock: starting and stopping the
  profiler is paused time on it. With `markers`, every other call is marked
  as a step too, for the captures a profiler server takes: without markers,
  their step time is unknown.
  """

  def __init__(
    self,
    workdir: str,
    first_step: int,
    last_step: int,
    markers: bool = False,
  ):
    self._markers = markers
    self._workdir = workdir
    self._first, self._last = first_step, last_step
    self._enabled = first_step <= last_step
    self._running = False
    self._before: dict[str, int] = {}  # Captures already in the workdir.
    self._calls: dict[int, int] = {}  # Last step of a traced call -> steps.
    self._xplane: str | None = None

  def covers(self, first: int, last: int) -> bool:
    """Whether a call running steps `first..last` is to be traced."""
    return self._enabled and first <= self._last and last >= self._first

  @contextlib.contextmanager
  def around(self, first: int, last: int, clock: loop.Clock) -> Iterator[bool]:
    """Wraps one training call; yields whether the caller must wait for its
    result inside (the marker must span the work)."""
    if self.covers(first, last) and not self._running:
      with clock.paused():
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
      with clock.paused():
        self._stop()

  def summarize(self) -> ProfileSummary | None:
    """Writes `trace.json.gz` and sums up the capture; None without one."""
    if self._running:  # Training ended inside the window.
      self._stop()
    if self._xplane is None:
      return None
    try:
      with _quiet_stderr():  # xprof logs a harmless error on every call.
        trace, _ = raw_to_tool_data.xspace_to_tool_data(
          [self._xplane], 'trace_viewer', {}
        )
      if not trace:
        raise ValueError(f'xprof could not convert {self._xplane}')
      trace_path = os.path.join(self._workdir, TRACE_FILE)
      files.write_atomically(trace_path, gzip.compress(trace.encode()))
      events = json.loads(trace)['traceEvents']
      return _summarize_events(events, self._calls, self._xplane, trace_path)
    except Exception as e:  # noqa: BLE001 - a report must not end the run.
      LOGGER.warning(f'profile summary failed: {_reason(e)}')
      return None

  def _start(self) -> None:
    self._before = self._captures()
    try:
      tf.profiler.experimental.start(self._workdir)
    except Exception as e:  # noqa: BLE001 - any failure ends profiling only.
      self._fail(e)
      return
    self._running = True

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
    """Capture files in the workdir -> mtime, to find the one a run wrote."""
    pattern = os.path.join(
      glob.escape(self._workdir), 'plugins', 'profile', '*', '*.xplane.pb'
    )
    return {p: os.stat(p).st_mtime_ns for p in glob.glob(pattern)}


def _marker(last: int) -> tf.profiler.experimental.Trace:
  """The step marker of a call ending at step `last`, for the Profile tab."""
  return tf.profiler.experimental.Trace('train', step_num=last, _r=1)


def start_server(port: int) -> None:
  """Starts TF's profiler server: on-demand captures of this process.

  TensorBoard's Profile tab (Capture profile, `localhost:<port>`) or
  `tf.profiler.experimental.client.trace('grpc://localhost:<port>', ...)`
  then profiles the run while it trains. It serves until the process ends,
  so a later run in the same process (a notebook's) reuses it. Raises
  UserError when the port is taken: TF's server would only log that.
  """
  if port in _serving:
    return
  env.check_port_free(port)
  tf.profiler.experimental.server.start(port)
  _serving.add(port)
  LOGGER.info(
    f"profiler server on port {port}: capture with TensorBoard's Profile tab"
    f' (Capture profile, localhost:{port})'
  )


_serving: set[int] = set()  # Ports this process's profiler server is on.


def _summarize_events(
  events: list[dict],
  calls: dict[int, int],
  xplane_path: str,
  trace_path: str,
) -> ProfileSummary:
  """Sums up Chrome-trace `events` over the traced calls' step markers.

  `calls` maps the last step of each traced call to the steps it ran. An op
  belongs to a call when the profiler grouped it under the call's marker
  (`group_id`); ops are XLA's executed HLO instructions (`hlo_op`) and TF's
  kernels (`long_name` "node:Type"). Self time excludes nested ops, so a
  kernel that runs XLA code (`_XlaRun`, or `__inference_<fn>_<n>` for a
  `jit_compile` function) keeps only its launch overhead.
  """
  spans = [{'args': {}, **e} for e in events if e.get('ph') == 'X']
  markers = [
    e
    for e in spans
    if 'step_num' in e['args'] and int(e['args']['step_num']) in calls
  ]
  steps = sum(calls[n] for n in {int(e['args']['step_num']) for e in markers})
  if not steps:
    raise ValueError('the trace holds no training step markers')
  groups = {e['args']['group_id'] for e in markers if 'group_id' in e['args']}
  ops = [
    e
    for e in spans
    if e['args'].get('group_id') in groups
    and ('hlo_op' in e['args'] or ':' in e['args'].get('long_name', ''))
  ]
  self_us = _self_times(ops)
  fusions = sum(
    'hlo_op' in e['args'] and bool(_FUSION_NAME.search(e['name'])) for e in ops
  )
  return ProfileSummary(
    xplane_path=xplane_path,
    trace_path=trace_path,
    steps=steps,
    mean_step_ms=sum(e['dur'] for e in markers) / 1e3 / steps,
    top_ops=[
      (name, us / 1e3 / steps) for name, us in self_us.most_common(TOP_OPS)
    ],
    fusions=round(fusions / steps),
  )


def _self_times(ops: list[dict]) -> collections.Counter[str]:
  """Op name -> summed duration minus that of ops nested in it, in µs."""
  by_thread = collections.defaultdict(list)
  for e in ops:
    by_thread[e['pid'], e['tid']].append(e)
  totals = collections.Counter()
  for thread in by_thread.values():
    thread.sort(key=lambda e: (e['ts'], -e['dur']))
    stack: list[dict] = []
    for e in thread:
      while stack and e['ts'] >= stack[-1]['ts'] + stack[-1]['dur']:
        stack.pop()
      totals[e['name']] += e['dur']
      if stack:
        totals[stack[-1]['name']] -= e['dur']
      stack.append(e)
  return totals


def _reason(error: Exception) -> str:
  lines = str(error).strip().splitlines()
  message = lines[0].rstrip('.') if lines else ''
  name = type(error).__name__
  return f'{name}: {message}' if message else name


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
  """Sends file descriptor 2, where C++ libraries log, to /dev/null."""
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  os.close(devnull)
  try:
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
