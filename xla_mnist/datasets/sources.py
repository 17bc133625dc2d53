"""Which data a config names, and where a run gets them: the data fields'
checks before TensorFlow starts (`config.check`), and the choice among the
prepared IDX arrays (the default run's, without TFDS) and what prepares
the rest (`prepare`: IDX files, a folder, TFDS's builders; docs/data.md)."""

from __future__ import annotations

import os
import re

import ml_collections

from xla_mnist.datasets import prepared
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
  ]  # fmt: skip
  for fault, message in faults:
    if fault:
      raise UsageError(message)


def prepared_data(
  dataset: str, idx_dir: str, data_dir: str, image_dir: str = '', **source
) -> prepared.Prepared:
  """Both splits, prepared once in `data_dir`: from IDX files (`idx_dir`,
  or Debian's folder for Fashion-MNIST), else by `prepare.from_source`
  (`image_dir`, TFDS's builder of `dataset`; `source`: the splits and
  size)."""
  folder = idx_dir or layout.DEBIAN_DIRS.get(dataset, '')
  with_idx = not image_dir and (idx_dir or os.path.isdir(folder))
  ready = prepared.from_idx(dataset, folder, data_dir) if with_idx else None
  if ready is None:  # To check or prepare, a folder or TFDS's own dataset.
    from xla_mnist.datasets import prepare  # noqa: PLC0415 - only then.

    with prepare.notices_off():
      if with_idx:
        return prepare.from_idx(dataset, folder, data_dir)
      return prepare.from_source(dataset, image_dir, data_dir, **source)
  return ready
