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
variant runs in processes of its own, so that none shares another's memory
or warm caches.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import platform
import re
import struct
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # As train.py: no C++ log.

from absl import app, flags  # noqa: E402

from xla_mnist import outputs  # noqa: E402 - imports no TF.

FASHION_DIR = '/usr/share/datasets/fashion-mnist'
VARIANTS = ('classify', 'jit', 'saved_model')

_WORKDIR = flags.DEFINE_string('workdir', None, 'An exported training run.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed passes; the fastest.')
_OUT = flags.DEFINE_string(
  'out', 'logs/inference.json', 'Where the figures and the machine go.'
)
_CHILD = flags.DEFINE_enum(
  'child', None, ['jit', 'saved_model'], 'Internal: run one Python variant.'
)
_STARTUP = flags.DEFINE_bool(
  'startup', False, 'Internal: with --child, classify one image and exit.'
)


def _python_variant(name: str, workdir: str, batch: int):
  """Returns f(uint8 images) -> logits for the jit or SavedModel variant."""
  import tensorflow as tf

  from xla_mnist import model

  if name == 'saved_model':
    loaded = tf.saved_model.load(os.path.join(workdir, 'aot', 'saved_model'))
    signatures = {
      batch: loaded.signatures['serving_default'],
      1: loaded.signatures['batch_one'],
    }
    return lambda images: signatures[len(images)](images=images)['logits']
  net = model.create_model()
  path = tf.train.latest_checkpoint(os.path.join(workdir, 'checkpoints'))
  status = tf.train.Checkpoint(model=net).restore(path).expect_partial()
  status.assert_existing_objects_matched()
  return tf.function(
    lambda images: net(model.preprocess(images), training=False),
    jit_compile=True,
  )


def _child(name: str, workdir: str, startup: bool, repeats: int) -> None:
  """Runs in its own process; prints its figures as one JSON line."""
  import tensorflow as tf

  from xla_mnist import idx_builder

  images, _ = idx_builder.read_split(FASHION_DIR, 'test')
  batch = _export_batch(workdir)
  classify = _python_variant(name, workdir, batch)
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
  from tensorflow.python.tools import saved_model_utils

  meta = saved_model_utils.get_meta_graph_def(
    os.path.join(workdir, 'aot', 'saved_model'), 'serve'
  )
  shape = meta.signature_def['serving_default'].inputs['images'].tensor_shape
  return shape.dim[0].size


def _measure(command: list[str]) -> tuple[float, float, str]:
  """Runs `command`: (wall seconds, peak resident MiB, stdout)."""
  start = time.perf_counter()
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
  stdout = proc.stdout.read()
  _, status, usage = os.wait4(proc.pid, 0)
  seconds = time.perf_counter() - start
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode:
    sys.exit(f'error: {command[0]} failed (exit code {proc.returncode})')
  return seconds, usage.ru_maxrss / 1024, stdout


def _classify_figures(workdir: str, repeats: int, one_image: str) -> dict:
  binary = os.path.join(workdir, 'aot', 'classify')
  figures = {}
  for flag, key in ((['--batch=1'], 'batch_1'), ([], 'batch_fixed')):
    runs = [_measure([binary, *flag, FASHION_DIR]) for _ in range(repeats)]
    per_image = [float(re.search(r'([\d.]+) us per', r[2])[1]) for r in runs]
    figures[f'us_per_image_{key}'] = min(per_image)
    figures['peak_mib'] = max(r[1] for r in runs)
  starts = [_measure([binary, one_image]) for _ in range(repeats)]
  figures['startup_seconds'] = min(s[0] for s in starts)
  return figures


def _python_figures(name: str, workdir: str, repeats: int) -> dict:
  base = [sys.executable, '-m', 'benchmarks.inference', f'--child={name}']
  base.append(f'--workdir={workdir}')
  starts = [_measure([*base, '--startup']) for _ in range(repeats)]
  _, peak, stdout = _measure([*base, f'--repeats={repeats}'])
  return {
    **json.loads(stdout.strip().splitlines()[-1]),
    'peak_mib': peak,
    'startup_seconds': min(s[0] for s in starts),
  }


def _write_one_image(path: str) -> str:
  """The test split's first image as an IDX file of one image."""
  with gzip.open(os.path.join(FASHION_DIR, 't10k-images-idx3-ubyte.gz')) as f:
    pixels = f.read(16 + 28 * 28)[16:]
  with open(path, 'wb') as f:
    f.write(struct.pack('>4i', 2051, 1, 28, 28) + pixels)
  return path


def main(argv: list[str]) -> None:
  del argv
  workdir = _WORKDIR.value
  if not workdir or not os.path.isfile(
    os.path.join(workdir, 'aot', 'classify')
  ):
    sys.exit(
      f'error: no export in {workdir}: run python -m xla_mnist.aot first'
    )
  if _CHILD.value:
    _child(_CHILD.value, workdir, _STARTUP.value, _REPEATS.value)
    return
  one_image = _write_one_image(os.path.join(workdir, 'aot', 'one_image.idx'))
  results = {
    'classify': _classify_figures(workdir, _REPEATS.value, one_image),
    'jit': _python_figures('jit', workdir, _REPEATS.value),
    'saved_model': _python_figures('saved_model', workdir, _REPEATS.value),
  }
  report = {
    'date': datetime.datetime.now().isoformat(timespec='seconds'),
    'cpu': outputs.cpu_model(),
    'cores': os.cpu_count(),
    'python': platform.python_version(),
    'onednn': os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default'),
    'workdir': workdir,
    'repeats': _REPEATS.value,
    'results': results,
  }
  print(_table(results))
  os.makedirs(os.path.dirname(_OUT.value) or '.', exist_ok=True)
  with open(_OUT.value + '.tmp', 'w') as f:
    json.dump(report, f, indent=2)
  os.replace(_OUT.value + '.tmp', _OUT.value)
  print(f'figures and machine in {_OUT.value}')


def _table(results: dict) -> str:
  lines = [
    '| variant | batch 1: us/image | images/s | fixed batch: us/image'
    ' | images/s | start-up s | peak MiB |',
    '|---|---:|---:|---:|---:|---:|---:|',
  ]
  for name, r in results.items():
    one, fixed = r['us_per_image_batch_1'], r['us_per_image_batch_fixed']
    lines.append(
      f'| {name} | {one:.2f} | {1e6 / one:,.0f} | {fixed:.3f}'
      f' | {1e6 / fixed:,.0f} | {r["startup_seconds"]:.3f}'
      f' | {r["peak_mib"]:.0f} |'
    )
  return '\n'.join(lines)


if __name__ == '__main__':
  app.run(main)
