"""`result.json`, written whole, and `FIGURES`, the one phrasing of a run's
figures (the summary, `report.md`, TensorBoard, `compare`). The file records
the config, versions and CPU, so that runs of other days and machines compare;
strict JSON: a figure not measured (or not finite) is null, never 0 or NaN."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import resource
import sys

import ml_collections

from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files

RESULT_FILE = layout.RESULT_FILE
# 1: the figures; 2: config, versions, CPU, peak memory; 3: null if not
# measured, `paused_seconds`, `data_source`; 4: `precision`, `outputs`,
# `model_losses`; 5: `image_shape`, `class_names`. `recorded` reads every one
# back.
SCHEMA_VERSION = 6
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
  final_loss: float | None  # Measured, or restored from the checkpoint.
  test_accuracy: float
  # None if this process trained no step (found them done) or, for train and
  # rate, none after the compiling call: XLA's compile or cache load, by a
  # zero-step fused call or the per-step function's first (one update in it).
  compile_seconds: float | None
  train_seconds: float | None  # The steps after that, less `paused_seconds`.
  paused_seconds: float | None  # Between calls: saves, logs, the profiler.
  steps_per_second: float | None
  traces: int  # Python traces of the training function; 1 = no retracing.
  hlo_fusions: int | None  # --dump_hlo with --jit=on: fusions in the step.
  profile: dict | None  # The traced window's `profiling.ProfileSummary`.
  workdir: str
  schema_version: int = 1  # Schema 2 on; a schema-1 file gets the defaults.
  peak_host_mib: float | None = None  # docs/profiling.md, "Memory".
  device_peak_mib: float | None = None  # None on CPU.
  config: dict = dataclasses.field(default_factory=dict)
  versions: dict = dataclasses.field(default_factory=dict)
  cpu_model: str = ''
  data_source: str = ''  # Schema 3: `data.Data.source_digest`.
  # Schema 4 (docs/models.md): the dtype policy, `logits` or `probabilities`,
  # and `model.losses` at the end (None for a model without any).
  precision: str = ''
  outputs: str = ''
  model_losses: float | None = None
  # Schema 5 (docs/data.md): the data's facts, as the model was built for.
  image_shape: list[int] = dataclasses.field(default_factory=list)
  class_names: list[str] = dataclasses.field(default_factory=list)
  # Schema 6: what changes the trajectory, as the fingerprint holds it.
  recipe: dict = dataclasses.field(default_factory=dict)

  def summary(self) -> str:
    said = {name: figure.text(self) for name, figure in FIGURES.items()}
    lines = [
      f'test accuracy {self.test_accuracy:.4f}'
      f'  ({self.dataset}, jit={self.jit}, device={self.device})',
      f'{self.steps} steps of {self.batch_size}:'
      f' compile {said["compile_seconds"]}, train {said["train_seconds"]}'
      f' ({said["steps_per_second"]}; checkpoints, logging and profiler'
      f' {said["paused_seconds"]}), final loss {said["final_loss"]}',
    ]
    if self.model_losses is not None:
      lines.append(
        'model.losses (regularizers, add_loss) of the trained model on a test'
        f' batch: {self.model_losses:.4g}'
      )
    if self.peak_host_mib:  # And the device's, where TF tracks it.
      lines.append(f'peak memory: host {said["peak_host_mib"]}')
      if self.device_peak_mib is not None:
        lines[-1] += f', {self.device} {said["device_peak_mib"]}'
    lines.append(
      f'outputs in {self.workdir} (tensorboard --logdir {self.workdir})'
      if self.workdir
      else 'outputs: none kept by this process'
    )
    return '\n'.join(lines)


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
    return measured(self.of(result), self.spec, self.unit)


FIGURES = {f.field: f for f in (
  Figure('test_accuracy', 'test accuracy', '.4f'),
  Figure('final_loss', 'final loss', '.4f'),
  Figure('compile_seconds', 'compile', '.2f', ' s', 'perf/compile_seconds'),
  Figure('train_seconds', 'train', '.2f', ' s'),
  Figure('paused_seconds', 'checkpoints, logging and profiler', '.2f', ' s'),
  Figure('steps_per_second', 'speed', ',.0f', ' steps/s',
         'perf/run_steps_per_second'),
  Figure('peak_host_mib', 'peak host memory', ',.0f', ' MiB',
         'memory/peak_host_mib', optional=True),
  Figure('device_peak_mib', 'peak device memory', ',.1f', ' MiB',
         'memory/device_peak_mib', optional=True),
)}  # fmt: skip


def outcome_scalars(result: Result) -> dict[str, float]:
  """The figures TensorBoard charts at the run's end; none unmeasured."""
  return {
    f.tag: f.of(result)
    for f in FIGURES.values()
    if f.tag and f.of(result) is not None
  }


def finite(value: object) -> object:
  """`value` with every non-finite float in it made None (JSON's null)."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [finite(v) for v in value]
  return value


def write_result(result: Result) -> str:
  """Writes `<workdir>/result.json` atomically; returns its path."""
  path = os.path.join(result.workdir, RESULT_FILE)
  text = json.dumps(
    finite(dataclasses.asdict(result)), indent=2, allow_nan=False
  )
  files.write_atomically(path, text + '\n')
  return path


def prepare_workdir(workdir: str) -> None:
  """Creates `workdir` and checks that it can be written."""
  files.ensure_writable_dir(workdir, 'workdir', 'workdir')


def check_not_compared(workdir: str) -> None:
  """UserError when `workdir` is a compare's: a run there would replace its
  TensorBoard events (with `fresh`) and mix its files with compare's."""
  if os.path.isfile(os.path.join(workdir, layout.COMPARE_FILE)):
    raise UserError(
      f'workdir {workdir} holds a comparison ({layout.COMPARE_FILE}), whose'
      ' files a run would replace: pass another'
      f' {errors.arg("workdir", "DIR")}'
    )


def recipe(config: ml_collections.ConfigDict) -> dict[str, object]:
  """What a result records of the config it ran (the data: a folder's
  path, or the dataset's name)."""
  return {
    'dataset': config.image_dir or config.dataset,
    'jit': config.jit,
    'batch_size': config.batch_size,
    'config': config.to_dict(),
  }


def machine() -> dict[str, object]:
  """What a result records of where it ran."""
  return {
    'schema_version': SCHEMA_VERSION,
    'peak_host_mib': peak_host_mib(),
    'versions': versions(),
    'cpu_model': cpu_model(),
  }


def peak_host_mib() -> float:
  """This process's peak resident set size so far, in MiB."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (2**20 if sys.platform == 'darwin' else 2**10)  # B, KiB.


def versions() -> dict[str, str]:
  """`VERSIONED`'s installed versions ('' if not), read without importing."""
  found = dict.fromkeys(VERSIONED, '')
  for name in VERSIONED:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
      found[name] = importlib.metadata.version(name)
  return found


def cpu_model() -> str:
  """The CPU's model name (Linux's /proc/cpuinfo), else what Python says."""
  return cpuinfo('model name') or platform.processor() or platform.machine()


def cpuinfo(field: str) -> str:
  """The first CPU's `field` in Linux's /proc/cpuinfo; '' elsewhere."""
  with contextlib.suppress(OSError), open('/proc/cpuinfo') as f:
    for line in f:
      if line.startswith(field):
        return line.split(':', 1)[1].strip()
  return ''
