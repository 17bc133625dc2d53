"""`report.md`: one page per run that a reader opens first.

`result.json` is for programs; the report puts the same figures, the config
they came from, the profile's top ops and links to every file the run wrote
(relative, so the workdir can be moved or published) on one page.
"""

from __future__ import annotations

import glob
import os

import ml_collections

# trainer calls write_report: `trainer` is only read at call time.
from xla_mnist import files, hlo, outputs

REPORT_FILE = 'report.md'
COMPARE_FILE = 'compare.png'  # The jit modes side by side, when plotted.


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
  measured = outputs.measured
  lines = [
    f'# {result.dataset}, jit={result.jit}, {result.device}',
    '',
    '| figure | value |',
    '| --- | --- |',
    f'| test accuracy | {result.test_accuracy:.4f} |',
    f'| final loss | {measured(result.final_loss, ".4f")} |',
    f'| steps | {result.steps} of {result.batch_size},'
    f' {result.steps_per_loop} per call |',
    f'| compile | {measured(result.compile_seconds, ".2f", " s")} |',
    f'| train | {measured(result.train_seconds, ".2f", " s")} |',
    '| checkpoints and profiler |'
    f' {measured(result.other_seconds, ".2f", " s")} |',
    f'| steps/s | {measured(result.steps_per_second, ",.0f")} |',
    f'| traces | {result.traces} |',
  ]
  if result.hlo_fusions is not None:
    lines.append(
      f'| XLA fusions in the optimized step | {result.hlo_fusions} |'
    )
  if result.peak_host_mib is not None:
    lines.append(f'| peak memory | {result.memory()} |')
  lines += _machine_lines(result)
  lines += ['', '## Config', '', '| field | value |', '| --- | --- |']
  lines += [f'| `{key}` | `{value!r}` |' for key, value in config.items()]
  lines += ['', *_profile_lines(result.profile, workdir)]
  lines += ['## Files', '', *_file_links(result, workdir)]
  return '\n'.join(lines) + '\n'


def _machine_lines(result: outputs.Result) -> list[str]:
  """The CPU and the versions behind the figures, when recorded."""
  lines = [f'| CPU | {result.cpu_model} |'] if result.cpu_model else []
  lines += [
    f'| {name} | {version or "not installed"} |'
    for name, version in result.versions.items()
  ]
  return lines


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
    f'{profile["steps"]} traced steps, {profile["mean_step_ms"]:.3f} ms/step,'
    f' {profile["fusions"]} XLA fusions/step.',
    '',
    '| op | self time ms/step |',
    '| --- | --- |',
  ]
  lines += [f'| `{name}` | {ms:.3f} |' for name, ms in profile['top_ops']]
  capture = _link(os.path.dirname(profile['xplane_path']), workdir)
  return [*lines, '', f"Capture for TensorBoard's Profile tab: {capture}.", '']


def _file_links(result: outputs.Result, workdir: str) -> list[str]:
  """Links to what the run wrote; optional outputs only when present."""
  paths = [os.path.join(workdir, outputs.RESULT_FILE)]
  if result.profile:
    paths.append(result.profile['trace_path'])
  paths += sorted(
    glob.glob(os.path.join(glob.escape(workdir), hlo.HLO_DIR, '*'))
  )
  paths += [
    os.path.join(workdir, name)
    for name in (hlo.CLUSTER_DIR, COMPARE_FILE)
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
