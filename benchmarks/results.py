"""The benchmark's report as tables, and the results page made from its JSON.

  python -m benchmarks.results logs/bench.json docs/results.md

The page is generated, never edited by hand: its figures are one run's, on
the machine it names.
"""

from __future__ import annotations

import json
import math
import re
import statistics

from benchmarks import kernels, process, threads
from xla_mnist.runtime import cli
from xla_mnist.runtime.errors import UsageError, UserError
from xla_mnist.workdir import files, markdown

FUSED = 'fused K=100'
JAX_SCAN = 'jax lax.scan'
# JAX's rows at each of its thread settings, JAX's defaults first.
JAX_SCANS = tuple(JAX_SCAN + s.suffix for s in threads.JAX_SETTINGS)
JAX_PROCESSES = tuple(process.JAX + s.suffix for s in threads.JAX_SETTINGS)
# The project's speed goals, as ratios of times in the same run, round by
# round: (ours, theirs, goal, docs/speed.md's section on what was tried);
# where theirs are several rows, the goal is against the fastest measured.
TRAINING_GOALS = (
  (FUSED, JAX_SCANS, kernels.JAX_GOAL, 'against-jaxs-laxscan'),
  (FUSED, ('numpy',), 0.8, 'where-the-fused-loops-time-goes'),
)
PROCESS_GOALS = (
  (process.TRAIN, JAX_PROCESSES, kernels.JAX_GOAL, 'start-up'),
  (process.TRAIN, (process.TF1,), 0.7, 'start-up'),
)
# A verdict needs at least these rounds, every one on the same side.
MIN_ROUNDS = 3
KERNELS_HEADING = "## TF's XLA beside JAX's, kernel by kernel"
# The work's physical floor: 3.2 GFLOP (two 100x784x10 dots forward and back
# per step, 1000 steps) and the batches' bytes, about 0.02 s on one core.
FLOOR_SECONDS_PER_STEP = 0.02 / 1000


def variants_table(report: dict) -> str:
  floor = FLOOR_SECONDS_PER_STEP * report['batch_size'] / 100
  rows = []
  for v in report['variants']:
    per_step = 1 / v['steps_per_second']
    rows.append(
      (
        v['variant'],
        v['steps_per_loop'],
        f'{v["compile_seconds"]:.3f}',
        f'{v["train_seconds"]:.3f}',
        f'{1e3 * per_step:.3f}',
        f'{v["steps_per_second"]:,.0f}',
        f'{v["vs_fused"]:.2f}x',
        f'{per_step / floor:.1f}',
        f'{v["test_accuracy"]:.4f}',
        v['cluster_compiles'],
        v['threads'],
      )
    )
  return markdown.table(
    (
      'variant',
      'steps/call',
      'compile s',
      'train s',
      'ms/step',
      'steps/s',
      'time vs fused',
      'x floor',
      'test accuracy',
      'cluster compiles',
      'threads',
    ),
    'l' + 'r' * 9 + 'l',
    rows,
  )


def process_table(report: dict) -> str:
  return markdown.table(
    (
      'program',
      'whole process s',
      'each round s',
      'peak MiB',
      'train s',
      'test accuracy',
      'threads',
    ),
    'lrrrrrl',
    (
      (
        p['program'],
        f'{p["wall_seconds"]:.2f}',
        ', '.join(f'{r["wall_seconds"]:.2f}' for r in p['rounds']),
        f'{p["peak_mib"]:,.0f}',
        f'{p["train_seconds"]:.3f}',
        f'{p["test_accuracy"]:.4f}',
        p['threads'],
      )
      for p in report.get('processes', [])
    ),
  )


def scaling_table(report: dict) -> str:
  return markdown.table(
    ('batch', 'steps', 'steps/s', 'examples/s', 'peak MiB', 'whole process s'),
    'rrrrrr',
    (
      (
        f'{s["batch_size"]:,}',
        f'{s["steps"]:,}',
        f'{s["steps_per_second"]:,.0f}',
        f'{s["examples_per_second"]:,.0f}',
        f'{s["peak_mib"]:,.0f}',
        f'{s["wall_seconds"]:.1f}',
      )
      for s in report.get('scaling', [])
    ),
  )


def inference_table(inference: dict) -> str:
  """`inference.measure`'s figures: one row per variant."""
  rows = []
  for name, r in inference['results'].items():
    one, fixed = r['us_per_image_batch_1'], r['us_per_image_batch_fixed']
    rows.append(
      (
        name,
        f'{one:.2f}',
        f'{1e6 / one:,.0f}',
        f'{fixed:.3f}',
        f'{1e6 / fixed:,.0f}',
        f'{r["startup_seconds"]:.3f}',
        f'{r["peak_mib"]:,.0f}',
      )
    )
  return markdown.table(
    (
      'variant',
      'batch 1: us/image',
      'images/s',
      'fixed batch: us/image',
      'images/s',
      'start-up s',
      'peak MiB',
    ),
    'lrrrrrr',
    rows,
  )


def kernels_table(comparison: dict) -> str:
  """`kernels.compare`'s categories: each program's µs per step and kernels."""
  rows = [
    (
      r['category'],
      f'{r["tf_us"]:.1f}',
      f'{r["jax_us"]:.1f}',
      _ratio(r['tf_us'], r['jax_us']),
      _kernel_cell(r['tf_kernels']),
      _kernel_cell(r['jax_kernels']),
    )
    for r in comparison['categories']
  ]
  tf, jax = comparison['tf'], comparison['jax']
  rows.append(
    (
      'all kernels',
      f'{tf["kernel_us"]:.1f}',
      f'{jax["kernel_us"]:.1f}',
      _ratio(tf['kernel_us'], jax['kernel_us']),
      f'{tf["launches_per_step"]:.1f} launches/step',
      f'{jax["launches_per_step"]:.1f} launches/step',
    )
  )
  return markdown.table(
    (
      'category',
      'TF µs/step',
      'JAX µs/step',
      'TF/JAX',
      'TF kernels',
      'JAX kernels',
    ),
    'lrrrll',
    rows,
  )


def _ratio(tf_us: float, jax_us: float) -> str:
  """TF's time over JAX's, '-' where JAX took none."""
  return f'{tf_us / jax_us:.2f}x' if jax_us else '-'


def _kernel_cell(listed: list[dict]) -> str:
  """The longest kernels, `name` µs (HLO opcodes), and how many more."""
  cells = [
    f'`{k["name"]}` {k["us"]:.1f} ({" ".join(k["hlo"]) or "-"})'
    for k in listed[: kernels.LISTED]
  ]
  if len(listed) > kernels.LISTED:
    rest = sum(k['us'] for k in listed[kernels.LISTED :])
    cells.append(f'{len(listed) - kernels.LISTED} more, {rest:.1f}')
  return '; '.join(cells) or '-'


def kernels_section(report: dict) -> list[str]:
  """The page's kernel comparison: versions, table and what it says, and
  the profiled steps beside the timed ones (a profile slows each kernel)."""
  comparison = report['kernels']
  if 'skipped' in comparison:
    return [f'Not measured: {comparison["skipped"]}.']
  tf, jax = comparison['tf'], comparison['jax']
  timed = {
    v['variant']: f'{1e6 / v["steps_per_second"]:.1f}'
    for v in report['variants']
  }
  return [
    "Each program profiled once after the timed runs, untimed: TF's fused"
    f' loop through the trainer (`config.profile_steps`, {tf["steps"]} steps'
    " after a first call), JAX's `lax.scan` at JAX's defaults over the same"
    ' batches'
    f' ({jax["steps"]} steps, one call). Kernels are paired by what they'
    ' compute (`benchmarks/kernels.py`), self time per step; a cell lists'
    ' the longest kernels with the HLO opcodes they run.',
    f'TF {tf["versions"]["tensorflow"]} ({tf["versions"]["git"]}), with'
    f' {tf["versions"]["xla"]}; JAX {jax["versions"]["jax"]}, jaxlib'
    f' {jax["versions"]["jaxlib"]}, with {jax["versions"]["xla"]}.',
    kernels_table(comparison),
    f"Profiled steps: TF's {tf['step_us']:.1f} µs (timed, {FUSED}:"
    f" {timed.get(FUSED, '-')}), JAX's {jax['step_us']:.1f} µs (timed:"
    f' {timed.get(JAX_SCAN, "-")}); one profile each, so its ratios'
    ' move with the load of the moment.',
    '\n'.join(kernels.reading(comparison)),
  ]


def _training_rounds(report: dict) -> dict[str, list[float]]:
  """Each variant's seconds per step, round by round."""
  return {
    v['variant']: [t / v['timed_steps'] for t in v['round_train_seconds']]
    for v in report['variants']
  }


def _process_rounds(report: dict) -> dict[str, list[float]]:
  """Each program's whole-process seconds, round by round."""
  return {
    p['program']: [r['wall_seconds'] for r in p['rounds']]
    for p in report.get('processes', [])
  }


def _paired(ours: list[float], theirs: list[float]) -> list[float]:
  """Our time over theirs in each round: the machine's drift cancels."""
  return [a / b for a, b in zip(ours, theirs, strict=True)]


def _spread(ratios: list[float]) -> str:
  return f'{min(ratios):.2f}x to {max(ratios):.2f}x'


def versus_table(report: dict) -> str:
  """The default run beside JAX's lax.scan at each of its thread settings:
  training in one process, and whole processes; medians, their ratio and
  the rounds' ratios."""
  rows = []
  steps = report['steps']
  settings = {v['variant']: v['threads'] for v in report['variants']}
  settings |= {p['program']: p['threads'] for p in report.get('processes', [])}
  training, processes = _training_rounds(report), _process_rounds(report)
  for measure, rounds, ours, theirs, scale in (
    (f'train s, {steps:,} steps', training, FUSED, JAX_SCANS, steps),
    ('whole process s', processes, process.TRAIN, JAX_PROCESSES, 1),
  ):
    rows += [
      (measure, jax, settings[jax], rounds[ours], rounds[jax], scale)
      for jax in theirs
      if jax in rounds
    ]
  if not rows:
    return 'Not measured: JAX skipped.'
  return markdown.table(
    (
      'measure',
      'JAX (in-step gather)',
      "JAX's threads",
      f'xla_mnist ({FUSED}, the default)',
      'JAX',
      'ratio, median',
      'ratio, each round',
      'rounds',
    ),
    'lllrrrrr',
    (
      (
        measure,
        jax,
        setting,
        f'{statistics.median(ours) * scale:.3f}',
        f'{statistics.median(theirs) * scale:.3f}',
        f'{statistics.median(_paired(ours, theirs)):.2f}x',
        _spread(_paired(ours, theirs)),
        len(ours),
      )
      for measure, jax, setting, ours, theirs, scale in rows
    ),
  )


def _fastest(names: tuple[str, ...], rounds: dict[str, list[float]]) -> str:
  """Of `names`, the one of the lowest median time ('' if none measured)."""
  measured = [n for n in names if n in rounds]
  return min(measured, key=lambda n: statistics.median(rounds[n]), default='')


def goals(report: dict) -> list[str]:
  """One line per speed goal: the median ratio of the rounds, their spread,
  and met, missed, or not decidable at that spread; against the fastest of
  their rows, named."""
  lines = []
  for kind, rounds, table in (
    ('training', _training_rounds(report), TRAINING_GOALS),
    ('whole process', _process_rounds(report), PROCESS_GOALS),
  ):
    for ours, candidates, goal, section in table:
      if ours not in rounds and kind == 'whole process':
        continue  # No process table asked for.
      theirs = _fastest(candidates, rounds)
      if not theirs:
        lines.append(
          f'- {kind}, {ours} <= {goal}x {candidates[0]}: not measured'
          f' ({candidates[0]} skipped)'
        )
        continue
      slower = [c for c in candidates if c in rounds and c != theirs]
      than = f' (faster here than {"; ".join(slower)})' if slower else ''
      ratios = _paired(rounds[ours], rounds[theirs])
      lines.append(
        f'- {kind}, {ours} <= {goal}x {theirs}{than}:'
        f' {statistics.median(ratios):.2f}x (rounds {_spread(ratios)}),'
        f' {_verdict(ratios, goal, section)}'
      )
  if report.get('versus_fit'):
    lines.append(_fit_goal(report['versus_fit']))
  return lines + _memory_lines(report)


def _memory_lines(report: dict) -> list[str]:
  """Peak memory of the whole processes, and over longer runs."""
  lines = []
  processes = {p['program']: p for p in report.get('processes', [])}
  if process.TRAIN in processes:
    peaks = ', '.join(
      f'{name} {p["peak_mib"]:,.0f}' for name, p in processes.items()
    )
    lines.append(f'- peak memory of the whole processes (MiB): {peaks}')
  scaling = [s for s in report.get('scaling', []) if s['batch_size'] == 100]
  if len(scaling) > 1:
    memory = [s['peak_mib'] for s in scaling]
    rates = [s['steps_per_second'] for s in scaling]
    lines.append(
      f'- over {scaling[0]["steps"]:,} to {scaling[-1]["steps"]:,} steps: peak'
      f' memory {min(memory):,.0f} to {max(memory):,.0f} MiB, steps/s'
      f' {rates[0]:,.0f} -> {rates[-1]:,.0f}'
    )
  return lines


MET, MISSED = 'met', 'missed'
FEW, SPREAD = (
  'not decidable from too few rounds',
  'not decidable at this spread',
)


def _side(ratios: list[float], goal: float) -> str:
  """MET or MISSED where at least MIN_ROUNDS rounds all say so; else FEW
  or SPREAD."""
  if len(ratios) < MIN_ROUNDS:
    return FEW
  if max(ratios) <= goal:
    return MET
  return MISSED if min(ratios) > goal else SPREAD


def _verdict(
  ratios: list[float],
  goal: float,
  section: str,
  met: str = 'met',
  missed: str = '',
) -> str:
  """`met` or `missed` (by default, by how much and what was tried) when
  every round says so; else not decidable."""
  side = _side(ratios, goal)
  if side == FEW:
    return (
      f'not decidable from {len(ratios)} round{"s" * (len(ratios) != 1)}'
      f' ({MIN_ROUNDS} needed)'
    )
  if side == MET:
    return met
  if side == MISSED:
    return missed or (
      f'missed by {statistics.median(ratios) / goal:.2f}x; what was tried:'
      f' [speed.md](speed.md#{section})'
    )
  return (
    'not decidable at this spread: the rounds fall on both sides of the'
    " goal, so the machine's load moved the figures more than the gap;"
    ' run again on a quieter machine'
  )


def by_model_table(by_model: dict) -> str:
  """Each packaged model's default program (fused, its config's K) against
  `off`: medians per step, the speed-up off/fused round by round, and a
  verdict only where every round falls on one side of 1."""
  rows = []
  for name, measured in by_model['models'].items():
    runs = {m['variant']: m for m in measured}
    fused, off = runs['fused'], runs['off']
    rounds = _training_rounds({'variants': measured})
    speedup = _paired(rounds['off'], rounds['fused'])
    rows.append(
      (
        name,
        fused['steps_per_loop'],
        f'{1e3 / fused["steps_per_second"]:.3f}',
        f'{1e3 / off["steps_per_second"]:.3f}',
        f'{statistics.median(speedup):.2f}x',
        _spread(speedup),
        _verdict(
          [1 / r for r in speedup],
          1.0,
          '',
          met='fused faster',
          missed='off faster',
        ),
        f'{fused["test_accuracy"]:.4f}',
        f'{off["test_accuracy"]:.4f}',
      )
    )
  return markdown.table(
    (
      'model',
      'K (fused)',
      'fused ms/step',
      'off ms/step',
      'speed-up (off/fused), median',
      'each round',
      'verdict',
      'test accuracy, fused',
      'off',
    ),
    'lrrrrrlrr',
    rows,
  )


def by_model_section(report: dict) -> list[str]:
  by_model = report['by_model']
  return [
    '## By model',
    'Each packaged model as `xla-mnist-train --config=<model>` trains it'
    " (jit on, the config's own K steps per call: `K (fused)`) against"
    ' `--jit=off` (one step per call), in this process, alternating rounds,'
    f' {by_model["steps"]:,} steps each; machine, date and load as above.'
    " The CNN's config runs one step per call: XLA:CPU's fused loop is"
    ' slower with convolutions'
    ' ([models.md](models.md#why-the-cnn-runs-one-step-per-call)). Test'
    ' accuracy of'
    ' each run: both trained the same model (they drift apart with the'
    ' summation order over a short run).',
    by_model_table(by_model),
  ]


# Each of the loop's modes (`training.FIT_MODES`) and fit's matching
# setting; the variants are 'loop <mode>' and 'fit <mode>'.
FIT_SETTINGS = {
  'off': 'jit_compile=False',
  'on': 'jit_compile=True',
  'fused': 'jit_compile=True, steps_per_execution={k}',
}
FIT_HEADING = "## The loop against Keras's `fit`"
FIT_SECTION = 'the-loop-against-kerass-fit'  # The heading's anchor.
# Why the loop is slower than fit, where a run found it so, by (model, mode).
SLOWER_BECAUSE = {
  ('cnn', 'fused'): "XLA:CPU runs the CNN's gradient convolutions on its"
  " generic emitter inside the fused loop's `while`: its layout pass visits"
  ' only the entry computation'
  ' ([models.md](models.md#why-the-cnn-runs-one-step-per-call)). Keras'
  " runs `steps_per_execution` as TF's own `while_loop` around one XLA"
  " program per step, whose convolutions are its entry computation's, so"
  " they keep XLA's fast kernels; the CNN's config runs the loop one step"
  ' a call (`on`).',
}


def _fit_pairs(versus: dict) -> list[tuple[dict, str, dict, dict, list]]:
  """(run, mode, loop's, fit's, their ratios round by round) per pair."""
  pairs = []
  for run in versus['runs']:
    runs = {m['variant']: m for m in run['measurements']}
    rounds = _training_rounds({'variants': run['measurements']})
    for mode in FIT_SETTINGS:
      loop, fit = f'loop {mode}', f'fit {mode}'
      ratios = _paired(rounds[loop], rounds[fit])
      pairs.append((run, mode, runs[loop], runs[fit], ratios))
  return pairs


def versus_fit_table(versus: dict) -> str:
  """The loop's time per step over fit's at the matching setting, round by
  round: met where every round is at most 1.0x."""
  rows = []
  for run, mode, loop, fit, ratios in _fit_pairs(versus):
    rows.append(
      (
        run['model'],
        f'{run["optimizer"]} {run["learning_rate"]:g}',
        f'{run["steps"]:,}',
        f'{mode} ({loop["steps_per_loop"]})',
        FIT_SETTINGS[mode].format(k=fit['steps_per_loop']),
        f'{1e3 / loop["steps_per_second"]:.3f}',
        f'{1e3 / fit["steps_per_second"]:.3f}',
        f'{statistics.median(ratios):.2f}x',
        _spread(ratios),
        _verdict(
          ratios,
          1.0,
          '',
          missed=f'missed by {statistics.median(ratios):.2f}x: why below',
        ),
        f'{loop["compile_seconds"]:.2f} / {fit["compile_seconds"]:.2f}',
        f'{loop["test_accuracy"]:.4f} / {fit["test_accuracy"]:.4f}',
      )
    )
  return markdown.table(
    (
      'model',
      'optimizer',
      'steps',
      'loop (steps/call)',
      "fit's setting",
      'loop ms/step',
      'fit ms/step',
      'loop/fit, median',
      'each round',
      'verdict',
      'compile s, loop / fit',
      'test accuracy, loop / fit',
    ),
    'lllllrrrrlrr',
    rows,
  )


def slower_lines(versus: dict) -> list[str]:
  """A line per pair whose loop took longer than fit in every round (of
  MIN_ROUNDS at least), and why."""
  lines = []
  for run, mode, _, _, ratios in _fit_pairs(versus):
    if _side(ratios, 1.0) != MISSED:
      continue
    median = statistics.median(ratios)
    why = SLOWER_BECAUSE.get(
      (run['model'], mode),
      'Not yet explained: no cause for this model and mode has been'
      ' measured (profile both programs).',
    )
    lines.append(
      f'- {run["model"]}, {run["optimizer"]}, {mode}: {median:.2f}x'
      f" fit's time per step. {why}"
    )
  return lines


def _fit_goal(versus: dict) -> str:
  """The Goals page's line: how many pairs met, missed or were undecided."""
  sides: dict[str, list[str]] = {}
  for run, mode, _, _, ratios in _fit_pairs(versus):
    pair = f'{run["model"]} {run["optimizer"]} {mode}'
    sides.setdefault(_side(ratios, 1.0), []).append(pair)
  counts = '; '.join(
    f'{side} {len(pairs)}' + (f' ({", ".join(pairs)})' * (side != MET))
    for side, pairs in sides.items()
  )
  return (
    "- training, the loop <= 1.0x Keras's fit at the matching setting, of"
    f' {sum(map(len, sides.values()))} pairs: {counts};'
    f' [below](#{FIT_SECTION})'
  )


def versus_fit_section(report: dict) -> list[str]:
  versus = report['versus_fit']
  k = versus['k']
  slower = slower_lines(versus)
  return [
    FIT_HEADING,
    "Each packaged model with SGD (its config's rate) and Adam, trained by"
    " the loop (the trainer's program: `--jit=off`, `on` one step a call,"
    f" fused K={k} steps a call) and by Keras's `fit` at the matching"
    ' setting, from the same initial weights, with the same optimizer'
    ' (`step.make_optimizer`), on the same batches for the same steps;'
    " fit's are fed by tf.data as Keras users feed it, the loop's gathered"
    ' inside its step from the resident images. K and'
    ' `steps_per_execution` are at most half the run (fit compiles in its'
    ' first execution); the CNN runs fewer steps, its fused loop being'
    ' slow. The six runs of a model and optimizer alternate, round by'
    " round, in this process; `loop/fit` is the loop's time per step over"
    " fit's in the same round, compile not included; machine, date and"
    ' load as above.',
    versus_fit_table(versus),
    *(
      ['Where every round found the loop slower:', '\n'.join(slower)]
      if slower
      else []
    ),
  ]


def threads_table(report: dict) -> str:
  """The trainer at each thread count against the config's own, from the
  process table's rounds: train time and whole process, round by round, a
  verdict only where every round falls on one side of 1."""
  runs = {p['program']: p for p in report['processes']}
  base = runs[process.TRAIN]
  rows = []
  for name, run in runs.items():
    if name == process.TRAIN or not name.startswith(process.TRAIN):
      continue
    cells = [run['threads']]
    for key in ('train_seconds', 'wall_seconds'):
      ratios = _paired(
        [r[key] for r in run['rounds']], [r[key] for r in base['rounds']]
      )
      cells += [
        f'{run[key]:.3f}',
        f'{statistics.median(ratios):.2f}x',
        _spread(ratios),
        _verdict(ratios, 1.0, '', met='faster', missed='slower'),
      ]
    rows.append(cells)
  return markdown.table(
    (
      'trainer at',
      'train s',
      'time vs the default, median',
      'each round',
      'verdict',
      'whole process s',
      'vs the default, median',
      'each round',
      'verdict',
    ),
    'lrrrlrrrl',
    rows,
  )


def threads_section(report: dict) -> list[str]:
  base = next(p for p in report['processes'] if p['program'] == process.TRAIN)
  return [
    "## The trainer's thread count",
    '`python -m xla_mnist.train` at other `config.cpu_threads` against its'
    f" config's own ({base['threads']}: `train s` {base['train_seconds']:.3f},"
    f' whole process {base["wall_seconds"]:.2f} s), from the process'
    " table's rounds: the trainer's train time (its training clock, the"
    " recipe's steps) and the whole process, each round against the same"
    " round's default; faster or slower only where every round agrees.",
    threads_table(report),
  ]


def _header(report: dict) -> str:
  m = report['machine']
  load = ' then '.join(f'{x:.1f}' for x in report['load_average'])
  jax = f'JAX {m["jax"]}' if m.get('jax') else 'JAX skipped'
  return (
    f'{report["steps"]} steps of {report["batch_size"]} on'
    f' {report["dataset"]}, median of {report["repeats"]} rounds,'
    f' {report["date"]}. {m["cpu"]}, {m["cores"]} cores,'
    f' AVX-512 {"yes" if m["avx512"] else "no"}, oneDNN'
    f' {"on" if m["onednn"] else "off"}; Python {m["python"]}, TF'
    f' {m["tensorflow"]}, numpy {m["numpy"]}, {jax}; load {load}.'
  )


def text(report: dict) -> str:
  """What the benchmark prints."""
  parts = [_header(report), versus_table(report), variants_table(report)]
  if report.get('jax_skipped'):
    parts.append(f'JAX variants skipped: {report["jax_skipped"]}')
  if report.get('processes'):
    parts += [process_table(report), threads_table(report)]
  if report.get('scaling'):
    parts.append(scaling_table(report))
  if report.get('inference'):
    parts.append(inference_table(report['inference']))
  if report.get('kernels'):
    parts += kernels_section(report)
  if report.get('by_model'):
    parts += by_model_section(report)[1:]
  if report.get('versus_fit'):
    parts += versus_fit_section(report)[1:]
  parts.append('\n'.join(goals(report)))
  return '\n\n'.join(parts)


def page(report: dict) -> str:
  sections = [
    '# Benchmark results',
    "<!-- Generated by benchmarks/results.py from the benchmark's JSON;"
    ' run `make bench` to regenerate. -->',
    _header(report),
    '## Goals',
    '\n'.join(goals(report)),
    'Each ratio is our time over theirs in each alternating round (so the'
    " machine's drift cancels), their median, and their spread: a verdict"
    f' needs at least {MIN_ROUNDS} rounds, all on one side of the goal.'
    " Against JAX, the goal takes the faster of JAX's rows: at JAX's"
    " defaults (XLA:CPU's thread pool, a thread per CPU) and at one thread"
    " (`PJRT_NPROC=1`); each row's `threads` says what it ran with. Where"
    ' the time goes and what was tried: [speed.md](speed.md).',
    "## Against JAX's lax.scan",
    versus_table(report),
    '## Training, in one process',
    'Times per step over the default fused loop (`time vs fused`) and over'
    ' the physical floor, about 0.02 s per 1000 steps of 100 (`x floor`).'
    " `threads`: TF's pools as `config.cpu_threads` sized them in this"
    " process, numpy's BLAS threads, and each JAX row's setting in its own"
    " process with the size of XLA:CPU's pool it found.",
    variants_table(report),
  ]
  if report.get('jax_skipped'):
    sections.append(f'JAX variants skipped: {report["jax_skipped"]}')
  if report.get('processes'):
    sections += [
      '## Whole processes',
      'Launch to exit, on prepared data with a warm XLA cache (JAX: its'
      ' persistent compilation cache; `benchmarks/jax_program.py`, which'
      ' reads the same images, batch order and test split from a prepared'
      f' .npz); median of {report.get("process_runs", "several")} rounds,'
      ' each running every program once, in alternating order.',
      process_table(report),
      *threads_section(report),
    ]
  if report.get('scaling'):
    sections += ['## How cost grows', scaling_table(report)]
  if report.get('inference'):
    sections += [
      '## Inference',
      'The test split classified by an exported run of the recipe (`python'
      ' -m xla_mnist.aot`): `classify`, its AOT binary; `jit`, the Keras'
      ' model in `tf.function(jit_compile=True)`; `saved_model`, its'
      ' SavedModel. Fastest of'
      f' {report["inference"]["repeats"]} passes at batch 1 and at the'
      " export's fixed batch; start-up is a fresh process classifying one"
      ' image; each variant in processes of its own'
      ' ([aot.md](aot.md#speed-inference)).',
      inference_table(report['inference']),
    ]
  if report.get('kernels'):
    sections += [
      KERNELS_HEADING,
      *kernels_section(report),
    ]
  if report.get('by_model'):
    sections += by_model_section(report)
  if report.get('versus_fit'):
    sections += versus_fit_section(report)
  return '\n\n'.join(sections) + '\n'


def write_page(report: dict, path: str) -> None:
  files.write_atomically(path, page(report))


def main(argv: list[str]) -> None:
  """Writes the page of a report `make bench` wrote: argv is the report's
  path and the page's."""
  if len(argv) != 3:
    raise UsageError('usage: python -m benchmarks.results BENCH_JSON PAGE_MD')
  report_path, page_path = argv[1:]
  text = rendered(report_path)
  try:
    files.write_atomically(page_path, text)
  except OSError as e:
    raise UserError(
      f'{page_path} cannot be written ({e.strerror}): pass a page path in a'
      ' writable folder'
    ) from None


def rendered(report_path: str) -> str:
  """The page of the report in file `report_path`; UserError in one line
  for any file that is not a report this version renders."""
  try:
    with open(report_path, 'rb') as f:
      report = json.loads(f.read().decode('utf-8'))
  except (OSError, ValueError, RecursionError) as e:
    # ValueError: not UTF-8, not JSON (an empty file), a number too long.
    raise UserError(
      f'{report_path} cannot be read ({_one_line(e)}): run make bench'
    ) from None
  try:
    return _checked_page(report)
  # Any field may be missing, null, of another type or out of range (an
  # older version's report, a hand-edited one): whatever its rendering
  # raises is the report's fault, and one line.
  except Exception as e:  # noqa: BLE001
    raise UserError(
      f'{report_path} is not a report of this version of the benchmark'
      f' ({type(e).__name__} {_one_line(e)}): run make bench again'
    ) from None


def _checked_page(report: object) -> str:
  """The page of `report`; ValueError or TypeError for a report whose page
  would be empty or say a figure no measurement gives (inf, nan)."""
  if not isinstance(report, dict):
    raise TypeError(f'a JSON {type(report).__name__}, not an object')
  variants = report.get('variants')
  if not (isinstance(variants, list) and variants):
    raise TypeError('no list of variants')
  for v in variants:
    rate = v['steps_per_second']
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
      raise TypeError(f'steps_per_second {rate!r} is not a number')
    if not 0 < rate < math.inf:
      raise ValueError(f'steps_per_second {rate!r} is not a measured rate')
  text = page(report)
  if found := _NOT_FINITE.search(text):
    raise ValueError(f'a figure is {found.group()}')
  return text


# A number the page formats from an infinite or undefined figure.
_NOT_FINITE = re.compile(r'(?<![\w.])-?(inf|nan)(?![\w])')


def _one_line(error: BaseException) -> str:
  """The error's first line, cut to a length a terminal shows."""
  lines = str(error).splitlines() or ['']
  return lines[0][:200]


if __name__ == '__main__':
  cli.run(main, cli.parse)
