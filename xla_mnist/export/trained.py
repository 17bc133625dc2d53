"""A trained model read back from a workdir's checkpoints, for export and
inference: checked as a resume checks it, and only read (a damaged pointer
or newer damaged checkpoints are read past, with a line; nothing is
repaired or moved: the run that owns them does that)."""

from __future__ import annotations

import contextlib
import logging
import os

import ml_collections
import tensorflow as tf

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import DataError
from xla_mnist.workdir import checkpointing

LOGGER = logging.getLogger(__name__)


def restore_model(
  net: tf.keras.Model,
  workdir: str,
  config: ml_collections.ConfigDict | None = None,
  name: str = '',
) -> str:
  """Restores `net` (a built model of the recipe's) from `workdir`'s newest
  complete checkpoint (or from the one `name`d, e.g. 'ckpt-300'); returns
  the checkpoint's prefix.

  Checked as a resume is: the model's shapes always, and with `config`
  every recipe field the checkpoint records. It only reads: a damaged
  pointer or newer damaged checkpoints are read past, with a line, and
  nothing is repaired or moved (the run that owns them does that).
  """
  directory = os.path.join(workdir, checkpointing.CHECKPOINT_DIR)
  fix = (
    f'pass {errors.arg("checkpoint", "ckpt-N")} to read another of its'
    ' checkpoints, or train'
  )
  path = os.path.join(directory, name) if name else _newest(directory, fix)
  with checkpointing.restoring(path, fix):
    stored = checkpointing.stored_fingerprint(path)
    expected = {'model': checkpointing.shapes(net)}
    if config is not None:
      expected.update(
        (k, v) for k, v in checkpointing.recipe(config).items() if k in stored
      )
    # Read, not resumed: the model (and config) given must be those it was
    # trained with (a user's factory as it was then); no run is replaced.
    checkpointing.check_compatible(
      stored,
      expected,
      directory,
      fix='restore it into the model and config it was trained with (a'
      ' factory as it was then), or pass another'
      f' {errors.arg("workdir", "DIR")}',
    )
    status = tf.train.Checkpoint(model=net).restore(checkpointing.literal(path))
    status = status.expect_partial()
    status.assert_existing_objects_matched()
  return path


def model_recipe(workdir: str, name: str = '') -> dict:
  """What the checkpoint `restore_model` would read was trained as: the
  `create_model` arguments to build before restoring it (`name`, and the
  data's `image_shape` and `num_classes`). The softmax on MNIST's images
  where none is readable, or for a checkpoint written before the data's
  facts were recorded (all trained on (Fashion-)MNIST): `restore_model`
  then says why, and checks the shapes whatever this says."""
  directory = os.path.join(workdir, checkpointing.CHECKPOINT_DIR)
  if name:
    path = os.path.join(directory, name)
  else:
    found = checkpointing.Scan(directory)
    path = found.path(found.newest)
  recipe = {'name': 'softmax', 'image_shape': (28, 28, 1), 'num_classes': 10}
  try:
    stored = checkpointing.stored_fingerprint(path)
  except (tf.errors.OpError, ValueError, KeyError, IndexError):
    return recipe
  with contextlib.suppress(KeyError, ValueError, TypeError, AttributeError):
    recipe['name'] = str(stored['model_name'])
    recipe['image_shape'] = tuple(map(int, stored['image_shape'].split('x')))
    recipe['num_classes'] = int(stored['num_classes'])
  return recipe


def _newest(directory: str, fix: str) -> str:
  """The newest complete checkpoint in `directory`, or one line saying why
  there is none; a line when the pointer or newer ones were read past."""
  found = checkpointing.Scan(directory)
  if found.newest is None:
    if found.damaged:
      step, reason = found.damaged[0]
      raise DataError(
        f'checkpoint {found.path(step)} cannot be restored ({reason}) and no'
        f' older one is complete: {fix} again'
      )
    raise DataError(
      f'{directory} holds no complete checkpoint: train there first, or'
      ' pass the workdir of a run that saved one'
    )
  path = found.path(found.newest)
  if found.wrong:
    from xla_mnist.workdir import checkpoint_repair  # noqa: PLC0415 - rare.

    passed = checkpoint_repair.what_is_wrong(found)
    LOGGER.info(f'note: reading {path}, the newest complete one: {passed}')
  return path
