"""A trained model read back from a workdir's checkpoints, for export and
inference: checked as a resume checks it, and only read (a damaged pointer
or newer damaged checkpoints are read past, with a line; nothing is
repaired or moved: the run that owns them does that)."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import ml_collections
import numpy as np
import tensorflow as tf

from xla_mnist.runtime import console, errors, layout
from xla_mnist.runtime.errors import DataError, UserError
from xla_mnist.workdir import checkpointing, resuming

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
  with resuming.restoring(path, fix):
    stored = resuming.stored_fingerprint(path)
    expected = {'model': checkpointing.shapes(net)}
    if config is not None:
      expected.update(
        (k, v) for k, v in checkpointing.recipe(config).items() if k in stored
      )
    # Read, not resumed: the model (and config) given must be those it was
    # trained with (a user's factory as it was then); no run is replaced.
    resuming.check_compatible(
      stored,
      expected,
      directory,
      fix='restore it into the model and config it was trained with (a'
      ' factory as it was then), or pass another'
      f' {errors.arg("workdir", "DIR")}',
    )
    status = tf.train.Checkpoint(model=net).restore(resuming.literal(path))
    status = status.expect_partial()
    status.assert_existing_objects_matched()
  return path


def model_recipe(workdir: str, name: str = '') -> dict:
  """What the checkpoint `restore_model` would read was trained as: the
  `create_model` arguments to build before restoring it (`name`, the
  data's `image_shape` and `num_classes`, and the `precision`). The softmax
  on MNIST's images where none is readable, or for a checkpoint written
  before the data's facts were recorded (all trained on (Fashion-)MNIST):
  `restore_model` then says why, and checks the shapes whatever this says."""
  directory = os.path.join(workdir, checkpointing.CHECKPOINT_DIR)
  if name:
    path = os.path.join(directory, name)
  else:
    found = resuming.Scan(directory)
    path = found.path(found.newest)
  recipe = {'name': 'softmax', 'image_shape': (28, 28, 1), 'num_classes': 10}
  try:
    stored = resuming.stored_fingerprint(path)
  except (tf.errors.OpError, ValueError, KeyError, IndexError):
    return recipe
  with contextlib.suppress(KeyError, ValueError, TypeError, AttributeError):
    recipe['name'] = str(stored['model_name'])
    recipe['image_shape'] = tuple(map(int, stored['image_shape'].split('x')))
    recipe['num_classes'] = int(stored['num_classes'])
    recipe['precision'] = str(stored['precision'])
  return recipe


def _newest(directory: str, fix: str) -> str:
  """The newest complete checkpoint in `directory`, or one line saying why
  there is none; a line when the pointer or newer ones were read past."""
  found = resuming.Scan(directory)
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


def run_test_split(
  workdir: str,
  data_dir: str,
  image_shape: tuple[int, ...],
  classes: int,
  *,
  fix: str,
) -> tuple[np.ndarray, np.ndarray, str]:
  """The run's own test split (images, labels, what they are), loaded from
  `data_dir` as its result.json's config names its data; one line, with
  `fix`, where it cannot be, or its images or classes are not the model's."""
  from xla_mnist import data  # noqa: PLC0415 - for a check only.

  shape = 'x'.join(map(str, image_shape))
  path = os.path.join(workdir, layout.RESULT_FILE)
  try:
    with open(path) as f:
      recorded = json.load(f)
    config = ml_collections.ConfigDict(recorded['config'])
  except FileNotFoundError:
    raise DataError(
      f'{workdir} trained on images of {shape}, and has no'
      f' {layout.RESULT_FILE} to name them (the run has not finished), so'
      f' no test split to check on: {fix}'
    ) from None
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise DataError(
      f"{path} cannot be read ({errors.first_line(e)}), so the run's test"
      f' split is unknown: {fix}'
    ) from None
  try:
    config.input = 'stream'  # The test split only: the training split unread.
    loaded = data.of_config(config, data_dir)
  except (UserError, KeyError, AttributeError) as e:
    raise DataError(
      f"the run's test split, to check on, cannot be loaded"
      f' ({errors.first_line(e)}): pass the'
      f' {errors.arg("data_dir", "DIR")} it trained with, or {fix}'
    ) from None
  if (loaded.image_shape, len(loaded.class_names)) != (image_shape, classes):
    got = 'x'.join(map(str, loaded.image_shape))
    raise DataError(
      f'{loaded.source} holds images of {got} in {len(loaded.class_names)}'
      f' classes, but {workdir} trained on {shape} in {classes}: its data'
      f' changed since; {fix}'
    )
  if loaded.source_digest != recorded.get('data_source'):
    console.say(
      f'note: {loaded.source} is not the data {workdir} was tested on (it'
      ' changed since): the check compares classify and the Python model'
      " on it, not the run's accuracy"
    )
  images, labels = (
    np.asarray(a) for a in (loaded.test.images, loaded.test.labels)
  )
  return images, labels, f"the run's test split ({loaded.source})"
