"""What a run leaves in its workdir, written so that nothing is half-written.

`result.json` carries a schema version, the config, the library versions and
the CPU, so that results from other days and machines can be compared; an
older file still reads, with what it lacks named. It is strict JSON: a figure
the run did not measure (or that is not finite) is null, never 0 or NaN, and
the summary and the report say "not measured". `FIGURES` is the one place
that names a run's figures: the summary, `report.md`, the TensorBoard
scalars and `compare` read them from there.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import math
import os
import platform
import resource
import sys

import ml_collections

from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files

LOGGER = logging.getLogger(__name__)
RESULT_FILE = layout.RESULT_FILE
# 1: the figures only; 2: config, versions, CPU model and peak memory too;
# 3: null for what was not measured, `paused_seconds`, `data_source`.
SCHEMA_VERSION = 4
# Fields that older schemas named otherwise: old name -> name.
RENAMED = {'other_seconds': 'paused_seconds'}
# Distributions whose versions decide the figures (and xprof the profile).
VERSIONED = ('tensorflow', 'keras', 'tensorflow-datasets', 'xprof')


@dataclasses.dataclass(frozen=True)
class Result:
  """The figures of one finished run; `result.json` holds them too."""

  dataset: str
  jit: str
  device: str
  steps: int
  batch_size: int
  steps_per_loop: int  # Training steps per call of the compiled function.
  # The last step's loss: measured, or restored from the checkpoint.
  final_loss: float | None
  test_accuracy: float
  # The time figures are None when this process trained no step (it found
  # them done) or, for train time and rate, none after the compiling call.
  # XLA's compile (or a load from its cache), traced beforehand: a zero-step
  # call of the fused loop, or the first call (one update included) of the
  # per-step function.
  compile_seconds: float | None
  train_seconds: float | None  # The steps after that, less `paused_seconds`.
  # Between calls: checkpoint saves, logging, the profiler's start and stop.
  paused_seconds: float | None
  steps_per_second: float | None
  traces: int  # Python traces of the training function; 1 = no retracing.
  hlo_fusions: int | None  # --dump_hlo with --jit=on: fusions in the step.
  profile: dict | None  # The traced window's `profiling.ProfileSummary`.
  workdir: str
  # Schema 2. Defaults are what a schema-1 file reads as.
  schema_version: int = 1
  # The process's peak resident memory (the TF1 timeline's memory figures).
  peak_host_mib: float | None = None
  # The device allocator's peak, where TF tracks one (GPU, TPU); None on CPU.
  device_peak_mib: float | None = None
  config: dict = dataclasses.field(default_factory=dict)
  versions: dict = dataclasses.field(default_factory=dict)
  cpu_model: str = ''
  # Schema 3: the digest of the data's source (`data.Data.source_digest`).
  data_source: str = ''
  # Schema 4: the model's dtype policy (`float32`, `mixed_bfloat16`, ...),
  # what its outputs are (`logits` or `probabilities`: docs/models.md), and
  # `model.losses` (regularizers, add_loss) at the end, the part of the
  # training loss that is not the data's; None for a model without any.
  precision: str = ''
  outputs: str = ''
  model_losses: float | None = None

  def summary(self) -> str:
    return '\n'.join(
      [
        f'test accuracy {self.test_accuracy:.4f}'
        f'  ({self.dataset}, jit={self.jit}, device={self.device})',
        f'{self.steps} steps of {self.batch_size}:'
        f' compile {FIGURES["compile_seconds"].text(self)},'
        f' train {FIGURES["train_seconds"].text(self)}'
        f' ({FIGURES["steps_per_second"].text(self)};'
        f' checkpoints, logging and profiler'
        f' {FIGURES["paused_seconds"].text(self)}),'
        f' final loss {FIGURES["final_loss"].text(self)}',
        *(
          [
            f'model.losses (regularizers, add_loss) of the trained model on'
            f' a test batch: {self.model_losses:.4g}'
          ]
          if self.model_losses is not None
          else []
        ),
        *([f'peak memory: {self.memory()}'] if self.peak_host_mib else []),
        f'outputs in {self.workdir} (tensorboard --logdir {self.workdir})'
        if self.workdir
        else 'outputs: none kept by this process',
      ]
    )

  def memory(self) -> str:
    """The peaks in words: host, and the device's where TF tracks it."""
    text = f'host {self.peak_host_mib:,.0f} MiB'
    if self.device_peak_mib is not None:
      text += f', {self.device} {self.device_peak_mib:,.1f} MiB'
    return text


def measured(value: float | None, spec: str, unit: str = '') -> str:
  """A figure in words: formatted, or 'not measured' for None."""
  return 'not measured' if value is None else f'{value:{spec}}{unit}'


@dataclasses.dataclass(frozen=True)
class Figure:
  """One figure of a run, as every place that shows it words it."""

  field: str  # Of `Result`, and of result.json.
  label: str
  spec: str  # Its format.
  unit: str = ''
  tag: str = ''  # The TensorBoard scalar at the run's last step, if any.
  optional: bool = False  # Left out, not "not measured", when absent.

  def of(self, result: Result) -> float | None:
    return getattr(result, self.field)

  def text(self, result: Result) -> str:
    return self.show(self.of(result))

  def show(self, value: float | None) -> str:
    return measured(value, self.spec, self.unit)


FIGURES = {
  f.field: f
  for f in (
    Figure('test_accuracy', 'test accuracy', '.4f'),
    Figure('final_loss', 'final loss', '.4f'),
    Figure('compile_seconds', 'compile', '.2f', ' s', 'perf/compile_seconds'),
    Figure('train_seconds', 'train', '.2f', ' s'),
    Figure('paused_seconds', 'checkpoints, logging and profiler', '.2f', ' s'),
    Figure(
      'steps_per_second',
      'speed',
      ',.0f',
      ' steps/s',
      'perf/run_steps_per_second',
    ),
    Figure(
      'peak_host_mib',
      'peak host memory',
      ',.0f',
      ' MiB',
      'memory/peak_host_mib',
      optional=True,
    ),
    Figure(
      'device_peak_mib',
      'peak device memory',
      ',.1f',
      ' MiB',
      'memory/device_peak_mib',
      optional=True,
    ),
  )
}


def outcome_scalars(result: Result) -> dict[str, float]:
  """The figures TensorBoard charts at the run's end; none unmeasured."""
  return {
    f.tag: f.of(result)
    for f in FIGURES.values()
    if f.tag and f.of(result) is not None
  }


def _finite(value: object) -> object:
  """`value` with every non-finite float in it made None (JSON's null)."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  return value


def prepare_workdir(workdir: str) -> str:
  """Creates `workdir` and checks that it can be written; returns its path."""
  files.ensure_writable_dir(workdir, 'workdir', 'workdir')
  return workdir


def check_not_compared(workdir: str) -> None:
  """UserError when `workdir` is a compare's: a run there would replace its
  TensorBoard events (with `fresh`) and mix its files with compare's."""
  if os.path.isfile(os.path.join(workdir, layout.COMPARE_FILE)):
    raise UserError(
      f'workdir {workdir} holds a comparison ({layout.COMPARE_FILE}), whose'
      ' files a run would replace: pass another'
      f' {errors.arg("workdir", "DIR")}'
    )


def peak_host_mib() -> float:
  """This process's peak resident set size so far, in MiB."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  # Linux counts KiB, macOS bytes.
  return peak / (2**20 if sys.platform == 'darwin' else 2**10)


def recipe(config: ml_collections.ConfigDict) -> dict[str, object]:
  """What a result records of the config it ran."""
  return {
    'dataset': config.dataset,
    'jit': config.jit,
    'batch_size': config.batch_size,
    'config': config.to_dict(),
  }


def machine() -> dict[str, object]:
  """What a result records of where it ran: the schema, the process's peak
  memory, the versions and the CPU."""
  return {
    'schema_version': SCHEMA_VERSION,
    'peak_host_mib': peak_host_mib(),
    'versions': versions(),
    'cpu_model': cpu_model(),
  }


def versions() -> dict[str, str]:
  """The installed versions of `VERSIONED`, read without importing them."""
  found = {}
  for name in VERSIONED:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = ''
  return found


def cpu_model() -> str:
  """The CPU's model name (Linux's /proc/cpuinfo), else what Python says."""
  return cpuinfo('model name') or platform.processor() or platform.machine()


def cpuinfo(field: str) -> str:
  """The first CPU's `field` in Linux's /proc/cpuinfo; '' elsewhere."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith(field):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return ''


def load_result(path: str) -> tuple[Result, list[str]]:
  """Reads a `result.json`; returns it and the schema-2 fields it lacks.

  Raises ValueError, naming them, when it lacks any field older files have.
  An older file's NaN (a figure it did not measure) reads as None.
  """
  with open(path) as f:
    stored = _finite(json.load(f))
  if not isinstance(stored, dict):
    raise ValueError(f'{path} holds no JSON object')
  for old, new in RENAMED.items():  # Older schemas' names.
    if old in stored:
      stored.setdefault(new, stored.pop(old))
  fields = {f.name: f for f in dataclasses.fields(Result)}
  missing = [name for name in fields if name not in stored]
  required = [
    name
    for name in missing
    if fields[name].default is dataclasses.MISSING
    and fields[name].default_factory is dataclasses.MISSING
  ]
  if required:
    raise ValueError(f'{path} lacks {", ".join(required)}')
  known = {k: v for k, v in stored.items() if k in fields}
  return Result(**known), missing


def read_result(workdir: str) -> Result | None:
  """The `result.json` of a finished run in `workdir`, if it has one.

  An older file reads with defaults; a line says which fields it lacks.
  """
  path = os.path.join(workdir, RESULT_FILE)
  try:
    result, missing = load_result(path)
  except FileNotFoundError:
    return None
  except (OSError, ValueError, TypeError) as e:
    LOGGER.info(
      f'note: {path} is unreadable ({e}): the run counts as unfinished'
    )
    return None
  if missing:
    LOGGER.info(
      f'note: {path} is schema {result.schema_version} (now'
      f' {SCHEMA_VERSION}): it has no {", ".join(missing)}'
    )
  return result


def write_result(result: Result) -> str:
  path = os.path.join(result.workdir, RESULT_FILE)
  stored = _finite(dataclasses.asdict(result))
  text = json.dumps(stored, indent=2, allow_nan=False)
  files.write_atomically(path, text + '\n')
  return path


def finished_line(result: Result, workdir: str, num_steps: int) -> str:
  """What a run found finished says of its workdir, after its result."""
  held = result.steps
  if held == num_steps:
    return (
      f'{workdir} holds this finished run ({held} steps), left as it is:'
      f' pass {errors.arg("fresh", True)} to train again'
    )
  return (
    f'{workdir} holds a finished run of {held} steps, more than'
    f' {errors.field("num_steps", num_steps)} asks: the result above is'
    f" that run's, left as it is; pass {errors.arg('fresh', True)} to train"
    f' {num_steps} steps instead, or another'
    f' {errors.arg("workdir", "DIR")}'
  )
