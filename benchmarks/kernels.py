"""TF's fused program beside JAX's lax.scan, kernel by kernel.

Both programs are profiled once, after the timed runs and never timed: TF's
through the trainer (`config.profile_steps`: the fused loop as users run and
profile it, its `breakdown.json`), JAX's by `jax_worker.py` (lax.scan over
the benchmark's own batches, `$XLA_MNIST_JAX_PROFILE_DIR`). Both captures are
read by `breakdown`, and each kernel is put in a category by what it
computes, from its HLO opcode and its framework ops, since the two XLAs name
their fusions differently. So the table says which part of the step costs
more in which XLA, and whether the two compiled the same HLO for it.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any

import ml_collections

from xla_mnist.inspection import breakdown
from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import DataError

# jax_worker.py's: it imports neither TF nor this package.
PROFILE_DIR_ENV = 'XLA_MNIST_JAX_PROFILE_DIR'
PROFILE_FILE = 'PROFILE.json'

# The speed goal: the fused loop's time at most this times JAX's lax.scan's.
JAX_GOAL = 1.0

GATHER = 'batch gather (+cast, scale)'
FORWARD_DOT = 'forward dot'
GRADIENT_DOT = 'weight-gradient dot'
LOSS = 'loss and its gradient'
UPDATE = 'SGD update'
OTHER = 'loop control, copies, other'
CATEGORIES = (GATHER, FORWARD_DOT, GRADIENT_DOT, LOSS, UPDATE, OTHER)

# XLA's own instructions, not the step's maths: the loop and its carries.
_CONTROL_OPCODES = frozenset(
  ('while', 'conditional', 'call', 'copy', 'copy-start', 'copy-done', 'tuple')
)
_DOT_TYPES = frozenset(('MatMul', 'BatchMatMulV2', 'dot_general'))
_GATHER_TYPES = frozenset(('GatherV2', 'ResourceGather', 'gather'))
_UPDATE_TYPES = frozenset(
  ('AssignSubVariableOp', 'ResourceApplyGradientDescent')
)
_LOSS_TYPES = frozenset(('SparseSoftmaxCrossEntropyWithLogits', 'LogSoftmax'))
# How each framework names the backward pass: TF's GradientTape prefixes its
# ops; JAX names the transposed (backward) ops `transpose(jvp(...))` and the
# differentiated forward ones `jvp(...)`.
_GRADIENT_MARKS = ('gradient_tape/', 'transpose(')
_DIFFERENTIATED_MARKS = (*_GRADIENT_MARKS, 'jvp(')
# HLO that only moves or reshapes values: left out of a fusion's opcodes.
_LAYOUT_OPCODES = frozenset(
  (
    'parameter',
    'constant',
    'bitcast',
    'reshape',
    'broadcast',
    'tuple',
    'get-tuple-element',
    'iota',
  )
)
_NOTABLE = 1.25  # A ratio this far from 1 either way is called a difference.
_NOTABLE_US = 1.0  # Smaller differences, in µs per step, are not.
LISTED = 4  # Kernels named per cell of the results table.


def _op_type(name: str, op_type: str) -> str:
  """TF records op types; JAX leaves them empty and ends the name with its
  primitive (`.../jvp()/dot_general`)."""
  return op_type or name.rpartition('/')[2]


def classify(kernel: breakdown.Kernel) -> str:
  """The category of what `kernel` computes, one of CATEGORIES.

  In this order: XLA's loop control and copies; a dot, backward when the
  dot's op is in the backward pass; the SGD update (TF's variable update,
  JAX's `p - lr * g`: a `sub` outside the differentiated function), even
  when fused with the bias gradient; a gather outside the loss (the batch's
  images and labels); the loss and its gradient; anything else, where also
  a kernel whose HLO the capture lacks lands (the table names it).
  """
  if kernel.opcode in _CONTROL_OPCODES or not kernel.ops:
    return OTHER
  ops = [
    (name, _op_type(name, t))
    for name, t in zip(kernel.ops, kernel.op_types, strict=True)
  ]

  def differentiated(name: str) -> bool:
    return any(mark in name for mark in _DIFFERENTIATED_MARKS)

  dots = [name for name, t in ops if t in _DOT_TYPES]
  if dots:
    backward = any(m in name for name in dots for m in _GRADIENT_MARKS)
    return GRADIENT_DOT if backward else FORWARD_DOT
  if any(
    t in _UPDATE_TYPES or (t == 'sub' and not differentiated(name))
    for name, t in ops
  ):
    return UPDATE
  in_loss = any(differentiated(name) or t in _LOSS_TYPES for name, t in ops)
  if not in_loss and any(t in _GATHER_TYPES for _, t in ops):
    return GATHER
  return LOSS if in_loss else OTHER


@dataclasses.dataclass(frozen=True)
class Side:
  """One program's profiled steps."""

  step: breakdown.Breakdown
  versions: dict[str, str]
  hlo: dict[str, tuple[str, ...]]  # Kernel -> the HLO opcodes it runs.


def compare(tf_side: Side, jax_side: Side) -> dict:
  """The two programs' kernels paired by category: the report's `kernels`."""
  sides = {'tf': tf_side, 'jax': jax_side}
  rows = []
  for category in CATEGORIES:
    row: dict[str, Any] = {'category': category}
    for key, side in sides.items():
      kernels = [k for k in side.step.kernels if classify(k) == category]
      row[f'{key}_us'] = 1e3 * sum(k.ms_per_step for k in kernels)
      row[f'{key}_kernels'] = [
        {
          'name': k.name,
          'us': 1e3 * k.ms_per_step,
          'runs_per_step': k.runs_per_step,
          'hlo': list(side.hlo.get(k.name, (k.opcode,))),
        }
        for k in kernels
      ]
    rows.append(row)
  return {
    key: {
      'versions': side.versions,
      'steps': side.step.steps,
      'step_us': 1e3 * side.step.step_ms,
      'kernel_us': 1e3 * side.step.kernel_ms,
      'host_us': 1e3 * side.step.host_ms,
      'launches_per_step': side.step.launches_per_step,
    }
    for key, side in sides.items()
  } | {'categories': rows}


def _hlo_of(row: dict, key: str) -> set[str]:
  return {op for k in row[f'{key}_kernels'] for op in k['hlo']}


def reading(comparison: dict) -> list[str]:
  """What the numbers say, one line each: where the two XLAs differ, and what
  is left to this program and what only a newer XLA brings."""
  codegen: dict[str, float] = {}  # TF slower on the same HLO: its XLA's.
  program: dict[str, float] = {}  # TF slower on other HLO, or the loop.
  lines = [
    line
    for row in comparison['categories']
    if (line := _category_line(row, codegen, program))
  ]
  return lines + _totals(comparison, codegen, program)


def _category_line(
  row: dict, codegen: dict[str, float], program: dict[str, float]
) -> str:
  """One category's notable difference ('' for none), its gap noted in
  `codegen` or `program` when TF's costs more."""
  category, tf_us, jax_us = row['category'], row['tf_us'], row['jax_us']
  if abs(tf_us - jax_us) < _NOTABLE_US:
    return ''
  if not (tf_us and jax_us):
    if tf_us:
      program[category] = tf_us
    who = "TF's" if tf_us else "JAX's"
    return (
      f'- {category}: only in {who} program, {tf_us or jax_us:.1f} µs/step.'
    )
  ratio = tf_us / jax_us
  if 1 / _NOTABLE < ratio < _NOTABLE:  # Within the runs' noise.
    return ''
  tf_hlo, jax_hlo = _hlo_of(row, 'tf'), _hlo_of(row, 'jax')
  same = tf_hlo == jax_hlo and category != OTHER
  if ratio > 1:
    (codegen if same else program)[category] = tf_us - jax_us
  if same:
    why = (
      f'the same HLO opcodes ({", ".join(sorted(tf_hlo))}): a codegen'
      ' difference, not the program'
    )
  else:
    why = (
      f"different HLO: TF's has {', '.join(sorted(tf_hlo - jax_hlo)) or '-'},"
      f" JAX's {', '.join(sorted(jax_hlo - tf_hlo)) or '-'}"
    )
  slower, faster, times = (
    ('TF', 'JAX', ratio) if ratio > 1 else ('JAX', 'TF', 1 / ratio)
  )
  return (
    f"- {category} costs {times:.1f}x {faster}'s in {slower}'s XLA"
    f' ({max(tf_us, jax_us):.1f} vs {min(tf_us, jax_us):.1f} µs/step):'
    f' {why}.'
  )


def _totals(
  comparison: dict, codegen: dict[str, float], program: dict[str, float]
) -> list[str]:
  """All kernels, the two kinds of gap, and the speed goal against them."""
  tf, jax = comparison['tf'], comparison['jax']
  ratio = (
    f' ({tf["kernel_us"] / jax["kernel_us"]:.2f}x)' if jax['kernel_us'] else ''
  )
  newer_xla = (
    f'{sum(codegen.values()):.1f} µs/step ({_listed(codegen)}), the same HLO'
    " run slower by TF's XLA."
    if codegen
    else "nothing measured here; in no category does TF's XLA run the same"
    ' HLO notably slower.'
  )
  goal = JAX_GOAL * jax['step_us']
  reach = (
    'no loop on this XLA reaches it here.'
    if tf['kernel_us'] > goal
    else f'a loop whose host time stays under {goal - tf["kernel_us"]:.1f}'
    ' µs/step would.'
  )
  return [
    f"- All kernels: TF's {tf['kernel_us']:.1f} µs/step, JAX's"
    f' {jax["kernel_us"]:.1f}{ratio}.',
    f'- What only a newer XLA brings: {newer_xla}',
    f'- Not a codegen gap on the same HLO: {sum(program.values()):.1f}'
    " µs/step where TF's kernels cost more with other HLO or in loop control"
    f' ({_listed(program) or "none"}), which another program or loop on'
    " TF's XLA may gain; and the host time between kernels,"
    f" {tf['host_us']:.1f} µs/step in the profiled calls (JAX's:"
    f' {jax["host_us"]:.1f}).',
    f"- The goal, {JAX_GOAL}x JAX's profiled step, is {goal:.1f} µs; TF's"
    f' kernels alone take {tf["kernel_us"]:.1f}: {reach}',
  ]


def _listed(gaps: dict[str, float]) -> str:
  return ', '.join(f'{k} {v:.1f}' for k, v in gaps.items())


def _hlo_opcodes(xplane: str, names: set[str]) -> dict[str, tuple[str, ...]]:
  """Kernel -> the HLO opcodes it runs (a fusion's, inside), from the module
  of the capture that holds most of `names`."""
  space = breakdown.read_space(xplane)
  modules = breakdown.hlo_modules(space).values()
  if not modules:
    return {}
  module = max(
    (m.hlo_module for m in modules),
    key=lambda m: len(
      names & {i.name for c in m.computations for i in c.instructions}
    ),
  )
  computations = {c.id: c for c in module.computations}

  def inside(ids: list[int]) -> list[str]:
    ops = []
    for i in (i for c in ids for i in computations[c].instructions):
      if i.called_computation_ids and i.opcode == 'fusion':
        ops += inside(list(i.called_computation_ids))
      elif i.opcode not in _LAYOUT_OPCODES:
        ops.append(i.opcode)
    return ops

  return {
    i.name: tuple(
      sorted(set(inside(list(i.called_computation_ids))))
      if i.opcode == 'fusion'
      else (i.opcode,)
    )
    for c in module.computations
    for i in c.instructions
    if i.name in names
  }


def _side(step: breakdown.Breakdown, xplane: str, versions: dict) -> Side:
  names = {k.name for k in step.kernels if k.kind == 'xla'}
  return Side(step, versions, _hlo_opcodes(xplane, names))


def profile_tf(
  config: ml_collections.ConfigDict, data_dir: str, workdir: str
) -> Side | None:
  """TF's fused loop as the trainer runs it: `config.num_steps` profiled
  steps after one call that is not (the first call compiles); None when the
  profiler wrote no breakdown (the trainer has warned why)."""
  import tensorflow as tf  # noqa: PLC0415 - results.py reads this module.

  from xla_mnist import trainer
  from xla_mnist.inspection import profiling  # noqa: PLC0415 - imports TF.

  config = ml_collections.ConfigDict(config)
  config.profile_steps = config.num_steps
  config.num_steps += config.steps_per_loop
  trainer.train_and_evaluate(config, workdir, data_dir, fresh=True, quiet=True)
  path = os.path.join(workdir, profiling.BREAKDOWN_FILE)
  if not os.path.exists(path):
    return None
  versions = {
    'tensorflow': tf.__version__,
    'git': tf.version.GIT_VERSION,
    # TF vendors XLA in its own tree (third_party/xla): the commit's.
    'xla': f'the XLA in TF {tf.version.GIT_VERSION}',
  }
  return _side(breakdown.Breakdown.load(path), find_capture(workdir), versions)


def find_capture(workdir: str) -> str:
  """The newest capture under `workdir`'s `plugins/profile`: JAX's worker
  names none, and a TF run's is its newest."""
  pattern = os.path.join(glob.escape(workdir), layout.CAPTURE_PATTERN)
  captures = sorted(glob.glob(pattern))
  if not captures:
    raise DataError(
      f'no profiler capture under {workdir}: train with'
      f' {errors.field("profile_steps")} > 0'
    )
  return captures[-1]


def read_jax(folder: str) -> Side | None:
  """JAX's lax.scan as `jax_worker.py` profiled it into `folder`; None when
  it did not (its stderr said why)."""
  path = os.path.join(folder, PROFILE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    done = json.load(f)
  xplane = find_capture(folder)
  versions = done['versions']
  versions['xla'] = (
    f'the XLA jaxlib {versions["jaxlib"]} was built with (jax commit'
    f' {versions["jaxlib_git"][:10]}, extension {versions["xla_extension"]})'
  )
  return _side(breakdown.from_capture(xplane, done['steps']), xplane, versions)


def measure(
  config: ml_collections.ConfigDict, data_dir: str, folder: str
) -> dict:
  """Profiles TF's program and reads JAX's from `folder` (where the worker
  wrote it): the comparison, or {'skipped': why}."""
  jax_side = read_jax(folder)
  if jax_side is None:
    return {'skipped': f'no JAX capture in {folder}'}
  tf_side = profile_tf(config, data_dir, os.path.join(folder, 'tf'))
  if tf_side is None:
    return {'skipped': "the trainer's profiler wrote no breakdown"}
  return compare(tf_side, jax_side)
