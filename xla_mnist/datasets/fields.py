"""The data fields' checks, before TensorFlow starts: a dataset that is no
TFDS name, two folders, an IDX folder of another dataset, a split without
a name (`sources.check` loads them for data other than the default's)."""

from __future__ import annotations

import os
import re

import ml_collections

from xla_mnist.runtime import errors, layout
from xla_mnist.runtime.errors import UsageError

# A TFDS name, its config and version: `mnist`, `emnist/letters:3.1.0`.
_DATASET = re.compile(r'[a-z0-9_]+(/[\w.-]+)?(:[\d.*]+)?')


def check(config: ml_collections.ConfigDict) -> None:
  """UsageError for the first data field that cannot name data."""
  name, field = config.dataset, errors.field
  splits = [
    s for s in ('train_split', 'test_split') if not str(config[s]).strip()
  ]
  where = config.idx_dir or layout.DEBIAN_DIRS.get(name, '')
  idx = config.idx_dir or os.path.isdir(where)
  reshaped = (config.train_split, config.test_split) != ('train', 'test')
  faults = [
    (not (isinstance(name, str) and _DATASET.fullmatch(name)),
     f'dataset {name!r} is not a TFDS name: set {field("dataset")} to one,'
     ' with its config if it has several (cifar10, emnist/letters)'),
    (config.idx_dir and name not in layout.IDX_CLASSES,
     f'{field("idx_dir")} reads IDX files of'
     f' {" or ".join(layout.IDX_CLASSES)}, not of {name}: set'
     f' {field("dataset")} to one of them, or pass'
     f' {field("image_dir", "DIR")} for a folder of images'),
    (config.idx_dir and config.image_dir,
     f'{field("idx_dir")} and {field("image_dir")} both name the data:'
     ' drop one'),
    (splits, f'{" and ".join(splits)} is empty: set it to a split TFDS'
     " names (test, train[90%:]) or a folder's split folder"),
    (config.label and (idx or config.image_dir),
     f'{field("label")} picks among the labels of a TFDS dataset; IDX files'
     " and a folder's class folders have one: drop it"),
    (idx and not config.image_dir and (reshaped or config.image_size),
     f'{name} is read from the IDX files in {where}, whose train and test'
     f' splits train whole, at their size: drop {field("train_split")},'
     f' {field("test_split")} and {field("image_size")}, or pass'
     f' {field("image_dir", "DIR")} for a folder of images'),
  ]  # fmt: skip
  for fault, message in faults:
    if fault:
      raise UsageError(message)
