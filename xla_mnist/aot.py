r"""Compiles a trained run ahead of time into `classify`, a C++ program.

  python -m xla_mnist.aot --workdir=logs/fashion_mnist-on

The command's flags, mapped onto `export.classifier.export`, the Python call
a notebook makes (docs/aot.md): from the workdir's latest checkpoint (or
`--checkpoint`), `classify` in `<workdir>/aot` (`--out_dir`), for the run's
images and classes, checked against the Python model before it is kept: on
`--check_dir`'s IDX test files, else on Debian's Fashion-MNIST for a run on
its 28x28x1 images of 10 classes, else on the run's own test split, loaded
from `--data_dir` as the run recorded it. The arguments, folders and
toolchain are checked before TF's import of seconds. Every failure is one
`error:` line (docs/aot.md lists them).
"""

from __future__ import annotations

import functools

# First: catches stop signals before the imports below (see `cli`).
from xla_mnist.runtime import cli  # isort: skip

cli.catch_stop_signals()

from absl import flags, logging

# No TensorFlow yet: it is imported once the flags have passed their checks.
from xla_mnist.export import build, classifier
from xla_mnist.runtime import console, env, errors
from xla_mnist.runtime.errors import UsageError
from xla_mnist.workdir import files

# Defined by `parse_flags`, not at import, so that the package's modules
# import side by side (train has a --workdir of its own).
_WORKDIR: flags.FlagHolder
_OUT_DIR: flags.FlagHolder
_RUNTIME_DIR: flags.FlagHolder
_BATCH_SIZE: flags.FlagHolder
_TARGET_CPU: flags.FlagHolder
_CHECK_DIR: flags.FlagHolder
_CHECKPOINT: flags.FlagHolder
_DATA_DIR: flags.FlagHolder


def _define_flags() -> None:
  global _WORKDIR, _OUT_DIR, _RUNTIME_DIR, _BATCH_SIZE, _TARGET_CPU, _CHECK_DIR
  global _CHECKPOINT, _DATA_DIR
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
    'batch_size',
    classifier.DEFAULT_BATCH_SIZE,
    'The fixed batch classify runs (and batch 1).',
  )
  _TARGET_CPU = flags.DEFINE_enum(
    'target_cpu',
    classifier.DEFAULT_TARGET_CPU,
    list(build.TARGET_CPUS),
    'CPU level the model is compiled for: x86-64 runs on any (SSE2), v3 needs'
    ' AVX2 and FMA, v4 AVX-512.',
  )
  _CHECK_DIR = flags.DEFINE_string(
    'check_dir',
    None,
    "IDX folder whose test split (images of the run's shape) classify and"
    ' the Python model must agree on; empty: skip the check. Default:'
    f' {classifier.FASHION_DIR} for a run on 28x28x1 images of 10 classes,'
    " else the run's own test split, from --data_dir.",
  )
  _DATA_DIR = flags.DEFINE_string(
    'data_dir',
    './data',
    "The TFDS data dir the run's own test split is loaded from, when the"
    ' check takes it (see --check_dir).',
  )


# (Fashion-)MNIST's images and classes, which Debian's folder checks.
MNIST = (classifier.MNIST_SHAPE, classifier.MNIST_CLASSES)


def parse_flags(argv: list[str]) -> list[str]:
  """Defines the flags (see `cli`), then parses them: a bad one is one line,
  exit 2."""
  _define_flags()
  return cli.parse(argv)


def main(argv: list[str]) -> None:
  verbose = flags.FLAGS['verbosity'].present or env.verbose()
  if not flags.FLAGS['verbosity'].present:  # As train.py: no INFO chatter.
    logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {" ".join(argv[1:])}: flags only')
  workdir = _WORKDIR.value
  arguments = dict(
    out_dir=_OUT_DIR.value,
    checkpoint=_CHECKPOINT.value,
    check_dir=_CHECK_DIR.value,
    target_cpu=_TARGET_CPU.value,
    batch_size=_BATCH_SIZE.value,
  )
  files.check_current_folder(
    workdir, _OUT_DIR.value, _CHECKPOINT.value, _CHECK_DIR.value,
    _DATA_DIR.value,
  )  # fmt: skip
  classifier.check(workdir, **arguments)  # At once, before TF's import.
  with env.importing_tensorflow():
    import tensorflow as tf

    from xla_mnist import model
    from xla_mnist.export import trained

  # From here on files are written: a signal unwinds, removing them.
  cli.unwind_on_signals()
  if not verbose:
    # TF's Python log (tfcompile's TF1 deprecation notes, latest_checkpoint's
    # "Couldn't match files") off stderr, where the error line goes: every
    # failure it reports becomes that line.
    tf.get_logger().setLevel('CRITICAL')
  # The checkpoint's own model: a packaged one's name, or a user's factory.
  recipe = trained.model_recipe(workdir, _CHECKPOINT.value)
  net = model.create_model(
    # The checkpoint holds a user's model's weights, not its code.
    **recipe,
    fix='as when it trained',
  )
  facts = (recipe['image_shape'], recipe['num_classes'])
  if arguments['check_dir'] is None and facts != MNIST:
    fix = (
      f'pass {errors.arg("check_dir", "DIR")} holding'
      f' {classifier.image_format(facts[0])} (docs/aot.md), or'
      f' {errors.arg("check_dir", "")} to skip the check'
    )
    images, labels, source = trained.run_test_split(
      workdir, _DATA_DIR.value, *facts, fix=fix
    )
    arguments['check_data'] = classifier.CheckData(images, labels, source)
  exported = classifier.export(
    net,
    functools.partial(model.inputs, net),
    workdir,
    runtime_dir=_RUNTIME_DIR.value or '',
    **arguments,
  )
  console.say(
    f'classify: {exported.binary} (run it with an IDX folder or image file)'
  )


def run() -> None:
  """The `xla-mnist-aot` console script."""
  env.quiet_by_default()
  cli.run(main, parse_flags)


if __name__ == '__main__':
  run()
