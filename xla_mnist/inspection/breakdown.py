"""Why XLA helps: one training step of a profiler capture (TF's or JAX's)
split into kernel, host and input time, each XLA kernel with its TF ops and
bytes. Where each figure comes from, and why not xprof's tables:
docs/profiling.md.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from xla_mnist.runtime import errors, streams
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
  ops: tuple[str, ...] | None  # Framework ops; None: the capture lacks HLO.
  op_types: tuple[str, ...] | None

  def made_of(self) -> tuple[str, ...] | None:
    """The TF op types it was made of (a name where the type is unknown)."""
    if self.ops is None:
      return None
    names = (t or n for n, t in zip(self.ops, self.op_types, strict=True))
    return tuple(dict.fromkeys(names))

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any]) -> Kernel:
    """One back from JSON, whose lists were its tuples (a subclass's too)."""
    return cls(
      **{k: tuple(v) if type(v) is list else v for k, v in fields.items()}
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
  # tf.data's share; None: no input pipeline ran (resident data, JAX).
  input_ms: float | None = None  # The step waiting for its batches.
  input_busy_ms: float | None = None  # The pipeline's threads busy meanwhile.

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2)

  @classmethod
  def load(cls, path: str) -> Breakdown:
    """The `breakdown.json` a profiled run wrote (`to_json`)."""
    with open(path) as f:
      fields = json.load(f)
    kernels = [Kernel.from_dict(k) for k in fields['kernels']]
    return cls(**{**fields, 'kernels': kernels})


def from_capture(
  xplane_path: str,
  steps_by_marker: Mapping[int, int] | int,
  graph: Any = None,
  trace: str | None = None,
) -> Breakdown:
  """The marked steps' breakdown. `steps_by_marker`: a marker's step_num ->
  the steps its call ran, or one count for all; `graph` (the step's) sizes
  TF kernels' outputs; `trace`: the capture's `chrome_trace`, if at hand."""
  protos = hlo_modules(read_space(xplane_path))
  index = {name: _Module(proto) for name, proto in protos.items()}
  events, device_lines = _trace(trace or chrome_trace(xplane_path))

  def steps_of(marker: dict) -> int:
    if isinstance(steps_by_marker, int):
      return steps_by_marker
    return steps_by_marker.get(int(marker['args']['step_num']), 0)

  markers = [e for e in events if 'step_num' in e['args'] and steps_of(e)]
  steps = sum(map(steps_of, markers))
  if not steps:
    raise DataError(
      f'{xplane_path} holds no marked training step: profile whole calls'
      " inside Trace('train', step_num=N)"
      f' ({errors.field("profile_steps")} > 0)'
    )
  groups = {e['args'].get('group_id') for e in markers}
  spans = sorted((m['ts'], m['ts'] + m['dur']) for m in markers)
  own = [e for e in events if not _input(e)]  # tf.data's are never kernels.
  kernels, self_us = _kernels(
    [e for e in own if e['args'].get('group_id') in groups or _in(e, spans)],
    device_lines,
  )
  busy = [e for e in events if _pipeline(e)]
  # The stepping thread's get-next calls: its wait for tf.data's batches.
  waits = [e for e in events if _input(e) and not _pipeline(e)]
  fed = bool(busy or waits)  # Else no pipeline ran: None, not 0.
  table: dict[tuple[str, str], list] = {}  # key -> [event, µs, runs]
  for e in kernels:
    row = table.setdefault(_key(e), [e, 0.0, 0])
    row[1] += self_us[id(e)]
    row[2] += 1
  made = sorted(
    (_row(*row, index, steps, graph) for row in table.values()),
    key=lambda row: -row[0].ms_per_step,
  )
  sizes = [size for _, size in made]
  marked_us = sum(m['dur'] for m in markers)
  modules = {_key(e)[0] for e in kernels} - {''}
  return Breakdown(
    steps=steps,
    step_ms=marked_us / 1e3 / steps,
    kernel_ms=sum(k.ms_per_step for k, _ in made),
    host_ms=(marked_us - _covered(spans, kernels + waits)) / 1e3 / steps,
    launches_per_step=len(kernels) / steps,
    temp_bytes=sum(index[m].temp_bytes for m in modules)
    if modules <= index.keys()
    else None,
    written_bytes=None if None in sizes else round(sum(sizes) / steps),
    kernels=[k for k, _ in made],
    input_ms=_covered(spans, waits) / 1e3 / steps if fed else None,
    input_busy_ms=_covered(spans, busy) / 1e3 / steps if fed else None,
  )


def read_space(path: str) -> Any:
  """The capture at `path`, an XSpace; every reader fails alike, in a line."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415

  try:
    with open(path, 'rb') as f:
      return xplane_pb2.XSpace.FromString(f.read())
  except Exception as e:  # noqa: BLE001 - OSError, protobuf's DecodeError.
    raise DataError(
      f'{path} holds no profiler capture ({errors.first_line(e, named=True)}):'
      ' pass an existing .xplane.pb'
    ) from None


def hlo_modules(space: Any) -> dict[str, Any]:
  """Module name -> the HloProto XLA stored in an XSpace's metadata plane."""
  from tensorflow.compiler.xla.service import hlo_pb2  # noqa: PLC0415

  protos = (
    hlo_pb2.HloProto.FromString(stat.bytes_value)
    for plane in space.planes
    if plane.name == '/host:metadata'
    for metadata in plane.event_metadata.values()
    for stat in metadata.stats
    if stat.WhichOneof('value') == 'bytes_value'
  )
  return {p.hlo_module.name: p for p in protos if p.HasField('hlo_module')}


def chrome_trace(path: str) -> str:
  """The capture at `path` as xprof's trace_viewer's Chrome trace JSON."""
  from xprof.convert import raw_to_tool_data  # noqa: PLC0415

  with streams.quiet_stderr():  # xprof logs a harmless warning every call.
    trace, _ = raw_to_tool_data.xspace_to_tool_data([path], 'trace_viewer', {})
  if not trace:
    raise DataError(f'xprof could not convert {path}: pass a whole capture')
  return trace


def _trace(trace: str) -> tuple[list[dict], set[tuple[int, int]]]:
  """A `chrome_trace`'s complete events (each with `args` and its `thread`'s
  name), and its device kernel lines (pid, tid)."""
  raw = json.loads(trace)['traceEvents']
  names = {
    (e['pid'], e.get('tid')): e['args']['name']
    for e in raw
    if e.get('name') in ('process_name', 'thread_name') and e.get('ph') == 'M'
  }
  lines = {
    (pid, tid)
    for (pid, tid), name in names.items()
    if tid is not None
    and name.startswith(_DEVICE_LINES)
    and names.get((pid, None), '').startswith('/device:')
  }
  events = [{**e, 'args': e.get('args', {})} for e in raw if e.get('ph') == 'X']
  for e in events:
    e['thread'] = names.get((e['pid'], e['tid']), '')
  return events, lines


def _tf_type(event: dict) -> str:
  """A TF kernel's op type (`long_name` "node:Type"); '' for other events."""
  return event['args'].get('long_name', ':').rpartition(':')[2]


def _pipeline(event: dict) -> bool:
  """Whether `event` ran on tf.data's threads (`tf_data_private_threadpool/<n>`,
  `tf_data_iterator_resource/<n>`): the input pipeline at work."""
  return event['thread'].startswith('tf_data')


def _input(event: dict) -> bool:
  """Whether `event` is tf.data's: its threads', an iterator's (whose
  `long_name` "Iterator::Root::Prefetch" reads like a TF kernel's), or a
  get-next op's (`IteratorGetNext`, `MultiDeviceIteratorGetNextFromShard`)."""
  name = event['name']
  get_next = 'IteratorGetNext' in name + event['args'].get('eager_op', '')
  return _pipeline(event) or name.startswith('Iterator::') or get_next


def _kernels(
  events: list[dict], device_lines: set[tuple[int, int]]
) -> tuple[list[dict], dict[int, float]]:
  """The kernel events, and id(event) -> self µs: the device lines' or, on a
  CPU, XLA's thunks and TF's kernels but those that run XLA programs."""
  if device_lines:
    kernels = [e for e in events if (e['pid'], e['tid']) in device_lines]
    return kernels, {id(e): e['dur'] for e in kernels}
  candidates = [e for e in events if 'hlo_op' in e['args'] or _tf_type(e)]
  parents = _parents(candidates)
  launchers = {  # A thunk's TF parent, and TF's own dispatchers.
    id(p)
    for e in candidates
    if 'hlo_op' in e['args'] and (p := parents.get(id(e))) and _tf_type(p)
  } | {id(e) for e in candidates if _tf_type(e) in _XLA_LAUNCHERS}
  kernels = [e for e in candidates if id(e) not in launchers]
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
    stack: list[dict] = []
    for e in sorted(thread, key=lambda e: (e['ts'], -e['dur'])):
      while stack and e['ts'] >= stack[-1]['ts'] + stack[-1]['dur']:
        stack.pop()
      if stack:
        parents[id(e)] = stack[-1]
      stack.append(e)
  return parents


def _covered(spans: list[tuple[float, float]], events: list[dict]) -> float:
  """µs of the sorted, disjoint `spans` in which one of `events` runs."""
  union: list[list[float]] = []  # Disjoint, sorted.
  for start, end in sorted((e['ts'], e['ts'] + e['dur']) for e in events):
    if union and start <= union[-1][1]:
      union[-1][1] = max(union[-1][1], end)
    else:
      union.append([start, end])
  ends = [end for _, end in union]
  total = 0.0
  for start, end in spans:
    for a, b in union[bisect.bisect_right(ends, start) :]:
      if a >= end:
        break
      total += min(b, end) - max(a, start)
  return total


def _in(event: dict, spans: list[tuple[float, float]]) -> bool:
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
  event: dict, us: float, runs: int, index: dict, steps: int, graph: Any
) -> tuple[Kernel, int | None]:
  """A kernel's row, and the bytes its runs write (None: unknown)."""
  module, name = _key(event)
  if not module:
    kind, opcode = 'tf', _tf_type(event)
    made_of: Iterable[tuple[str, str]] | None = ((name, opcode),)
    size = _node_bytes(graph, name) if graph is not None else None
  else:
    found = index.get(module)
    instruction = found.instructions.get(name) if found else None
    kind, opcode = 'xla', instruction.opcode if instruction else ''
    made_of = found.ops.get(name, ()) if found else None
    size = _shape_bytes(instruction.shape) if instruction else None
  kernel = Kernel(
    name=name,
    kind=kind,
    opcode=opcode,
    ms_per_step=us / 1e3 / steps,
    runs_per_step=runs / steps,
    ops=None if made_of is None else tuple(n for n, _ in made_of),
    op_types=None if made_of is None else tuple(t for _, t in made_of),
  )
  return kernel, None if size is None else size * runs


class _Module:
  """An XLA module: its instructions, their TF ops, its temporaries' bytes."""

  def __init__(self, proto: Any):
    module = proto.hlo_module
    self.ops = _module_ops(module)
    self.instructions = {
      i.name: i for c in module.computations for i in c.instructions
    }
    self.temp_bytes = sum(
      a.size
      for a in proto.buffer_assignment.buffer_allocations
      if not (a.is_entry_computation_parameter or a.is_constant)
      and not (a.is_thread_local or a.is_tuple or a.maybe_live_out)
    )


def _module_ops(module: Any) -> dict[str, tuple[tuple[str, str], ...]]:
  """Instruction -> (op_name, op_type) of its op and of those it calls."""
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
      # XLA's own instructions (a layout copy, half a split reduction) carry
      # no op_name: named by the ops they feed, or else by those they read.
      fed = [p for user in users[i.id] for p in named[user]]
      read = [p for operand in i.operand_ids for p in named.get(operand, ())]
      ops[i.name] = named[i.id] or tuple(dict.fromkeys(fed or read))
  return ops


def _shape_bytes(shape: Any) -> int:
  """An array's bytes; 0 for a tuple (its makers write its elements), token."""
  from tensorflow.compiler.xla import xla_data_pb2  # noqa: PLC0415

  kind = xla_data_pb2.PrimitiveType.Name(shape.element_type)
  width = re.match(r'[A-Z]+(\d+)', kind)  # S32, BF16, F8E5M2: bits first.
  if kind != 'PRED' and not width:  # TUPLE, TOKEN, OPAQUE_TYPE.
    return 0
  bits = int(width.group(1)) if width else 8
  for d in shape.dimensions:
    bits *= d
  return bits // 8


def _node_bytes(graph: Any, node: str) -> int | None:
  """A node's output bytes; None: a node of TF's optimizer, a dynamic shape."""
  try:
    outputs = graph.get_operation_by_name(node).outputs
  except (KeyError, ValueError):
    return None
  sizes = [
    t.shape.num_elements() and t.shape.num_elements() * t.dtype.size
    for t in outputs
    if t.dtype.name not in ('resource', 'variant')
  ]
  return None if None in sizes else sum(sizes)
