"""The benchmark's report as tables, and the results page made from its JSON.

  python -m benchmarks.results logs/bench.json docs/results.md

The page is generated, never edited by hand: its figures are one run's, on
the machine it names.
"""

from __future__ import annotations

import json
import math
import re

from benchmarks import kernels
from xla_mnist.runtime import cli
from xla_mnist.runtime.errors import UsageError, UserError
from xla_mnist.workdir import files, markdown

# The project's speed goals, as ratios of times in the same run.
FUSED = 'fused K=100'
# (other variant, goal, docs/speed.md's section on what was tried)
GOALS = (
  ('jax lax.scan', 0.6, 'against-jaxs-laxscan'),
  ('numpy', 0.8, 'where-the-fused-loops-time-goes'),
)
START_UP_GOAL = 0.7  # Whole process of xla_mnist.train over TF1's.
START_UP_SECTION = 'start-up'
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
    ),
    'l' + 'r' * 9,
    rows,
  )


def process_table(report: dict) -> str:
  return markdown.table(
    ('program', 'whole process s', 'peak MiB', 'train s', 'test accuracy'),
    'lrrrr',
    (
      (
        p['program'],
        f'{p["wall_seconds"]:.2f}',
        f'{p["peak_mib"]:,.0f}',
        f'{p["train_seconds"]:.3f}',
        f'{p["test_accuracy"]:.4f}',
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
    " after a first call), JAX's `lax.scan` over the same batches"
    f' ({jax["steps"]} steps, one call). Kernels are paired by what they'
    ' compute (`benchmarks/kernels.py`), self time per step; a cell lists'
    ' the longest kernels with the HLO opcodes they run.',
    f'TF {tf["versions"]["tensorflow"]} ({tf["versions"]["git"]}), with'
    f' {tf["versions"]["xla"]}; JAX {jax["versions"]["jax"]}, jaxlib'
    f' {jax["versions"]["jaxlib"]}, with {jax["versions"]["xla"]}.',
    kernels_table(comparison),
    f"Profiled steps: TF's {tf['step_us']:.1f} µs (timed, {FUSED}:"
    f" {timed.get(FUSED, '-')}), JAX's {jax['step_us']:.1f} µs (timed:"
    f' {timed.get("jax lax.scan", "-")}); one profile each, so its ratios'
    ' move with the load of the moment.',
    '\n'.join(kernels.reading(comparison)),
  ]


def goals(report: dict) -> list[str]:
  """One line per speed goal: the ratio measured, met or by how much."""
  per_step = {
    v['variant']: 1 / v['steps_per_second'] for v in report['variants']
  }
  lines = []
  for other, goal, section in GOALS:
    if other not in per_step:
      lines.append(
        f'- fused <= {goal}x {other}: not measured ({other} skipped)'
      )
      continue
    ratio = per_step[FUSED] / per_step[other]
    verdict = _verdict(ratio, goal, section)
    lines.append(f'- fused <= {goal}x {other}: {ratio:.2f}x, {verdict}')
  processes = {p['program']: p for p in report.get('processes', [])}
  if len(processes) == 2:
    train, tf1 = processes.values()
    ratio = train['wall_seconds'] / tf1['wall_seconds']
    verdict = _verdict(ratio, START_UP_GOAL, START_UP_SECTION)
    memory = 'no higher' if train['peak_mib'] <= tf1['peak_mib'] else 'higher'
    lines.append(
      f"- whole process <= {START_UP_GOAL}x TF1 program's: {ratio:.2f}x,"
      f' {verdict}; peak memory {memory} ({train["peak_mib"]:,.0f} vs'
      f' {tf1["peak_mib"]:,.0f} MiB)'
    )
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


def _verdict(ratio: float, goal: float, section: str) -> str:
  """'met', or by how much not and where the docs say what was tried."""
  if ratio <= goal:
    return 'met'
  return (
    f'missed by {ratio / goal:.2f}x; what was tried:'
    f' [speed.md](speed.md#{section})'
  )


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
  parts = [_header(report), variants_table(report)]
  if report.get('jax_skipped'):
    parts.append(f'JAX variants skipped: {report["jax_skipped"]}')
  if report.get('processes'):
    parts.append(process_table(report))
  if report.get('scaling'):
    parts.append(scaling_table(report))
  if report.get('inference'):
    parts.append(inference_table(report['inference']))
  if report.get('kernels'):
    parts += kernels_section(report)
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
    'Where the time goes and what was tried: [speed.md](speed.md).',
    '## Training, in one process',
    'Times per step over the default fused loop (`time vs fused`) and over'
    ' the physical floor, about 0.02 s per 1000 steps of 100 (`x floor`).',
    variants_table(report),
  ]
  if report.get('jax_skipped'):
    sections.append(f'JAX variants skipped: {report["jax_skipped"]}')
  if report.get('processes'):
    sections += [
      '## Whole processes',
      'Launch to exit, on prepared data with a warm XLA cache; median of'
      f' {report.get("process_runs", "several")} runs each, alternating.',
      process_table(report),
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
