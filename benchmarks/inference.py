r"""Inference speed of an exported run: classify, jit in Python, SavedModel.

  python -m xla_mnist.aot --workdir=W
  python -m benchmarks.inference --workdir=W [--repeats=3] [--out=FILE.json]

Three ways to classify the Fashion-MNIST test split with the run's model:
`classify`, the AOT binary of `xla_mnist.aot`; `jit` the Keras model
restored from the checkpoint inside tf.function(jit_compile=True); and
`saved_model`, the export's SavedModel loaded with tf.saved_model.load and
called through its signatures. Each classifies all 10,000 images at batch 1
and at the export's fixed batch, after one warm-up call; the figures are the
fastest of `--repeats` passes. Start-up is the wall time of a fresh process
that loads the model, classifies one image and exits; peak memory is the
maximum resident set of the process that ran the timed passes. Every
variant runs in processes of its own (`timer.timed`), so that none shares
another's memory or warm caches. `make bench` runs this too, on a run it
trains and exports (`bench.py`).
"""

from __future__ import annotations

import datetime
import functools
import gzip
import json
import os
import re
import struct
import sys
import tempfile
import time
from collections.abc import Callable

from absl import flags

# No TensorFlow here: the variants import it in their own processes.
from benchmarks import machine, process, results, timer
from xla_mnist.runtime import cli, env, errors, layout
from xla_mnist.runtime.errors import UsageError, UserError
from xla_mnist.workdir import files

FASHION_DIR = layout.DEBIAN_FASHION_MNIST

# Defined by `_define_flags` when run as a program, not at import: the
# benchmark imports this module beside flags of its own (--repeats, --out).
_WORKDIR: flags.FlagHolder
_REPEATS: flags.FlagHolder
_OUT: flags.FlagHolder
_CHILD: flags.FlagHolder
_STARTUP: flags.FlagHolder


def _restored_model(workdir: str):
  """The Keras model of the run's newest whole checkpoint (the model and
  data's facts it records), its shapes checked against its fingerprint."""
  from xla_mnist import model  # noqa: PLC0415 - in its own process.
  from xla_mnist.export import trained  # noqa: PLC0415

  net = model.create_model(**trained.model_recipe(workdir))
  trained.restore_model(net, workdir)
  return net


def _jit(workdir: str, batch: int) -> Callable:
  """The restored Keras model in tf.function(jit_compile=True)."""
  del batch  # Traced for each batch size it meets.
  import tensorflow as tf  # noqa: PLC0415

  from xla_mnist import model  # noqa: PLC0415

  net = _restored_model(workdir)
  return tf.function(
    lambda images: net(model.inputs(net, images), training=False),
    jit_compile=True,
  )


def _saved_model(workdir: str, batch: int) -> Callable:
  """The export's SavedModel, through its signature for the batch size."""
  import tensorflow as tf  # noqa: PLC0415

  loaded = tf.saved_model.load(os.path.join(workdir, 'aot', 'saved_model'))
  signatures = {
    batch: loaded.signatures['serving_default'],
    1: loaded.signatures['batch_one'],
  }
  return lambda images: signatures[len(images)](images=images)['logits']


# The Python variants: f(workdir, fixed batch) -> f(uint8 images) -> logits.
CLASSIFIERS = {'jit': _jit, 'saved_model': _saved_model}


def _child(name: str, workdir: str, startup: bool, repeats: int) -> None:
  """Runs in its own process; prints its figures as one JSON line."""
  import tensorflow as tf  # noqa: PLC0415

  from xla_mnist.datasets import idx_builder  # noqa: PLC0415

  images, _ = idx_builder.read_split(FASHION_DIR, 'test')
  batch = _export_batch(workdir)
  classify = CLASSIFIERS[name](workdir, batch)
  if startup:
    classify(tf.constant(images[:1])).numpy()
    return
  figures = {'batch': batch}
  for size, key in ((1, 'batch_1'), (batch, 'batch_fixed')):
    batches = [
      tf.constant(images[i : i + size]) for i in range(0, len(images), size)
    ]
    classify(batches[0]).numpy()  # Warm-up: traces and compiles.
    passes = []
    for _ in range(repeats):
      start = time.perf_counter()
      for b in batches:
        classify(b).numpy()
      passes.append(time.perf_counter() - start)
    figures[f'us_per_image_{key}'] = min(passes) * 1e6 / len(images)
  print(json.dumps(figures))


def _export_batch(workdir: str) -> int:
  from tensorflow.python.tools import saved_model_utils  # noqa: PLC0415

  meta = saved_model_utils.get_meta_graph_def(
    os.path.join(workdir, 'aot', 'saved_model'), 'serve'
  )
  shape = meta.signature_def['serving_default'].inputs['images'].tensor_shape
  return shape.dim[0].size


def _classify_figures(workdir: str, repeats: int, one_image: str) -> dict:
  binary = os.path.join(workdir, 'aot', 'classify')
  figures = {}
  for flag, key in ((['--batch=1'], 'batch_1'), ([], 'batch_fixed')):
    runs = [timer.timed([binary, *flag, FASHION_DIR]) for _ in range(repeats)]
    per_image = [
      float(re.search(r'([\d.]+) us per', r.stdout)[1]) for r in runs
    ]
    figures[f'us_per_image_{key}'] = min(per_image)
    figures['peak_mib'] = max(r.peak_mib for r in runs)
  starts = [timer.timed([binary, one_image]) for _ in range(repeats)]
  figures['startup_seconds'] = min(s.wall_seconds for s in starts)
  return figures


def _python_figures(
  name: str, workdir: str, repeats: int, one_image: str
) -> dict:
  del one_image  # The child takes the test split's first image.
  base = [sys.executable, '-m', 'benchmarks.inference', f'--child={name}']
  base.append(f'--workdir={workdir}')
  starts = [timer.timed([*base, '--startup']) for _ in range(repeats)]
  passes = timer.timed([*base, f'--repeats={repeats}'])
  return {
    **json.loads(passes.stdout.strip().splitlines()[-1]),
    'peak_mib': passes.peak_mib,
    'startup_seconds': min(s.wall_seconds for s in starts),
  }


# Every variant: f(workdir, repeats, one-image IDX file) -> its figures.
VARIANTS = {
  'classify': _classify_figures,
  **{name: functools.partial(_python_figures, name) for name in CLASSIFIERS},
}


def _write_one_image(path: str) -> str:
  """The test split's first image as an IDX file of one image."""
  images = os.path.join(FASHION_DIR, layout.IDX_FILES['test'][0])
  with gzip.open(images) as f:
    pixels = f.read(16 + 28 * 28)[16:]
  with open(path, 'wb') as f:
    f.write(struct.pack('>4i', layout.IMAGE_MAGIC, 1, 28, 28) + pixels)
  return path


def check_export(workdir: str) -> None:
  """UserError unless `workdir` holds a run exported by xla_mnist.aot, on
  the images it times: Fashion-MNIST's (its result.json says which)."""
  if not os.path.isfile(os.path.join(workdir, 'aot', 'classify')):
    raise UserError(
      f'no export in {workdir}: run python -m xla_mnist.aot'
      f' --workdir={workdir} first'
    )
  try:
    with open(os.path.join(workdir, layout.RESULT_FILE)) as f:
      shape = json.load(f).get('image_shape') or [28, 28, 1]
  except (OSError, ValueError, AttributeError):
    return  # An older or unfinished run's: (Fashion-)MNIST's, or classify says.
  if shape != [28, 28, 1]:
    raise UserError(
      f'{workdir} trained on images of {"x".join(map(str, shape))}: the'
      " benchmark times Fashion-MNIST's 28x28x1 test images; pass an export"
      ' of a run on those'
    )


def measure(workdir: str, repeats: int) -> dict:
  """Every variant on the export in `workdir`: the report's inference part."""
  workdir = os.path.abspath(workdir)  # The variants run from the repository.
  check_export(workdir)
  if repeats < 1:
    raise UsageError(f'{errors.arg("repeats", repeats)}: must be at least 1')
  with tempfile.TemporaryDirectory(prefix='xla_mnist_inference_') as scratch:
    one_image = _write_one_image(os.path.join(scratch, 'one_image.idx'))
    figures = {
      name: variant(workdir, repeats, one_image)
      for name, variant in VARIANTS.items()
    }
  return {'workdir': workdir, 'repeats': repeats, 'results': figures}


def export_run(folder: str, data_dir: str, steps: int) -> str:
  """Trains the recipe into `folder`/run and exports it; returns the run.

  XLA's AOT runtime is built once and cached where `xla_mnist.aot` keeps it.
  """
  workdir = os.path.join(folder, 'run')
  timer.timed(
    process.train_command(workdir, data_dir, f'--config.num_steps={steps}')
  )
  timer.timed([sys.executable, '-m', 'xla_mnist.aot', f'--workdir={workdir}'])
  return workdir


def _define_flags() -> None:
  global _WORKDIR, _REPEATS, _OUT, _CHILD, _STARTUP
  _WORKDIR = flags.DEFINE_string('workdir', None, 'An exported training run.')
  _REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed passes; the fastest.')
  _OUT = flags.DEFINE_string(
    'out', 'logs/inference.json', 'Where the figures and the machine go.'
  )
  _CHILD = flags.DEFINE_enum(
    'child', None, list(CLASSIFIERS), 'Internal: run one Python variant.'
  )
  _STARTUP = flags.DEFINE_bool(
    'startup', False, 'Internal: with --child, classify one image and exit.'
  )


def _parse_flags(argv: list[str]) -> list[str]:
  env.quiet_by_default()
  _define_flags()
  return cli.parse(argv)


def main(argv: list[str]) -> None:
  if _CHILD.value:
    _child(_CHILD.value, _WORKDIR.value, _STARTUP.value, _REPEATS.value)
    return
  if len(argv) > 1:
    raise UserError(f'unexpected arguments {" ".join(argv[1:])}: flags only')
  if not _WORKDIR.value:
    raise UsageError('--workdir is required: pass an exported training run')
  cli.unwind_on_signals()  # From here on files are written.
  figures = measure(_WORKDIR.value, _REPEATS.value)
  with env.importing_tensorflow():
    described = machine.describe()
  report = {
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds'
    ),
    'machine': described,
    **figures,
  }
  os.makedirs(os.path.dirname(_OUT.value) or '.', exist_ok=True)
  files.write_atomically(_OUT.value, json.dumps(report, indent=2) + '\n')
  print(results.inference_table(report))
  print(f'figures and machine in {_OUT.value}')


if __name__ == '__main__':
  cli.run(main, _parse_flags)
