"""A trained run compiled ahead of time into `classify`, as a Python call.

  import functools

  from xla_mnist import model
  from xla_mnist.export import classifier, trained

  net = model.create_model(**trained.model_recipe('logs/fashion_mnist-on'))
  exported = classifier.export(
    net, functools.partial(model.inputs, net), 'logs/fashion_mnist-on'
  )
  exported.binary, exported.check.agree

From the workdir's latest checkpoint (or `checkpoint`), once its recipe
fingerprint says it holds this model: a SavedModel whose signatures take a
fixed batch of uint8 images of the run's shape (the checkpoint records it),
and one image, and return logits and classes;
XLA's AOT compiler (tfcompile, through TF's Python API) turns each into an
object file and a header; `classify.cc` is linked against them and XLA's
runtime, which is built once per TF version and cached (`build`). The result
is checked before it is kept: `classify` and the Python model must predict
the same class for every image of a test split, IDX files of the run's
shape (`check_dir`), or images the caller gives (`check_data`), which the
export writes as IDX files into its temporary folder. Everything lands in
`<workdir>/aot`, built in a temporary folder beside it and renamed there
whole; while it writes into the workdir, the export holds the workdir's
lock, as training does. Every failure is a `UserError` naming its argument
(docs/aot.md lists them).

The caller gives the model and its preprocessing (the recipe's), as it
gives `trained.restore_model` the model to fill: the machinery does
not import the recipe. `check` needs no TensorFlow, so that the command
line runs it before TF's import of seconds; `export` runs it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import logging
import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from xla_mnist.export import build
from xla_mnist.runtime import console, errors, layout
from xla_mnist.runtime.errors import DataError, UsageError, UserError
from xla_mnist.workdir import files

LOGGER = logging.getLogger(__name__)

# The check's folder for a run on (Fashion-)MNIST's images and classes.
FASHION_DIR = layout.DEBIAN_FASHION_MNIST
MNIST_SHAPE, MNIST_CLASSES = (28, 28, 1), 10
# IDX: 0, 0, 0x08 (unsigned bytes), then the number of dimensions.
UNSIGNED_BYTES = 0x0800
GZIP_MAGIC = b'\x1f\x8b'
DEFAULT_TARGET_CPU = 'x86-64'
DEFAULT_BATCH_SIZE = 100
# Logits may differ by float rounding (another summation order), no more.
LOGIT_RTOL, LOGIT_ATOL = 1e-5, 1e-4

# uint8 images [B, H, W, C] -> the model's input (`model.inputs`).
Preprocess = Callable[[Any], Any]


def image_dims(image_shape: tuple[int, ...]) -> int:
  """The dimensions of an IDX file of images of `image_shape` (H, W, C), as
  classify reads them: 3 (N, H, W) for one channel, 4 (N, H, W, C) for more;
  its magic number is `UNSIGNED_BYTES` plus them (2051, 2052)."""
  return 3 if image_shape[-1] == 1 else 4


def test_files(image_shape: tuple[int, ...]) -> tuple[str, str]:
  """The IDX test files classify reads in a folder (gzipped or not), for
  images of `image_shape`: (Fashion-)MNIST's names, `idx4` for 4 dims."""
  dims = image_dims(image_shape)
  return f't10k-images-idx{dims}-ubyte.gz', 't10k-labels-idx1-ubyte.gz'


def image_format(image_shape: tuple[int, ...]) -> str:
  """The IDX image files of `image_shape`, in words (classify's too)."""
  dims = image_dims(image_shape)
  shown = ', '.join(map(str, image_shape[: dims - 1]))
  return (
    f'an IDX file of magic {UNSIGNED_BYTES + dims} with dimensions N, {shown}'
  )


def shape_text(image_shape: tuple[int, ...]) -> str:
  """28x28x1."""
  return 'x'.join(map(str, image_shape))


@dataclasses.dataclass(frozen=True)
class CheckData:
  """Test images the caller gives the check in place of an IDX folder: the
  export writes them as IDX files for classify (`test_files`)."""

  images: Any  # uint8 [N, H, W, C], the run's image shape.
  labels: Any  # Integers [N], 0 to the run's classes - 1.
  source: str = 'the given test images'  # What they are, in the check's line.


@dataclasses.dataclass(frozen=True)
class Check:
  """`classify` beside the Python model on one test split: why it was kept."""

  check_dir: str  # The IDX folder read; '' for `CheckData`'s images.
  source: str  # What the images are: the folder, or `CheckData.source`.
  images: int
  agree: int  # Images whose class is the same from both.
  max_logit_difference: float
  classify_accuracy: float
  python_accuracy: float
  run_accuracy: float | None  # The training run's result.json, if it has one.
  speed: str  # classify's own timing line.

  def lines(self) -> list[str]:
    """The check as the command prints it."""
    run = (
      ''
      if self.run_accuracy is None
      else f', training run {self.run_accuracy:.4f}'
    )
    return [
      f'checked on {self.images} test images of {self.source}: classes'
      f' agree on {self.agree}/{self.images}, logits differ by at most'
      f' {self.max_logit_difference:.2g}',
      f'test accuracy: classify {self.classify_accuracy:.4f}, Python model'
      f' {self.python_accuracy:.4f}{run}',
      self.speed,
    ]


@dataclasses.dataclass(frozen=True)
class Exported:
  """What `export` made: the program, what it was made from, its check."""

  binary: str  # <out_dir>/classify
  checkpoint: (
    str  # The checkpoint's prefix, e.g. <workdir>/checkpoints/ckpt-200.
  )
  check: Check | None  # None when check_dir is empty.

  def lines(self) -> list[str]:
    """The check's lines, as the command prints them."""
    if self.check:
      return self.check.lines()
    return [
      'not checked against the Python model:'
      f' {errors.arg("check_dir")} is empty'
    ]


def check(
  workdir: str,
  *,
  out_dir: str | None = None,
  checkpoint: str | None = None,
  check_dir: str | None = None,
  check_data: CheckData | None = None,
  target_cpu: str = DEFAULT_TARGET_CPU,
  batch_size: int = DEFAULT_BATCH_SIZE,
) -> str:
  """The export's arguments, its folders and the C++ toolchain, checked
  without TensorFlow; returns the absolute `out_dir` (default <workdir>/aot).
  A `check_dir` left None is checked once the checkpoint names the run's
  images (`export`).

  Raises:
    errors.UserError: naming the argument to change.
  """
  _check_workdir(workdir)
  if batch_size < 1:
    raise UsageError(
      f'{errors.arg("batch_size", batch_size)}: must be at least 1'
    )
  if checkpoint is not None and (not checkpoint or os.sep in checkpoint):
    raise UsageError(
      f'{errors.arg("checkpoint", checkpoint)}: pass the name of a checkpoint'
      ' of <workdir>/checkpoints, like ckpt-1000'
    )
  # LLVM aborts the process on a CPU name it does not know.
  if target_cpu not in build.TARGET_CPUS:
    raise UsageError(
      f'{errors.arg("target_cpu", target_cpu)}: pass one of'
      f' {", ".join(build.TARGET_CPUS)}'
    )
  if check_data is not None and check_dir is not None:
    raise UsageError(
      f'{errors.arg("check_dir", check_dir)} and check_data both name the'
      ' test images to check on: pass one'
    )
  if check_dir:
    _check_folder_exists(check_dir)
  out_dir = _out_dir(workdir, out_dir)
  build.check_toolchain()
  return out_dir


def export(
  net: Any,
  preprocess: Preprocess,
  workdir: str,
  *,
  out_dir: str | None = None,
  checkpoint: str | None = None,
  check_dir: str | None = None,
  check_data: CheckData | None = None,
  target_cpu: str = DEFAULT_TARGET_CPU,
  batch_size: int = DEFAULT_BATCH_SIZE,
  runtime_dir: str = '',
  quiet: bool = False,
) -> Exported:
  """Restores `net` (a Keras model of the recipe's, whose weights the
  checkpoint fills) from `workdir`, compiles it with `preprocess` into
  `classify` for the run's images (their shape and class count as the
  checkpoint records them), checks it on a test split and puts it in
  `out_dir`, replacing an earlier export whole. The split: `check_dir`'s IDX
  files of the run's shape ('' skips the check) or `check_data`'s images;
  neither, Fashion-MNIST's (`FASHION_DIR`), for a run of its shape only.

  `checkpoint` names one of the run's (ckpt-N) instead of its newest;
  `target_cpu` is an x86-64 psABI level (`build.TARGET_CPUS`); `runtime_dir`
  keeps XLA's AOT runtime (default `build.default_runtime_dir()`). Its lines
  go to the `xla_mnist` logger (`quiet`: warnings only).

  Raises:
    errors.UserError: naming the argument to change; nothing is left
      half-written, and an earlier export stays as it was.
  """
  out_dir = check(
    workdir,
    out_dir=out_dir,
    checkpoint=checkpoint,
    check_dir=check_dir,
    check_data=check_data,
    target_cpu=target_cpu,
    batch_size=batch_size,
  )
  runtime_dir = runtime_dir or build.default_runtime_dir()
  inside = _is_inside(out_dir, workdir)
  import tensorflow as tf

  from xla_mnist.export import trained

  with console.lines(quiet):
    with contextlib.ExitStack() as held:
      live = _hold_workdir(held, workdir, writes_there=inside)
      work = build.temp_dir_beside(out_dir, '.aot-', 'out_dir')
      try:
        path = trained.restore_model(net, workdir, name=checkpoint or '')
        # Its images and classes, read while no run can replace it.
        recipe = trained.model_recipe(workdir, os.path.basename(path))
        if not inside:  # Read: a live run may save again, nothing is written.
          held.close()
        LOGGER.info(f'checkpoint: {path}')
        if live:
          LOGGER.info(live)
        image_shape = _image_shape(recipe['image_shape'])
        # Read before the build, so that bad files fail at once.
        split = _check_split(
          check_dir, check_data, image_shape, recipe['num_classes'], workdir,
          work,
        )  # fmt: skip
        binary = _compile(
          net, preprocess, work, image_shape, batch_size, target_cpu,
          runtime_dir,
        )  # fmt: skip
        checked = split and _check(net, preprocess, binary, split, work)
        _replace(work, out_dir)
      except (OSError, tf.errors.OpError) as e:
        shutil.rmtree(work, ignore_errors=True)
        raise _disk_error(e, work, runtime_dir) from None
      except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    exported = Exported(os.path.join(out_dir, 'classify'), path, checked)
    LOGGER.info('\n'.join(exported.lines()))
  return exported


def _check_workdir(workdir: str) -> None:
  """A run's folder with checkpoints, or an error naming the fix."""
  if not workdir:
    raise UsageError(
      f'{errors.arg("workdir")} is required: pass a training run folder'
    )
  if not os.path.isdir(workdir):
    raise DataError(
      f'workdir {workdir} does not exist: pass the {errors.arg("workdir")}'
      ' of a training run'
    )
  checkpoints = os.path.join(workdir, layout.CHECKPOINT_DIR)
  names = os.listdir(checkpoints) if os.path.isdir(checkpoints) else []
  if not any(n == 'checkpoint' or n.endswith('.index') for n in names):
    raise DataError(
      f'{workdir} has no checkpoint: train first, with this workdir'
    )


def _out_dir(workdir: str, out_dir: str | None) -> str:
  """`out_dir` (default <workdir>/aot), absolute, once it is safe to replace.

  An export replaces the folder whole, so it must be an earlier export's, an
  empty one or a new one: anything else would be deleted.
  """
  out_dir = os.path.abspath(out_dir or os.path.join(workdir, 'aot'))
  if _is_inside(workdir, out_dir):
    raise UsageError(
      f'{errors.arg("out_dir", out_dir)} would replace the training run'
      f' {workdir}: pass a folder of its own, like'
      f' {os.path.join(workdir, "aot")} (the default)'
    )
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise UserError(
      f'{errors.arg("out_dir")} {out_dir} is a file: pass'
      f' {errors.arg("out_dir", "DIR")}'
    )
  if (
    os.path.isdir(out_dir)
    and os.listdir(out_dir)
    and not os.path.isfile(os.path.join(out_dir, 'classify'))
  ):
    raise UserError(
      f'{errors.arg("out_dir")} {out_dir} holds files other than an export,'
      f' which would be replaced: pass a new or empty'
      f' {errors.arg("out_dir", "DIR")}'
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


def _check_folder_exists(check_dir: str) -> None:
  if not os.path.isdir(check_dir):
    raise DataError(
      f'check folder {check_dir} does not exist: pass'
      f" {errors.arg('check_dir')} with the IDX test set's folder, or"
      f' {errors.arg("check_dir", "")} to skip the check'
    )


def _image_shape(image_shape: tuple[int, ...]) -> tuple[int, int, int]:
  """The run's image shape, as classify takes it: height, width, channels."""
  if len(image_shape) != 3 or min(image_shape) < 1:
    raise UsageError(
      f'the run trained on images of {shape_text(image_shape)}: classify'
      ' takes images of height, width and channels only'
    )
  height, width, channels = image_shape
  return height, width, channels


@dataclasses.dataclass(frozen=True)
class _Split:
  """The check's test split, and the run's own accuracy to set beside it."""

  check_dir: str  # The IDX folder classify reads.
  source: str  # What the images are, in the check's line.
  images: np.ndarray  # uint8 [N, H, W, C]
  labels: np.ndarray
  run_accuracy: float | None
  given: bool = False  # `CheckData`'s, written into the export's folder.


def _check_split(
  check_dir: str | None,
  check_data: CheckData | None,
  image_shape: tuple[int, int, int],
  classes: int,
  workdir: str,
  work: str,
) -> _Split | None:
  """The test split to check on (see `export`), read and checked; None for
  `check_dir=''`. `check_data`'s images are written as IDX files into
  `<work>/check`."""
  if check_data is not None:
    images, labels = _given_split(check_data, image_shape, classes)
    folder = os.path.join(work, 'check')
    os.mkdir(folder)
    images_name, labels_name = (
      os.path.join(folder, name.removesuffix('.gz'))
      for name in test_files(image_shape)
    )
    dims = image_dims(image_shape)
    _write_idx(images_name, images.reshape(images.shape[:dims]))
    _write_idx(labels_name, labels.astype(np.uint8))
    accuracy = _run_accuracy(workdir)
    return _Split(folder, check_data.source, images, labels, accuracy, True)
  if check_dir is None:
    if (image_shape, classes) != (MNIST_SHAPE, MNIST_CLASSES):
      raise UsageError(
        f'the run trained on images of {shape_text(image_shape)} in'
        f' {classes} classes, not those of Fashion-MNIST, the default'
        f' {errors.arg("check_dir")}: pass check_data=CheckData(images,'
        f' labels) with its test split, {errors.arg("check_dir", "DIR")}'
        f' holding {image_format(image_shape)} (and labels), or'
        f' {errors.arg("check_dir", "")} to skip the check'
      )
    check_dir = FASHION_DIR
    _check_folder_exists(check_dir)
  if not check_dir:
    return None
  images, labels = _read_check_split(check_dir, image_shape, classes)
  return _Split(check_dir, check_dir, images, labels, _run_accuracy(workdir))


def _given_split(
  data: CheckData, image_shape: tuple[int, ...], classes: int
) -> tuple[np.ndarray, np.ndarray]:
  """`check_data`'s images and labels, once they fit the run's model and
  IDX files of unsigned bytes."""
  images, labels = np.asarray(data.images), np.asarray(data.labels)
  fault = ''
  if images.dtype != np.uint8 or images.shape[1:] != image_shape:
    fault = (
      f'holds {images.dtype} images of {shape_text(images.shape[1:])}, the'
      f" run's model takes uint8 images of {shape_text(image_shape)}"
    )
  elif labels.shape != images.shape[:1]:
    fault = (
      f'has {len(images)} images but labels of shape'
      f' {shape_text(labels.shape)}: give one label for each'
    )
  elif not len(images):
    fault = 'holds no images: give at least one'
  elif classes > 256:
    fault = (
      f'is for a model of {classes} classes, more than the 256 that IDX'
      " labels of bytes hold: pass check_dir='' to skip the check"
    )
  elif labels.dtype.kind not in 'iu' or not (
    0 <= labels.min() and labels.max() < classes
  ):
    fault = (
      f"has labels outside 0..{classes - 1}, the run's model's classes:"
      ' give the class numbers the run trained on'
    )
  if fault:
    raise UsageError(f'check_data {fault}')
  return images, labels


def _write_idx(path: str, array: np.ndarray) -> None:
  """`array`, uint8, as a plain IDX file: its magic counts the dims."""
  header = struct.pack(
    f'>i{array.ndim}i', UNSIGNED_BYTES + array.ndim, *array.shape
  )
  with open(path, 'wb') as f:
    f.write(header)
    f.write(np.ascontiguousarray(array, np.uint8).tobytes())


def _read_check_split(
  check_dir: str, image_shape: tuple[int, ...], classes: int
) -> tuple[np.ndarray, np.ndarray]:
  """`check_dir`'s test split of images of `image_shape` (uint8 [N, H, W,
  C]) and labels below `classes`, with at least one image; checked as
  `idx_builder.read_split` checks (Fashion-)MNIST's."""
  from xla_mnist.datasets import idx_builder, prepared

  skip = f'or {errors.arg("check_dir", "")} to skip the check'
  images_of = (
    ''
    if image_shape == MNIST_SHAPE
    else f' of {shape_text(image_shape)} images'
  )
  other = (
    f'point {errors.arg("check_dir")} at the IDX test set{images_of}, {skip}'
  )
  names = test_files(image_shape)
  idx_builder.check_folder(check_dir, list(names), other)
  images_path, labels_path = (prepared.locate(check_dir, n) for n in names)
  images = _read_images(images_path, image_shape, skip)
  labels = idx_builder.read_idx(labels_path, layout.LABEL_MAGIC, ())
  if len(images) != len(labels):
    raise DataError(
      f'{images_path} has {len(images)} images but {labels_path} has'
      f' {len(labels)} labels: the two files must come from one release'
    )
  if not len(labels):
    raise DataError(
      f'{images_path} and {labels_path} hold no examples: a test split'
      f' needs at least one; put files that hold some there, or {other}'
    )
  if labels.max() >= classes:
    raise DataError(
      f'{labels_path} has label {labels.max()}, outside 0..{classes - 1}:'
      f" the run's model has {classes} classes; point"
      f' {errors.arg("check_dir")} at a test set of those, {skip}'
    )
  return images, labels


def _read_images(
  path: str, image_shape: tuple[int, ...], skip: str
) -> np.ndarray:
  """The IDX image file `path` as uint8 [N, H, W, C], its images of
  `image_shape`. Its own dimensions say its shape (IDX's rule: its magic
  number's 4th byte counts them), 3 for one channel or 4, as classify reads
  it; `idx_builder.read_idx` checks the rest (size, memory, gzip)."""
  from xla_mnist.datasets import idx_builder

  head = _head(path)
  dims = image_dims(image_shape)
  magic, item_shape = UNSIGNED_BYTES + dims, image_shape[: dims - 1]
  if len(head) >= 4 and head[:2] != GZIP_MAGIC:  # Else read_idx says why.
    (found,) = struct.unpack('>i', head[:4])
    dims = found - UNSIGNED_BYTES
    if dims not in (3, 4):
      raise DataError(
        f'{path} has magic number {found}, expected {magic}: not an IDX'
        f' image file; point {errors.arg("check_dir")} at the IDX test set,'
        f' {skip}'
      )
    magic, item_shape = found, image_shape[: dims - 1]
    if len(head) >= 4 + 4 * dims:  # Else read_idx: truncated.
      _, *item = struct.unpack(f'>{dims}i', head[4 : 4 + 4 * dims])
      shape = (*item, 1) if dims == 3 else tuple(item)
      if shape != image_shape:
        raise DataError(
          f'{path} holds images of {shape_text(shape)}, the model takes'
          f' {shape_text(image_shape)}: point {errors.arg("check_dir")} at'
          f' a test set of {image_format(image_shape)}, {skip}'
        )
  images = idx_builder.read_idx(path, magic, item_shape)
  return images.reshape((len(images), *image_shape))


def _head(path: str) -> bytes:
  """An IDX file's first bytes, unzipped: its header, or less where it
  cannot be read (`read_idx` then names the fault)."""
  try:
    with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
      return f.read(4 + 4 * 4)
  except (OSError, EOFError, zlib.error):  # BadGzipFile is an OSError.
    return b''


def _compile(
  net,
  preprocess: Preprocess,
  work: str,
  image_shape: tuple[int, ...],
  batch_size: int,
  target_cpu: str,
  runtime_dir: str,
) -> str:
  """The SavedModel, tfcompile's objects and `classify` linked against them
  in `work`; returns classify's path."""
  saved_model = os.path.join(work, 'saved_model')
  _save_model(net, preprocess, saved_model, batch_size, image_shape)
  build.aot_compile(saved_model, work, target_cpu)
  archive = build.ensure_runtime(runtime_dir)
  return build.link(work, archive, image_shape)


def _save_model(
  net,
  preprocess: Preprocess,
  path: str,
  batch_size: int,
  image_shape: tuple[int, ...],
) -> None:
  """A SavedModel: uint8 images [batch, H, W, C] -> logits and classes.

  Keras's ExportArchive rather than tf.saved_model.save of a tf.Module: the
  latter tracks each Keras 3 variable twice, and tfcompile's freezing step
  then reads a handle that its restore never filled.
  """
  import keras
  import tensorflow as tf

  def classify(images):
    logits = net(preprocess(images), training=False)
    classes = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return {'logits': logits, 'classes': classes}

  archive = keras.export.ExportArchive()
  archive.track(net)
  for key, batch in (('serving_default', batch_size), ('batch_one', 1)):
    spec = tf.TensorSpec([batch, *image_shape], tf.uint8, name='images')
    archive.add_endpoint(key, classify, input_signature=[spec])
  archive.write_out(path, verbose=False)


def _check(
  net,
  preprocess: Preprocess,
  binary: str,
  split: _Split,
  work: str,
) -> Check:
  """Runs classify on the test split beside the Python model.

  Raises a `UserError` when any class differs or a logit is off by more
  than float rounding.
  """
  check_dir, images, labels = split.check_dir, split.images, split.labels
  expected = np.concatenate(
    [
      net(preprocess(images[i : i + 1000]), training=False).numpy()
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
    raise UserError(f'classify failed on {split.source}: {said}')
  got = np.fromfile(logits_path, np.float32).reshape(expected.shape)
  os.remove(logits_path)
  if split.given:  # Its IDX files: the check's only, not the export's.
    shutil.rmtree(check_dir)
  accuracy, speed = done.stdout.splitlines()[:2]
  checked = Check(
    check_dir='' if split.given else check_dir,
    source=split.source,
    images=len(labels),
    agree=int((got.argmax(1) == expected.argmax(1)).sum()),
    max_logit_difference=float(np.abs(got - expected).max()),
    classify_accuracy=float(accuracy.split()[2]),
    python_accuracy=float((expected.argmax(1) == labels).mean()),
    run_accuracy=split.run_accuracy,
    speed=speed,
  )
  if checked.agree != len(labels) or not np.allclose(
    got, expected, rtol=LOGIT_RTOL, atol=LOGIT_ATOL
  ):
    raise UserError(
      f'classify disagrees with the Python model: {checked.lines()[0]}'
    )
  return checked


def _run_accuracy(workdir: str) -> float | None:
  """The training run's own figure from its result.json, when there is one."""
  try:
    with open(os.path.join(workdir, layout.RESULT_FILE)) as f:
      return float(json.load(f)['test_accuracy'])
  except (OSError, ValueError, KeyError, TypeError):
    return None


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
  """A failed write (a full disk, mostly) as one line naming the argument to
  change. TF's own errors name no file: they come from the SavedModel and
  tfcompile's writes, into the export's folder."""
  where = getattr(error, 'filename', None) or work
  arg = 'runtime_dir' if _is_inside(where, runtime_dir) else 'out_dir'
  place = runtime_dir if arg == 'runtime_dir' else os.path.dirname(work)
  return UserError(
    f'cannot write {place} ({errors.first_line(error)}): free space'
    f' there, or pass another {errors.arg(arg, "DIR")}'
  )
