r"""Compiles a trained run ahead of time into `classify`, a C++ program.

  python -m xla_mnist.aot --workdir=logs/fashion_mnist-on

From the workdir's latest checkpoint (or `--checkpoint`), once its recipe
fingerprint says it holds this model: a SavedModel whose signatures take a
fixed batch of uint8 images (and one image) and return logits and classes;
XLA's AOT compiler (tfcompile, through TF's Python API) turns each into an
object file and a header; `classify.cc` is linked against them and XLA's
runtime, which is built once per TF version and cached. The result is checked
before it is kept: `classify` and the Python model must predict the same class
for every image of the test split. Everything lands in `<workdir>/aot`,
built in a temporary folder beside it and renamed there whole; while it
writes into the workdir, the export holds the workdir's lock, as training
does. Every failure is one `error:` line (docs/aot.md lists them).
"""

from __future__ import annotations

# First: catches stop signals before the imports below (see `cli`).
from xla_mnist.runtime import cli  # isort: skip

import contextlib
import json
import os
import shutil
import subprocess

import numpy as np
from absl import flags, logging

# No TensorFlow yet: it is imported once the flags have passed their checks.
from xla_mnist.export import build
from xla_mnist.runtime import env, errors, layout
from xla_mnist.runtime.errors import DataError, UsageError, UserError
from xla_mnist.workdir import files

FASHION_DIR = layout.DEBIAN_FASHION_MNIST
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
_CHECKPOINT: flags.FlagHolder


def _define_flags() -> None:
  global _WORKDIR, _OUT_DIR, _RUNTIME_DIR, _BATCH_SIZE, _TARGET_CPU, _CHECK_DIR
  global _CHECKPOINT
  _WORKDIR = flags.DEFINE_string(
    'workdir', None, 'A training run whose latest checkpoint is compiled.'
  )
  _CHECKPOINT = flags.DEFINE_string(
    'checkpoint',
    None,
    'A checkpoint of <workdir>/checkpoints to compile by name (ckpt-N)'
    ' instead of the latest. Default: the one its pointer file names.',
  )
  _OUT_DIR = flags.DEFINE_string(
    'out_dir', None, 'Where classify and its parts go. Default: <workdir>/aot.'
  )
  _RUNTIME_DIR = flags.DEFINE_string(
    'runtime_dir',
    None,
    "XLA's AOT runtime, built here once and reused. Default:"
    f' ${build.RUNTIME_ENV}, else'
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


def parse_flags(argv: list[str]) -> list[str]:
  """Defines the flags (see `cli`), then parses them: a bad one is one line,
  exit 2."""
  _define_flags()
  return cli.parse(argv)


def _check_workdir(workdir: str) -> None:
  """A run's folder with checkpoints, or a one-line error naming the fix
  (before TF's import: at once)."""
  if not workdir:
    raise UsageError('--workdir is required: pass a training run folder')
  if not os.path.isdir(workdir):
    raise DataError(
      f'workdir {workdir} does not exist: pass the --workdir of a training run'
    )
  checkpoints = os.path.join(workdir, layout.CHECKPOINT_DIR)
  names = os.listdir(checkpoints) if os.path.isdir(checkpoints) else []
  if not any(n == 'checkpoint' or n.endswith('.index') for n in names):
    raise DataError(
      f'{workdir} has no checkpoint: train first (python -m xla_mnist.train'
      f' --workdir={workdir})'
    )


def _check_flags() -> None:
  if _BATCH_SIZE.value < 1:
    raise UsageError(f'--batch_size={_BATCH_SIZE.value}: must be at least 1')
  if _CHECKPOINT.value is not None and (
    not _CHECKPOINT.value or os.sep in _CHECKPOINT.value
  ):
    raise UsageError(
      f'--checkpoint={_CHECKPOINT.value}: pass the name of a checkpoint of'
      ' <workdir>/checkpoints, like ckpt-1000'
    )
  if _CHECK_DIR.value and not os.path.isdir(_CHECK_DIR.value):
    raise DataError(
      f'check folder {_CHECK_DIR.value} does not exist: pass --check_dir with'
      " the IDX test set's folder, or --check_dir= to skip the check"
    )


def _out_dir(workdir: str) -> str:
  """--out_dir (default <workdir>/aot), absolute, once it is safe to replace.

  An export replaces the folder whole, so it must be an earlier export's, an
  empty one or a new one: anything else would be deleted.
  """
  out_dir = os.path.abspath(_OUT_DIR.value or os.path.join(workdir, 'aot'))
  if _is_inside(workdir, out_dir):
    raise UsageError(
      f'--out_dir={out_dir} would replace the training run {workdir}: pass a'
      f' folder of its own, like {os.path.join(workdir, "aot")} (the default)'
    )
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise UserError(
      f'--out_dir {out_dir} is a file: pass {errors.arg("out_dir", "DIR")}'
    )
  if (
    os.path.isdir(out_dir)
    and os.listdir(out_dir)
    and not os.path.isfile(os.path.join(out_dir, 'classify'))
  ):
    raise UserError(
      f'--out_dir {out_dir} holds files other than an export, which would be'
      f' replaced: pass a new or empty {errors.arg("out_dir", "DIR")}'
    )
  return out_dir


def _hold_workdir(
  stack: contextlib.ExitStack, workdir: str, writes_there: bool
) -> str:
  """Takes the workdir's lock, as training does, until `stack` closes.

  Held, no run can start there and replace the checkpoint being read, or
  find an export half-renamed in its folder. Returns '' or, when a live run
  holds it and the export writes elsewhere, a note saying so: its latest
  checkpoint is then a mid-training one.
  """
  try:
    stack.enter_context(files.workdir_lock(workdir))
  except UserError as e:
    # files' message names train's fix; keep its "who", give the export's.
    held = str(e).partition(': wait for it to end')[0]
    if writes_there:
      raise UserError(
        f'{held}: wait for it to end, or pass {errors.arg("out_dir", "DIR")}'
        ' outside'
        f' {workdir} to export the checkpoint it saved last'
      ) from None
    return f'note: {held}: this is its latest checkpoint, not its final one'
  except OSError as e:  # A read-only or full workdir cannot hold a lock file.
    if writes_there:
      raise UserError(
        f'workdir {workdir} cannot be written ({e.strerror}): free space'
        f' there, or pass {errors.arg("out_dir", "DIR")} on another disk'
      ) from None
  return ''


def _quiet_tf_log(tf) -> None:
  """TF's Python log (tfcompile's TF1 deprecation notes, latest_checkpoint's
  "Couldn't match files") off stderr, where the error line goes; every
  failure it reports becomes that line. --verbosity or TF_CPP_MIN_LOG_LEVEL
  below 3 keeps it."""
  if not (flags.FLAGS['verbosity'].present or env.verbose()):
    tf.get_logger().setLevel('CRITICAL')


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
    said = done.stderr.strip().removeprefix('error: ')  # classify's one line.
    raise UserError(f'classify failed on {check_dir}: {said}')
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
    with open(os.path.join(_WORKDIR.value, layout.RESULT_FILE)) as f:
      return f', training run {json.load(f)["test_accuracy"]:.4f}'
  except (OSError, ValueError, KeyError, TypeError):
    return ''


def export() -> str:
  """Builds and checks `classify` in a temporary folder, then renames it."""
  _check_workdir(_WORKDIR.value)
  _check_flags()
  out_dir = _out_dir(_WORKDIR.value)
  build.check_toolchain()
  inside = _is_inside(out_dir, _WORKDIR.value)
  runtime_dir = _RUNTIME_DIR.value or build.default_runtime_dir()
  with contextlib.ExitStack() as held:
    live = _hold_workdir(held, _WORKDIR.value, writes_there=inside)
    with env.importing_tensorflow():
      import tensorflow as tf

      from xla_mnist import model
      from xla_mnist.workdir import checkpointing, reporting

    # From here on files are written: a signal unwinds, removing them.
    cli.unwind_on_signals()
    reporting.show_lines()
    _quiet_tf_log(tf)
    work = files.temp_dir_beside(out_dir, '.aot-', 'out_dir')
    try:
      net = model.create_model()
      path = checkpointing.restore_model(
        net, _WORKDIR.value, name=_CHECKPOINT.value
      )
      if not inside:  # Read: a live run may save again, nothing is written.
        held.close()
      print(f'checkpoint: {path}', flush=True)
      if live:
        print(live, flush=True)
      lines = _build(net, work, runtime_dir)
      _replace(work, out_dir)
    except (OSError, tf.errors.OpError) as e:
      shutil.rmtree(work, ignore_errors=True)
      raise _disk_error(e, work, runtime_dir) from None
    except BaseException:
      shutil.rmtree(work, ignore_errors=True)
      raise
  print('\n'.join(lines))
  return os.path.join(out_dir, 'classify')


def _build(net, work: str, runtime_dir: str) -> list[str]:
  """Compiles, links and checks `classify` in `work`; the lines to print."""
  if _CHECK_DIR.value:  # Read now: bad files fail before the build.
    from xla_mnist.datasets import idx_builder

    split = idx_builder.read_split(
      _CHECK_DIR.value,
      'test',
      other='point --check_dir at the IDX test set, or --check_dir= to skip'
      ' the check',
    )
    if not len(split[1]):
      raise DataError(
        f'check folder {_CHECK_DIR.value} holds no test images: pass'
        ' --check_dir with the IDX test set, or --check_dir= to skip the check'
      )
  _save_model(net, os.path.join(work, 'saved_model'), _BATCH_SIZE.value)
  build.aot_compile(os.path.join(work, 'saved_model'), work, _TARGET_CPU.value)
  archive = build.ensure_runtime(runtime_dir)
  binary = build.link(work, archive)
  if not _CHECK_DIR.value:
    return ['not checked against the Python model: --check_dir is empty']
  return _check(net, binary, _CHECK_DIR.value, split, work)


def _replace(work: str, out_dir: str) -> None:
  """Puts the finished `work` in the place of `out_dir` (an earlier export).

  Between the two renames `out_dir` is absent for a moment, its old content
  in `<work>.replaced`; it never holds a mix of two exports.
  """
  os.chmod(work, 0o755)  # mkdtemp's 0700 would hide it from others.
  if os.path.exists(out_dir):
    os.rename(out_dir, work + '.replaced')
  os.rename(work, out_dir)
  shutil.rmtree(work + '.replaced', ignore_errors=True)


def _is_inside(path: str, folder: str) -> bool:
  """Whether `path` is `folder` or lies in it, links resolved."""
  path, folder = os.path.realpath(path), os.path.realpath(folder)
  return os.path.commonpath([path, folder]) == folder


def _disk_error(error: Exception, work: str, runtime_dir: str) -> UserError:
  """A failed write (a full disk, mostly) as one line naming the flag to
  change. TF's own errors name no file: they come from the SavedModel and
  tfcompile's writes, into the export's folder."""
  where = getattr(error, 'filename', None) or work
  arg = 'runtime_dir' if _is_inside(where, runtime_dir) else 'out_dir'
  place = runtime_dir if arg == 'runtime_dir' else os.path.dirname(work)
  return UserError(
    f'cannot write {place} ({errors.first_line(error)}): free space'
    f' there, or pass another {errors.arg(arg, "DIR")}'
  )


def main(argv: list[str]) -> None:
  if not flags.FLAGS['verbosity'].present:  # As train.py: no INFO chatter.
    logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {" ".join(argv[1:])}: flags only')
  binary = export()
  print(f'classify: {binary} (run it with an IDX folder or image file)')


def run() -> None:
  """The `xla-mnist-aot` console script."""
  env.quiet_by_default()
  cli.run(main, parse_flags)


if __name__ == '__main__':
  run()
