"""`report.md`: one page per run that a reader opens first.

`result.json` is for programs; the report puts the same figures, the config
they came from, the profile's top ops and links to every file the run wrote
(relative, so the workdir can be moved or published) on one page.
"""

from __future__ import annotations

import glob
import os

import ml_collections

from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files, markdown, outputs, reporting

REPORT_FILE = layout.REPORT_FILE
COMPARE_FILE = 'compare.png'  # The jit modes side by side, when plotted.


def publish(
  result: outputs.Result,
  config: ml_collections.ConfigDict,
  reporter: reporting.Reporter,
) -> None:
  """The run's outcome where users look: `result.json`, `report.md`, and
  TensorBoard (HParams, the outcome's scalars, the report in the Text tab),
  so that runs compare there, not only in files."""
  try:
    outputs.write_result(result)
    write_report(result, config)
  except OSError as e:
    raise UserError(
      f'cannot write the result into {result.workdir} ({e.strerror}): free'
      ' space there and run the same command again, or pass another'
      f' {errors.arg("workdir", "DIR")}'
    ) from None
  reporter.hparams(result.steps, hparams(result, config))
  reporter.scalars(result.steps, outputs.outcome_scalars(result))
  reporter.text(result.steps, 'report', render(result, config))


def hparams(
  result: outputs.Result, config: ml_collections.ConfigDict
) -> dict[str, str | int | float]:
  """What sets one run apart from another, as the HParams tab lists it."""
  return {
    'model': config.model,
    'jit': result.jit,
    'steps_per_loop': result.steps_per_loop,
    'device': result.device,
    'strategy': config.strategy,
    'batch_size': result.batch_size,
    'learning_rate': config.learning_rate,
    'seed': config.seed,
    'num_steps': result.steps,
    'dataset': result.dataset,
  }


def write_report(
  result: outputs.Result, config: ml_collections.ConfigDict
) -> str:
  """Writes `<workdir>/report.md` atomically; returns its path."""
  path = os.path.join(result.workdir, REPORT_FILE)
  files.write_atomically(path, render(result, config))
  return path


def render(result: outputs.Result, config: ml_collections.ConfigDict) -> str:
  """The page; a figure the run did not measure reads 'not measured'."""
  workdir = result.workdir
  figures = [
    (
      'steps',
      f'{result.steps} of {result.batch_size},'
      f' {result.steps_per_loop} per call',
    ),
    *(
      (f.label, f.text(result))
      for f in outputs.FIGURES.values()
      if not (f.optional and f.of(result) is None)
    ),
    ('traces', result.traces),
  ]
  if result.hlo_fusions is not None:
    figures.append(('XLA fusions in the optimized step', result.hlo_fusions))
  figures += _machine_rows(result)
  config_rows = [(f'`{key}`', f'`{value!r}`') for key, value in config.items()]
  lines = [
    f'# {result.dataset}, jit={result.jit}, {result.device}',
    '',
    markdown.table(('figure', 'value'), 'll', figures),
    '',
    '## Config',
    '',
    markdown.table(('field', 'value'), 'll', config_rows),
    '',
    *_profile_lines(result.profile, workdir),
    '## Files',
    '',
    *_file_links(result, workdir),
  ]
  return '\n'.join(lines) + '\n'


def _machine_rows(result: outputs.Result) -> list[tuple[str, str]]:
  """The CPU and the versions behind the figures, when recorded."""
  rows = [('CPU', result.cpu_model)] if result.cpu_model else []
  rows += [
    (name, version or 'not installed')
    for name, version in result.versions.items()
  ]
  return rows


def _profile_lines(profile: dict | None, workdir: str) -> list[str]:
  if not profile:
    return [
      '## Profile',
      '',
      'None: `--config.profile_steps=0`, the profiler failed (the run'
      ' printed why), or the run trained no step (it found them done).',
      '',
    ]
  lines = [
    '## Profile',
    '',
    f'{profile["steps"]} traced steps, {profile["mean_step_ms"]:.3f} ms/step'
    + _split(profile)
    + f', {profile["fusions"]} XLA fusions/step.',
    '',
    markdown.table(
      ('op', 'self time ms/step'),
      'll',
      [(f'`{name}`', f'{ms:.3f}') for name, ms in profile['top_ops']],
    ),
  ]
  if profile.get('why'):  # Schema 3: what the top kernels were made of.
    lines += ['', 'The top kernels, and the TF ops each was made of:', '']
    lines += [f'- {line.strip()}' for line in profile['why']]
  capture = _link(os.path.dirname(profile['xplane_path']), workdir)
  return [*lines, '', f"Capture for TensorBoard's Profile tab: {capture}.", '']


def _split(profile: dict) -> str:
  """Kernel and host time, where the profile has them (schema 3)."""
  if profile.get('kernel_ms') is None:
    return ''
  return (
    f' = kernels {profile["kernel_ms"]:.3f} + host {profile["host_ms"]:.3f},'
    f' {profile["launches_per_step"]:g} launches'
  )


def _file_links(result: outputs.Result, workdir: str) -> list[str]:
  """Links to what the run wrote; optional outputs only when present."""
  paths = [os.path.join(workdir, outputs.RESULT_FILE)]
  if result.profile:
    paths.append(result.profile['trace_path'])
  paths += sorted(
    glob.glob(os.path.join(glob.escape(workdir), layout.HLO_DIR, '*'))
  )
  paths += [
    os.path.join(workdir, name)
    for name in (layout.CLUSTER_DIR, COMPARE_FILE)
    if os.path.exists(os.path.join(workdir, name))
  ]
  links = [f'- {_link(p, workdir)}' for p in paths]
  if os.path.exists(os.path.join(workdir, COMPARE_FILE)):
    links += ['', f'![jit modes compared]({COMPARE_FILE})']
  return links


def _link(path: str, workdir: str) -> str:
  rel = os.path.relpath(path, workdir)
  if os.path.isdir(path):
    rel += '/'
  return f'[{rel}]({rel})'
