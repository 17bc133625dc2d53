"""`report.md`, the page a reader opens first (TensorBoard's Text tab shows it
too): the figures, their config, the profile's top ops, and relative links to
every file the run wrote, so that the workdir can be moved or published."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator

import ml_collections

from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files, markdown, outputs, reporting

REPORT_FILE = layout.REPORT_FILE


def publish(
  result: outputs.Result,
  config: ml_collections.ConfigDict,
  reporter: reporting.Reporter,
) -> None:
  """The run's outcome where users look: `result.json`, `report.md`, and
  TensorBoard (HParams, scalars, the report), so runs compare there too."""
  try:
    outputs.write_result(result)
    write_report(result, config)
  except OSError as e:
    raise UserError(
      f'cannot write the result into {result.workdir} ({e.strerror}): free'
      ' space there and run the same command again, or pass another'
      f' {errors.arg("workdir", "DIR")}'
    ) from None
  reporter.hparams(
    result.steps,
    {
      'model': config.model,
      # What changes the trajectory: the optimizer's fields by their paths.
      **result.recipe,
      'steps_per_loop': result.steps_per_loop,
      'device': result.device,
      'strategy': config.strategy,
      'num_steps': result.steps,
      'dataset': result.dataset,
    },
  )
  reporter.scalars(result.steps, outputs.outcome_scalars(result))
  reporter.text(result.steps, 'report', render(result, config))


def write_report(
  result: outputs.Result, config: ml_collections.ConfigDict
) -> str:
  """Writes `<workdir>/report.md` atomically; returns its path."""
  path = os.path.join(result.workdir, REPORT_FILE)
  files.write_atomically(path, render(result, config))
  return path


def render(result: outputs.Result, config: ml_collections.ConfigDict) -> str:
  """The page; a figure the run did not measure reads 'not measured'."""
  per_call = f'{result.steps_per_loop} per call'
  figures = [('steps', f'{result.steps} of {result.batch_size}, {per_call}')]
  figures += [
    (f.label, f.text(result))
    for f in outputs.FIGURES.values()
    if not (f.optional and f.of(result) is None)
  ]
  figures.append(('traces', result.traces))
  if result.hlo_fusions is not None:
    figures.append(('XLA fusions in the optimized step', result.hlo_fusions))
  if result.cpu_model:  # The CPU and the versions behind the figures.
    figures.append(('CPU', result.cpu_model))
  figures += [(n, v or 'not installed') for n, v in result.versions.items()]
  settings = [(f'`{k}`', f'`{v!r}`') for k, v in _fields(config)]
  lines = [
    f'# {result.dataset}, jit={result.jit}, {result.device}',
    '',
    markdown.table(('figure', 'value'), 'll', figures),
    '',
    '## Config',
    '',
    markdown.table(('field', 'value'), 'll', settings),
    '',
    '## Profile',
    '',
    *_profile_lines(result.profile, result.workdir),
    '',
    '## Files',
    '',
    *_file_links(result, result.workdir),
  ]
  return '\n'.join(lines) + '\n'


def _fields(config: ml_collections.ConfigDict) -> Iterator[tuple[str, object]]:
  """Each field by its path, a group's only where set (`optimizer_args.X`)."""
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from ((f'{name}.{k}', v) for k, v in value.items() if v is not None)
    else:
      yield name, value


def _profile_lines(profile: dict | None, workdir: str) -> list[str]:
  if not profile:
    return [
      'None: `--config.profile_steps=0`, the profiler failed (the run'
      ' printed why), or the run trained no step (it found them done).'
    ]
  top = [(f'`{name}`', f'{ms:.3f}') for name, ms in profile['top_ops']]
  lines = [
    f'Traced: {profile["said"]}.',
    '',
    markdown.table(('op', 'self time ms/step'), 'll', top),
  ]
  if profile['why']:  # What the top kernels were made of.
    lines += ['', 'The top kernels, and the TF ops each was made of:', '']
    lines += [f'- {line.strip()}' for line in profile['why']]
  capture = _link(os.path.dirname(profile['xplane_path']), workdir)
  return [*lines, '', f"Capture for TensorBoard's Profile tab: {capture}."]


def _file_links(result: outputs.Result, workdir: str) -> list[str]:
  """Links to what the run wrote; the dumps' only when present."""
  paths = [os.path.join(workdir, outputs.RESULT_FILE)]
  if result.profile:
    paths.append(result.profile['trace_path'])
  for pattern in (os.path.join(layout.HLO_DIR, '*'), layout.CLUSTER_DIR):
    paths += sorted(glob.glob(os.path.join(glob.escape(workdir), pattern)))
  return [f'- {_link(p, workdir)}' for p in paths]


def _link(path: str, workdir: str) -> str:
  rel = os.path.relpath(path, workdir) + ('/' if os.path.isdir(path) else '')
  return f'[{rel}]({rel})'
