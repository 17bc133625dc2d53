"""What a profile capture (xplane) holds, and its Chrome trace built by hand."""

from __future__ import annotations

import json
import re

# A TF kernel's event in the xplane: `node:Type`.
_TF_KERNEL = re.compile(r'^[^\s:]+:[A-Za-z_]\w*$')


def tf_kernels_in_xplane(path: str) -> int:
  """TF kernel events inside the step markers, read from the raw XSpace
  with TF's proto, apart from xprof's conversion that breakdown reads."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2

  with open(path, 'rb') as f:
    space = xplane_pb2.XSpace.FromString(f.read())
  spans, kernels = [], []
  for plane in space.planes:
    stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
    for line in plane.lines:
      for e in line.events:
        metadata = plane.event_metadata[e.metadata_id]
        start = line.timestamp_ns * 1000 + e.offset_ps
        span = (start, start + e.duration_ps)
        stats = {stat_names.get(s.metadata_id) for s in e.stats}
        if metadata.name == 'train' and 'step_num' in stats:
          spans.append(span)
        elif _TF_KERNEL.match(metadata.name):
          kernels.append(span)
  return sum(any(a <= s and e <= b for a, b in spans) for s, e in kernels)


def event(name: str, start: float, end: float, **args: str) -> dict:
  """A complete event of xprof's Chrome trace, from `start` to `end` µs."""
  return {
    'ph': 'X',
    'name': name,
    'ts': start,
    'dur': end - start,
    'args': args,
  }


def chrome_trace(threads: dict[str, list[dict]]) -> str:
  """xprof's Chrome trace of one host process whose threads, by name, ran
  these `event`s: the layout `breakdown` reads, small enough to reason about."""
  events: list[dict] = [
    {'ph': 'M', 'name': 'process_name', 'pid': 1, 'args': {'name': '/host:CPU'}}
  ]
  for tid, (name, ran) in enumerate(threads.items(), 1):
    meta = {'ph': 'M', 'name': 'thread_name', 'pid': 1, 'tid': tid}
    events += [{**meta, 'args': {'name': name}}]
    events += [{**e, 'pid': 1, 'tid': tid} for e in ran]
  return json.dumps({'traceEvents': events})
