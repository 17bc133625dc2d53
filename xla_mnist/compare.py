r"""Trains one recipe in every jit mode and puts the figures side by side.

  python -m xla_mnist.compare --config=fashion_mnist \
      [--workdir=logs/compare-fashion_mnist] [--config.num_steps=2000]

Each mode is its own `python -m xla_mnist.train` process, because
auto-clustering is process-wide: `off`, `on` and `auto` call the compiled
step once per batch, `fused` runs the XLA loop of `steps_per_loop` steps per
call (the config's, 0 = the default). Flags other than --workdir go to every
run, after `--config.profile_steps=0 --xla_cache_dir=`: unless asked for, no
profiler capture is timed as training, and XLA really compiles. Each run
writes its usual outputs to `<workdir>/<mode>`; the comparison goes to
`<workdir>/compare.{md,json,png}`; the chart needs matplotlib, the `plot`
extra (`pip install 'xla_mnist[plot]'`), and is left out without it.
"""

from __future__ import annotations

# First: catches stop signals before the imports below (see `cli`).
from xla_mnist import cli  # isort: skip

import dataclasses
import importlib.util
import io
import json
import os
import subprocess
import sys

from absl import flags

from xla_mnist import files, outputs
from xla_mnist.errors import Interrupted, UsageError, UserError

_WORKDIR: flags.FlagHolder | None = None


@dataclasses.dataclass(frozen=True)
class Mode:
  name: str
  flags: tuple[str, ...]  # Given to the training run after the user's flags.


MODES = (
  Mode('off', ('--jit=off', '--config.steps_per_loop=1')),
  Mode('on', ('--jit=on', '--config.steps_per_loop=1')),
  Mode('auto', ('--jit=auto', '--config.steps_per_loop=1')),
  Mode('fused', ('--jit=on',)),
)
FILES = ('compare.md', 'compare.json', 'compare.png')
# Unless the user's say otherwise: no capture to time as training, and a
# real compile to time, not a load from the XLA cache.
DEFAULT_FLAGS = ('--config.profile_steps=0', '--xla_cache_dir=')


class RunFailed(UserError):
  """A training run failed; compare exits with the run's exit code."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


def config_name(train_flags: list[str]) -> str:
  """The config file's base name, as `train` names its default workdir."""
  path = 'default'
  for i, arg in enumerate(train_flags):
    if arg.startswith('--config='):
      path = arg.split('=', 1)[1]
    elif arg == '--config' and i + 1 < len(train_flags):
      path = train_flags[i + 1]
  return os.path.splitext(os.path.basename(path))[0]


def _given(flag: str, train_flags: list[str]) -> bool:
  name = flag.split('=', 1)[0]
  return any(arg.split('=', 1)[0] == name for arg in train_flags)


def train(mode: Mode, train_flags: list[str], workdir: str) -> dict:
  """Runs `mode` in its own process; returns its `result.json`.

  The run is in a session of its own, so that a terminal's Ctrl-C reaches
  it once, through this process: each stop signal that reaches compare is
  passed on, and compare waits for the run to save and stop (a second signal
  stops it at once), then stops with the signal's exit code.
  """
  command = [
    sys.executable,
    '-m',
    'xla_mnist.train',
    *train_flags,  # --config=FILE must precede --config.x=... overrides.
    *(f for f in DEFAULT_FLAGS if not _given(f, train_flags)),
    *mode.flags,
    '--fresh',  # Time a whole run, not what is left after a checkpoint.
    f'--workdir={workdir}',
  ]
  proc = subprocess.Popen(
    command,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,
  )
  signum = 0
  while True:
    try:
      _, stderr = proc.communicate()
      break
    except Interrupted as e:
      signum = e.signum
      proc.send_signal(signum)
  if signum:
    raise Interrupted(
      signum,
      f'the {mode.name} run stopped (exit {proc.returncode}); no comparison'
      ' written: run compare again',
    )
  lines = [line for line in stderr.splitlines() if line.strip()]
  if proc.returncode:
    raise RunFailed(
      f'the {mode.name} run failed (exit {proc.returncode}):'
      f' {lines[-1].strip() if lines else "no error output"}',
      exit_code=max(proc.returncode, 1),  # A signal's negative code is 1.
    )
  with open(os.path.join(workdir, outputs.RESULT_FILE)) as f:
    return json.load(f)


def table(results: dict[str, dict]) -> str:
  """The runs as a Markdown table; speed-up is steps/s over `off`'s."""
  base = results['off']['steps_per_second']
  rows = [
    '| mode | jit | steps/call | compile s | train s | ms/step | steps/s'
    ' | vs off | final loss | test accuracy | traces |',
    '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: '
    '| ---: |',
  ]
  for mode, r in results.items():
    rows.append(
      f'| {mode} | {r["jit"]} | {r["steps_per_loop"]}'
      f' | {r["compile_seconds"]:.2f} | {r["train_seconds"]:.2f}'
      f' | {1e3 / r["steps_per_second"]:.3f} | {r["steps_per_second"]:,.0f}'
      f' | {r["steps_per_second"] / base:.2f}x | {r["final_loss"]:.4f}'
      f' | {r["test_accuracy"]:.4f} | {r["traces"]} |'
    )
  return '\n'.join(rows)


def chart(results: dict[str, dict], title: str) -> bytes:
  """A PNG: step time and compile time per mode, side by side."""
  # Here, not at the top: matplotlib is optional, and training never needs it.
  from matplotlib import figure  # noqa: PLC0415

  modes = list(results)
  panels = (
    ('step time (ms)', [1e3 / r['steps_per_second'] for r in results.values()]),
    ('compile time (s)', [r['compile_seconds'] for r in results.values()]),
  )
  fig = figure.Figure(figsize=(9, 3.5))  # No pyplot: no global GUI state.
  for ax, (label, values) in zip(fig.subplots(1, 2), panels, strict=True):
    bars = ax.bar(modes, values)
    ax.bar_label(bars, fmt='%.3g')
    ax.set_title(label)
    ax.margins(y=0.15)
  fig.suptitle(title)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)
  return png.getvalue()


def compare(train_flags: list[str], workdir: str) -> dict[str, dict]:
  """Trains every mode, writes the comparison files; returns the results."""
  if _given('--jit', train_flags):
    raise UsageError('compare runs every jit mode: drop --jit')
  outputs.prepare_workdir(workdir)
  results = {}
  for mode in MODES:
    print(f'training {mode.name} ...', flush=True)
    results[mode.name] = train(
      mode, train_flags, os.path.join(workdir, mode.name)
    )
  first = results['off']
  title = (
    f'{first["dataset"]}, {first["steps"]} steps of {first["batch_size"]},'
    f' {first["device"]}'
  )
  text = table(results)
  files.write_atomically(
    os.path.join(workdir, 'compare.md'), f'# {title}\n\n{text}\n'
  )
  report = {'title': title, 'flags': train_flags, 'results': results}
  files.write_atomically(
    os.path.join(workdir, 'compare.json'), json.dumps(report, indent=2) + '\n'
  )
  print(title)
  print(text)
  if importlib.util.find_spec('matplotlib'):
    png = chart(results, title)
    files.write_atomically(os.path.join(workdir, 'compare.png'), png)
  else:
    print("no compare.png: pip install 'xla_mnist[plot]' for the chart")
  return results


def main(argv: list[str]) -> None:
  cli.unwind_on_signals()  # From here on files are written.
  train_flags = argv[1:]  # absl left them: the training runs parse them.
  workdir = _WORKDIR.value or os.path.join(
    'logs', f'compare-{config_name(train_flags)}'
  )
  compare(train_flags, workdir)
  written = [f for f in FILES if os.path.exists(os.path.join(workdir, f))]
  print(f'outputs in {workdir}: {", ".join(written)}')


def _parse_flags(argv: list[str]) -> list[str]:
  """Parses --workdir; every other flag is left for the training runs.

  Defined here, not at import, so that a notebook can import this module
  beside `train`, which has a --workdir of its own.
  """
  global _WORKDIR
  _WORKDIR = flags.DEFINE_string(
    'workdir',
    None,
    'Output folder: a sub-folder per mode and the comparison. Default:'
    ' ./logs/compare-<config name>.',
  )
  return flags.FLAGS(argv, known_only=True)


def run() -> None:
  """The `xla-mnist-compare` console script."""
  cli.run(main, _parse_flags)


if __name__ == '__main__':
  run()
