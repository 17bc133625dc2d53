"""Which data a config names (`fields` checks them before TF starts), and
where a run gets them: prepared IDX arrays (the default run's, without
TFDS), or what `prepare` makes (docs/data.md)."""

from __future__ import annotations

import os

import ml_collections

from xla_mnist.datasets import prepared
from xla_mnist.runtime import layout


def check(config: ml_collections.ConfigDict) -> None:
  """UsageError for the first data field that cannot name data; the checks
  load for data other than (Fashion-)MNIST's train and test splits."""
  usual = config.dataset in layout.IDX_CLASSES and not config.image_dir
  read = (config.train_split, config.test_split, config.image_size)
  if usual and (*read, config.label) == ('train', 'test', 0, ''):
    return
  from xla_mnist.datasets import fields  # noqa: PLC0415

  fields.check(config)


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
