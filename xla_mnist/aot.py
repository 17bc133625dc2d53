r"""Compiles a trained run ahead of time into `classify`, a C++ program.

  python -m xla_mnist.aot --workdir=logs/fashion_mnist-on

From the workdir's latest checkpoint: a SavedModel whose signatures take a
fixed batch of uint8 images (and one image) and return logits and classes;
XLA's AOT compiler (tfcompile, through TF's Python API) turns each into an
object file and a header; `classify.cc` is linked against them and XLA's
runtime, which is built once per TF version and cached. The result is checked
before it is kept: `classify` and the Python model must predict the same class
for every image of the test split. Everything lands in `<workdir>/aot`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
from absl import app, flags, logging

# No TensorFlow yet: it is imported once the flags have passed their checks.
from xla_mnist import aot_build, env, files
from xla_mnist.errors import DataError, UsageError, UserError

FASHION_DIR = '/usr/share/datasets/fashion-mnist'
# Logits may differ by float rounding (another summation order), no more.
LOGIT_RTOL, LOGIT_ATOL = 1e-5, 1e-4

# Defined by `parse_flags`, not at import, so that the package's modules
# import side by side (train has a --workdir of its own).
_WORKDIR: flags.FlagHolder
_OUT_DIR: flags.FlagHolder
_RUNTIME_DIR: flags.FlagHolder
_BATCH_SIZE: flags.FlagHolder
_TARGET_CPU: flags.FlagHolder
_CHECK_DIR: flags.FlagHolder


def _define_flags() -> None:
  global _WORKDIR, _OUT_DIR, _RUNTIME_DIR, _BATCH_SIZE, _TARGET_CPU, _CHECK_DIR
  _WORKDIR = flags.DEFINE_string(
    'workdir', None, 'A training run whose latest checkpoint is compiled.'
  )
  _OUT_DIR = flags.DEFINE_string(
    'out_dir', None, 'Where classify and its parts go. Default: <workdir>/aot.'
  )
  _RUNTIME_DIR = flags.DEFINE_string(
    'runtime_dir',
    None,
    "XLA's AOT runtime, built here once and reused. Default:"
    f' ${aot_build.RUNTIME_ENV}, else'
    ' $XDG_CACHE_HOME/xla_mnist/aot-runtime/<TF version>.',
  )
  _BATCH_SIZE = flags.DEFINE_integer(
    'batch_size', 100, 'The fixed batch classify runs (and batch 1).'
  )
  # x86-64 psABI levels, which LLVM knows as CPU names; a name LLVM does not
  # know aborts tfcompile, so the flag takes these only.
  _TARGET_CPU = flags.DEFINE_enum(
    'target_cpu',
    'x86-64',
    ['x86-64', 'x86-64-v2', 'x86-64-v3', 'x86-64-v4'],
    'CPU level the model is compiled for: x86-64 runs on any (SSE2), v3 needs'
    ' AVX2 and FMA, v4 AVX-512.',
  )
  _CHECK_DIR = flags.DEFINE_string(
    'check_dir',
    FASHION_DIR,
    'IDX folder whose test split classify and the Python model must agree on;'
    ' empty: skip the check.',
  )


def _fail(message: str, exit_code: int) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(exit_code)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag is one line and exit code 2."""
  _define_flags()
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(f'{str(e).splitlines()[0]} (see --helpshort)', 2)


def _checkpoint_dir(workdir: str) -> str:
  """The run's checkpoint folder, or a one-line error naming the fix."""
  if not workdir:
    raise UsageError('--workdir is required: pass a training run folder')
  if not os.path.isdir(workdir):
    raise DataError(
      f'workdir {workdir} does not exist: pass the --workdir of a training run'
    )
  checkpoints = os.path.join(workdir, 'checkpoints')
  if not os.path.isfile(os.path.join(checkpoints, 'checkpoint')):
    raise DataError(
      f'{workdir} has no checkpoint: train first (python -m xla_mnist.train'
      f' --workdir={workdir})'
    )
  return checkpoints


def _check_flags() -> None:
  if _BATCH_SIZE.value < 1:
    raise UsageError(f'--batch_size={_BATCH_SIZE.value}: must be at least 1')
  if _CHECK_DIR.value and not os.path.isdir(_CHECK_DIR.value):
    raise DataError(
      f'check folder {_CHECK_DIR.value} does not exist: pass --check_dir with'
      " the IDX test set's folder, or --check_dir= to skip the check"
    )


def _restore(checkpoints: str):
  """The Keras model with the latest checkpoint's weights, checked."""
  import tensorflow as tf

  from xla_mnist import model

  net = model.create_model()
  path = tf.train.latest_checkpoint(checkpoints)
  if path is None:
    raise DataError(f'{checkpoints} names no readable checkpoint: train again')
  try:
    status = tf.train.Checkpoint(model=net).restore(path).expect_partial()
    status.assert_existing_objects_matched()
  except (tf.errors.OpError, AssertionError, ValueError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
    raise DataError(f'cannot restore {path} ({first})') from None
  return net, path


def _save_model(net, path: str, batch_size: int) -> None:
  """A SavedModel: uint8 images [batch, 28, 28, 1] -> logits and classes.

  Keras's ExportArchive rather than tf.saved_model.save of a tf.Module: the
  latter tracks each Keras 3 variable twice, and tfcompile's freezing step
  then reads a handle that its restore never filled.
  """
  import keras
  import tensorflow as tf

  from xla_mnist import model

  def classify(images):
    logits = net(model.preprocess(images), training=False)
    classes = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return {'logits': logits, 'classes': classes}

  archive = keras.export.ExportArchive()
  archive.track(net)
  for key, batch in (('serving_default', batch_size), ('batch_one', 1)):
    spec = tf.TensorSpec([batch, 28, 28, 1], tf.uint8, name='images')
    archive.add_endpoint(key, classify, input_signature=[spec])
  archive.write_out(path, verbose=False)


def _check(
  net,
  binary: str,
  check_dir: str,
  split: tuple[np.ndarray, np.ndarray],
  work: str,
) -> list[str]:
  """Runs classify on the test split beside the Python model; lines to print.

  Raises a `UserError` when any class differs or a logit is off by more
  than float rounding.
  """
  from xla_mnist import model

  images, labels = split
  expected = np.concatenate(
    [
      net(model.preprocess(images[i : i + 1000]), training=False).numpy()
      for i in range(0, len(images), 1000)
    ]
  )
  logits_path = os.path.join(work, 'check_logits.f32')
  done = subprocess.run(
    [binary, f'--logits={logits_path}', check_dir],
    capture_output=True,
    text=True,
  )
  if done.returncode:
    raise UserError(f'classify failed on {check_dir}: {done.stderr.strip()}')
  got = np.fromfile(logits_path, np.float32).reshape(expected.shape)
  os.remove(logits_path)
  agree = int((got.argmax(1) == expected.argmax(1)).sum())
  worst = float(np.abs(got - expected).max()) if len(got) else 0.0
  python_accuracy = float((expected.argmax(1) == labels).mean())
  lines = [
    f'checked on {len(labels)} test images of {check_dir}: classes agree on'
    f' {agree}/{len(labels)}, logits differ by at most {worst:.2g}',
    f'test accuracy: classify {done.stdout.split()[2]},'
    f' Python model {python_accuracy:.4f}{_run_accuracy()}',
    done.stdout.splitlines()[1],
  ]
  if agree != len(labels) or not np.allclose(
    got, expected, rtol=LOGIT_RTOL, atol=LOGIT_ATOL
  ):
    raise UserError(f'classify disagrees with the Python model: {lines[0]}')
  return lines


def _run_accuracy() -> str:
  """The training run's own figure from its result.json, when there is one."""
  try:
    with open(os.path.join(_WORKDIR.value, 'result.json')) as f:
      return f', training run {json.load(f)["test_accuracy"]:.4f}'
  except (OSError, ValueError, KeyError, TypeError):
    return ''


def export() -> str:
  """Builds and checks `classify` in a temporary folder, then renames it."""
  checkpoints = _checkpoint_dir(_WORKDIR.value)
  _check_flags()
  aot_build.check_toolchain()
  out_dir = os.path.abspath(
    _OUT_DIR.value or os.path.join(_WORKDIR.value, 'aot')
  )
  runtime_dir = _RUNTIME_DIR.value or aot_build.default_runtime_dir()
  work = files.temp_dir_beside(out_dir, '.aot-', '--out_dir')
  try:
    with env.importing_tensorflow():
      import tensorflow as tf

    tf.get_logger().setLevel('ERROR')  # tfcompile's TF1 deprecation notes.
    net, path = _restore(checkpoints)
    print(f'checkpoint: {path}', flush=True)
    if _CHECK_DIR.value:  # Read now: bad files fail before the build.
      from xla_mnist import idx_builder

      split = idx_builder.read_split(_CHECK_DIR.value, 'test')
    _save_model(net, os.path.join(work, 'saved_model'), _BATCH_SIZE.value)
    aot_build.aot_compile(
      os.path.join(work, 'saved_model'), work, _TARGET_CPU.value
    )
    archive = aot_build.ensure_runtime(runtime_dir)
    binary = aot_build.link(work, archive)
    if _CHECK_DIR.value:
      lines = _check(net, binary, _CHECK_DIR.value, split, work)
    else:
      lines = ['not checked against the Python model: --check_dir is empty']
    old = out_dir + '.old'
    if os.path.exists(out_dir):
      os.rename(out_dir, old)
    os.chmod(work, 0o755)  # mkdtemp's 0700 would hide it from others.
    os.rename(work, out_dir)
    shutil.rmtree(old, ignore_errors=True)
  except BaseException:
    shutil.rmtree(work, ignore_errors=True)
    raise
  print('\n'.join(lines))
  return os.path.join(out_dir, 'classify')


def main(argv: list[str]) -> None:
  if not flags.FLAGS['verbosity'].present:  # As train.py: no INFO chatter.
    logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    _fail(f'unexpected arguments {" ".join(argv[1:])}: flags only', 2)
  try:
    binary = export()
  except UserError as e:
    _fail(str(e), e.exit_code)
  print(f'classify: {binary} (run it with an IDX folder or image file)')


def run() -> None:
  """The `xla-mnist-aot` console script."""
  env.quiet_by_default()
  app.run(main, flags_parser=parse_flags)


if __name__ == '__main__':
  run()
