"""Why XLA helps: one training step split into kernel time and host time.

Read from a profiler capture (`<host>.xplane.pb`; TF's and JAX's profilers
write the same format), so TF's jit modes and JAX's run side by side. Where
each figure comes from:

- step_ms: the step markers (TF's `Trace('train', step_num=N)`, JAX's
  `StepTraceAnnotation`) in xprof's `trace_viewer` conversion (the Chrome
  trace a profiled run keeps), over the steps each marked call ran
  (`steps_by_marker`).
- kernels: the events xprof groups under those markers (`group_id`): XLA's
  thunks (`hlo_op`) and TF's kernels (`long_name` "node:Type"), each at its
  self time (nested kernels taken out, so a while loop keeps its control
  only). A TF kernel that runs an XLA program (`_XlaRun`, `_XlaCompile`, a
  `jit_compile` function's kernel) is dispatch, so its self time is host.
- kernel_ms: the kernels' self times summed; host_ms: the marked time in
  which no kernel runs on any thread (Python, TF's executor, waits). They add
  up to step_ms, or exceed it by the time kernels ran in parallel.
- launches_per_step: kernel events per step (see the caveat below).
- ops of an XLA kernel: the `op_name` metadata of its instruction and of
  every instruction it calls, from the optimized HloProto that XLA stores for
  each module it ran in the capture's `/host:metadata` plane. A TF kernel is
  its own node.
- temp_bytes: the buffer assignment's temporary allocations (neither
  parameter, constant, output nor thread-local) of the XLA modules the step
  ran, in that HloProto. written_bytes: the outputs the step's kernels write:
  XLA instructions' shapes, and TF nodes' output shapes from the step's
  `graph`. A CPU capture records no allocations: xprof's memory_profile is
  empty there, as are hlo_stats and op_profile (xprof 2.24), and
  framework_op_stats lists TF ops only, an XLA program as one op. xprof's
  Python side reads no HloProto from a capture (its graph_viewer reads files
  its server extracts first): the XSpace and the HLO are parsed with the
  protobuf classes TF generates.

TF's executor traces its cheap kernels (ReadVariableOp, Assert, small Sums)
in some steps and not in others, whatever the host_tracer_level, so TF's
launches per step are those the trace shows, a lower bound.

On GPU and TPU the kernels would be the device planes' events (`/device:*`
processes, their `Stream` / `XLA Ops` lines) and every host event host time;
that path follows xprof's trace layout but was never run: this project was
measured on CPU only.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import glob
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from xla_mnist.runtime import errors, layout, streams
from xla_mnist.runtime.errors import DataError

# TF's dispatchers of XLA programs: their own time is launch overhead.
_XLA_LAUNCHERS = frozenset(('_XlaCompile', '_XlaRun', '_XlaMerge'))
_NO_OP = frozenset(('', 'XLA_Args', 'XLA_Retvals'))  # Metadata naming no op.
_DEVICE_LINES = ('Stream', 'XLA Ops')  # A device's kernel lines in xprof.


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str  # XLA instruction (`fusion.3`, `MatMul.4`) or TF node name.
  kind: str  # 'xla' (a thunk) or 'tf' (a TF kernel).
  opcode: str  # HLO opcode, or the TF op type.
  ms_per_step: float  # Self time.
  runs_per_step: float
  # Names of the framework ops it was made of, and their types; None when
  # the capture lacks the module's HLO.
  ops: tuple[str, ...] | None
  op_types: tuple[str, ...] | None

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any]) -> Kernel:
    """A Kernel back from JSON, whose lists were its tuples."""
    ops, types = fields['ops'], fields['op_types']
    return cls(
      **{
        **fields,
        'ops': None if ops is None else tuple(ops),
        'op_types': None if types is None else tuple(types),
      }
    )


@dataclasses.dataclass(frozen=True)
class Breakdown:
  """The marked steps of one capture, every figure per step."""

  steps: int
  step_ms: float
  kernel_ms: float
  host_ms: float
  launches_per_step: float
  temp_bytes: int | None  # XLA's temporaries, 0 without; None: no HLO.
  written_bytes: int | None  # None: TF kernels ran and no graph was given.
  kernels: list[Kernel]  # Longest first.

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2)

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any]) -> Breakdown:
    """A Breakdown back from `dataclasses.asdict` (or its JSON, loaded)."""
    kernels = [Kernel.from_dict(k) for k in fields['kernels']]
    return cls(**{**fields, 'kernels': kernels})

  @classmethod
  def load(cls, path: str) -> Breakdown:
    """The `breakdown.json` a profiled run wrote (`to_json`)."""
    with open(path) as f:
      return cls.from_dict(json.load(f))


def _marked(
  events: list[dict], steps_by_marker: Mapping[int, int] | int
) -> tuple[list[dict], int]:
  """The step markers of the traced calls, and the steps they ran."""
  markers = [e for e in events if 'step_num' in e['args']]
  if isinstance(steps_by_marker, int):
    steps_by_marker = dict.fromkeys(
      (int(e['args']['step_num']) for e in markers), steps_by_marker
    )
  markers = [
    e for e in markers if int(e['args']['step_num']) in steps_by_marker
  ]
  steps = sum(steps_by_marker[int(e['args']['step_num'])] for e in markers)
  return markers, steps


def from_capture(
  xplane_path: str,
  steps_by_marker: Mapping[int, int] | int,
  graph: Any = None,
  trace: str | None = None,
) -> Breakdown:
  """The breakdown of the marked steps in the capture at `xplane_path`.

  `steps_by_marker` maps a marker's step_num to the steps its call ran, or
  is one count for every marker. `graph`, a tf.Graph such as the step's
  concrete function's, sizes TF kernels' outputs. `trace` is the capture's
  `chrome_trace`, when the caller has converted it already. Raises
  DataError when the capture holds no marked step.
  """
  modules = hlo_modules(read_space(xplane_path))
  events, kernel_lines = _trace(trace or chrome_trace(xplane_path))
  markers, steps = _marked(events, steps_by_marker)
  if not steps:
    raise DataError(
      f'{xplane_path} holds no marked training step: profile whole calls'
      " inside Trace('train', step_num=N)"
      f' ({errors.field("profile_steps")} > 0)'
    )
  groups = {e['args'].get('group_id') for e in markers}
  spans = sorted((m['ts'], m['ts'] + m['dur']) for m in markers)
  grouped = [  # JAX's thunks on its client's threads carry no group_id.
    e
    for e in events
    if e['args'].get('group_id') in groups or _inside(e, spans)
  ]
  kernels, self_us = _kernels(grouped, kernel_lines)
  index = {name: _Module(m) for name, m in modules.items()}
  table: dict[tuple[str, str], list] = {}
  for e in kernels:
    row = table.setdefault(_key(e), [e, 0.0, 0])
    row[1] += self_us[id(e)]
    row[2] += 1
  rows = sorted(
    (_row(e, us, runs, index, steps) for e, us, runs in table.values()),
    key=lambda k: -k.ms_per_step,
  )
  marked_us = sum(m['dur'] for m in markers)
  return Breakdown(
    steps=steps,
    step_ms=marked_us / 1e3 / steps,
    kernel_ms=sum(k.ms_per_step for k in rows),
    host_ms=(marked_us - _covered(markers, kernels)) / 1e3 / steps,
    launches_per_step=len(kernels) / steps,
    temp_bytes=_temp_bytes({_key(e)[0] for e in kernels} - {''}, index),
    written_bytes=_written_bytes(table.values(), index, graph, steps),
    kernels=rows,
  )


def find_capture(workdir: str) -> str:
  """The newest capture under `workdir`'s `plugins/profile`."""
  pattern = os.path.join(glob.escape(workdir), layout.CAPTURE_PATTERN)
  captures = sorted(glob.glob(pattern))
  if not captures:
    raise DataError(
      f'no profiler capture under {workdir}: train with'
      f' {errors.field("profile_steps")} > 0'
    )
  return captures[-1]


def hlo_modules(space: Any) -> dict[str, Any]:
  """Module name -> the HloProto XLA stored in an XSpace's metadata plane."""
  from tensorflow.compiler.xla.service import hlo_pb2  # noqa: PLC0415

  modules = {}
  for plane in space.planes:
    if plane.name != '/host:metadata':
      continue
    for metadata in plane.event_metadata.values():
      for stat in metadata.stats:
        if stat.WhichOneof('value') == 'bytes_value':
          proto = hlo_pb2.HloProto.FromString(stat.bytes_value)
          if proto.HasField('hlo_module'):
            modules[proto.hlo_module.name] = proto
  return modules


def _module_ops(module: Any) -> dict[str, tuple[tuple[str, str], ...]]:
  """Instruction -> the (op_name, op_type) pairs of the ops it was made of,
  in an HloModuleProto. A fusion, a while or a reduce is made of its own op
  and those of every instruction in the computations it calls.
  """
  computations = {c.id: c for c in module.computations}

  def made_of(instruction, seen: set[int]) -> Iterable[tuple[str, str]]:
    if instruction.metadata.op_name not in _NO_OP:
      yield instruction.metadata.op_name, instruction.metadata.op_type
    for called in instruction.called_computation_ids:
      if called not in seen:
        seen.add(called)
        for inner in computations[called].instructions:
          yield from made_of(inner, seen)

  ops = {}
  for c in module.computations:
    named = {
      i.id: tuple(dict.fromkeys(made_of(i, set()))) for i in c.instructions
    }
    users = collections.defaultdict(list)
    for i in c.instructions:
      for operand in i.operand_ids:
        users[operand].append(i.id)
    for i in c.instructions:
      # XLA's own instructions (a layout copy, the first half of a split
      # reduction) carry no op_name: they are named by the ops they feed,
      # or else (a copy of a result) by those they read.
      fed = [p for user in users[i.id] for p in named[user]]
      read = [p for operand in i.operand_ids for p in named.get(operand, ())]
      ops[i.name] = named[i.id] or tuple(dict.fromkeys(fed or read))
  return ops


def read_space(path: str) -> Any:
  """The profiler capture at `path`, an XSpace proto; DataError naming the
  fix when the file cannot be read or holds no capture, so that every reader
  of captures fails the same way, in one line."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415

  try:
    with open(path, 'rb') as f:
      return xplane_pb2.XSpace.FromString(f.read())
  except OSError as e:
    raise DataError(
      f'cannot read the capture {path} ({e.strerror}): pass an existing'
      ' .xplane.pb'
    ) from None
  except Exception:  # noqa: BLE001 - protobuf's DecodeError, any version.
    raise DataError(
      f'{path} is no profiler capture (not an XSpace): pass a .xplane.pb'
    ) from None


def chrome_trace(path: str) -> str:
  """The capture at `path` as xprof's trace_viewer converts it: Chrome
  trace-event JSON, which `from_capture` reads and a profiled run keeps."""
  from xprof.convert import raw_to_tool_data  # noqa: PLC0415

  with streams.quiet_stderr():  # xprof logs a harmless warning every call.
    trace, _ = raw_to_tool_data.xspace_to_tool_data([path], 'trace_viewer', {})
  if not trace:
    raise DataError(f'xprof could not convert {path}: pass a whole capture')
  return trace


def _trace(trace: str) -> tuple[list[dict], set[tuple[int, int]]]:
  """A `chrome_trace`'s events, and the (pid, tid) lines of device kernels.

  Events get an `args` dict when they had none.
  """
  raw = json.loads(trace)['traceEvents']
  names = {
    (e['pid'], e.get('tid')): e['args']['name']
    for e in raw
    if e.get('ph') == 'M' and e.get('name') in ('process_name', 'thread_name')
  }
  devices = {
    pid
    for (pid, tid), name in names.items()
    if tid is None and name.startswith('/device:')
  }
  lines = {
    (pid, tid)
    for (pid, tid), name in names.items()
    if pid in devices and tid is not None and name.startswith(_DEVICE_LINES)
  }
  events = [{**e, 'args': e.get('args', {})} for e in raw if e.get('ph') == 'X']
  return events, lines


def _tf_type(event: dict) -> str:
  """A TF kernel's op type (`long_name` "node:Type"); '' for other events."""
  return event['args'].get('long_name', ':').rpartition(':')[2]


def _kernels(
  events: list[dict], device_lines: set[tuple[int, int]]
) -> tuple[list[dict], dict[int, float]]:
  """The kernel events and id(event) -> self time in µs.

  With device lines (GPU, TPU) their events are the kernels; on a CPU, XLA's
  thunks and TF's kernels are, except TF kernels that launch XLA programs.
  """
  if device_lines:
    kernels = [e for e in events if (e['pid'], e['tid']) in device_lines]
    return kernels, {id(e): e['dur'] for e in kernels}
  candidates = [e for e in events if 'hlo_op' in e['args'] or _tf_type(e)]
  parents = _parents(candidates)
  launchers = {
    id(parents[id(e)])
    for e in candidates
    if 'hlo_op' in e['args'] and parents.get(id(e)) and _tf_type(parents[id(e)])
  }
  kernels = [
    e
    for e in candidates
    if id(e) not in launchers and _tf_type(e) not in _XLA_LAUNCHERS
  ]
  self_us = {id(e): e['dur'] for e in kernels}
  for e in kernels:
    parent = parents.get(id(e))
    if parent is not None and id(parent) in self_us:
      self_us[id(parent)] -= e['dur']
  return kernels, self_us


def _parents(events: list[dict]) -> dict[int, dict]:
  """id(event) -> the innermost event it is nested in on its thread."""
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[e['pid'], e['tid']].append(e)
  parents = {}
  for thread in by_thread.values():
    thread.sort(key=lambda e: (e['ts'], -e['dur']))
    stack: list[dict] = []
    for e in thread:
      while stack and e['ts'] >= stack[-1]['ts'] + stack[-1]['dur']:
        stack.pop()
      if stack:
        parents[id(e)] = stack[-1]
      stack.append(e)
  return parents


def _covered(markers: list[dict], events: list[dict]) -> float:
  """µs of the markers' spans in which at least one of `events` runs."""
  union: list[list[float]] = []  # Disjoint, sorted.
  for start, end in sorted((e['ts'], e['ts'] + e['dur']) for e in events):
    if union and start <= union[-1][1]:
      union[-1][1] = max(union[-1][1], end)
    else:
      union.append([start, end])
  ends = [end for _, end in union]
  total = 0.0
  for m in markers:
    start, end = m['ts'], m['ts'] + m['dur']
    for a, b in union[bisect.bisect_right(ends, start) :]:
      if a >= end:
        break
      total += min(b, end) - max(a, start)
  return total


def _inside(event: dict, spans: list[tuple[float, float]]) -> bool:
  """Whether `event` lies within one of the sorted, disjoint `spans`."""
  i = bisect.bisect_right(spans, (event['ts'], float('inf'))) - 1
  return i >= 0 and event['ts'] + event['dur'] <= spans[i][1]


def _key(event: dict) -> tuple[str, str]:
  """(XLA module or '' for TF, instruction or TF node)."""
  if 'hlo_op' in event['args']:
    return event['args'].get('hlo_module', ''), event['args']['hlo_op']
  node = event['args'].get('long_name', event['name']).rpartition(':')[0]
  return '', node or event['name']


def _row(
  event: dict, us: float, runs: int, index: dict[str, _Module], steps: int
) -> Kernel:
  module, name = _key(event)
  if module:
    kind = 'xla'
    instruction = index[module].instructions[name] if module in index else None
    opcode = instruction.opcode if instruction else ''
    made_of = index[module].ops.get(name, ()) if module in index else None
  else:
    kind, opcode = 'tf', _tf_type(event)
    made_of = ((name, opcode),)
  return Kernel(
    name=name,
    kind=kind,
    opcode=opcode,
    ms_per_step=us / 1e3 / steps,
    runs_per_step=runs / steps,
    ops=None if made_of is None else tuple(n for n, _ in made_of),
    op_types=None if made_of is None else tuple(t for _, t in made_of),
  )


class _Module:
  """One XLA module of the capture, indexed for the kernels' look-ups."""

  def __init__(self, proto: Any):
    self.ops = _module_ops(proto.hlo_module)
    self.instructions = {
      i.name: i for c in proto.hlo_module.computations for i in c.instructions
    }
    allocations = proto.buffer_assignment.buffer_allocations
    self.temp_bytes = sum(
      a.size
      for a in allocations
      if not (
        a.is_entry_computation_parameter
        or a.is_constant
        or a.is_thread_local
        or a.is_tuple
        or a.maybe_live_out
      )
    )


def _temp_bytes(modules: set[str], index: dict[str, _Module]) -> int | None:
  """The XLA temporaries of the modules run; None if one's HLO is missing."""
  if not modules <= index.keys():
    return None
  return sum(index[m].temp_bytes for m in modules)


def _written_bytes(
  rows: Iterable[list], index: dict[str, _Module], graph: Any, steps: int
) -> int | None:
  """Bytes the kernels' outputs take, per step; None if a size is unknown."""
  total = 0
  for event, _, runs in rows:
    module, name = _key(event)
    if module:
      if module not in index:
        return None
      size = _shape_bytes(index[module].instructions[name].shape)
    else:
      size = _node_bytes(graph, name) if graph is not None else None
      if size is None:
        return None
    total += size * runs
  return round(total / steps)


def _shape_bytes(shape: Any) -> int:
  """An array shape's bytes; 0 for a tuple (its elements are written by the
  instructions that make them) and for tokens."""
  from tensorflow.compiler.xla import xla_data_pb2  # noqa: PLC0415

  kind = xla_data_pb2.PrimitiveType.Name(shape.element_type)
  width = re.match(r'[A-Z]+(\d+)', kind)  # S32, BF16, F8E5M2: bits first.
  if kind != 'PRED' and not width:  # TUPLE, TOKEN, OPAQUE_TYPE.
    return 0
  bits = int(width.group(1)) if width else 8
  elements = 1
  for d in shape.dimensions:
    elements *= d
  return elements * bits // 8


def _node_bytes(graph: Any, node: str) -> int | None:
  """Bytes of a graph node's outputs; None when the node or a shape is
  unknown (a node made by TF's graph optimizer, a dynamic shape)."""
  try:
    op = graph.get_operation_by_name(node)
  except (KeyError, ValueError):
    return None
  total = 0
  for tensor in op.outputs:
    elements = tensor.shape.num_elements()
    if elements is None:
      return None
    if tensor.dtype.name not in ('resource', 'variant'):
      total += elements * tensor.dtype.size
  return total
