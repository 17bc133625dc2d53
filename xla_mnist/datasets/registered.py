"""TFDS's registered image-classification datasets, by name: which of a
builder's features are the image and the label, and a split read part by part
into the arrays file a run reads.

Any dataset TFDS registers with one image and one class label
(`cifar100`, `emnist/letters`, `beans`...) trains: the image and label are
its supervised keys, or its only `Image` and `ClassLabel` features. A split
is TFDS's name or slice (`train[:90%]`). Images of a size the builder does
not fix, or any with `image_size` set, are resized to that square here,
as Keras's `image_dataset_from_directory` does (bilinear).
"""

from __future__ import annotations

import hashlib
import urllib.parse

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from xla_mnist.datasets import prepared
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import DataError, UsageError

Builder = tfds.core.DatasetBuilder
READ_BATCH = 1024  # Examples decoded, resized and copied out at a time.


def builder(name: str, data_dir: str) -> Builder:
  """TFDS's builder of `name` in `data_dir`; one line for a name TFDS does
  not register."""
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise UsageError(
      f'dataset {name!r} is not one TFDS registers: set'
      f' {errors.field("dataset")} to a TFDS image dataset'
      ' (tfds.list_builders()), with its config if it has several'
      f' (emnist/letters), or pass'
      f' {errors.field("image_dir", "DIR")} for a folder of images'
    ) from None
  except (ValueError, AssertionError) as e:  # A config or version it lacks.
    raise UsageError(
      f'dataset {name!r}: {errors.first_line(e)}: set'
      f' {errors.field("dataset")} to a name and config TFDS registers'
    ) from None


def keys(found: Builder, label: str = '') -> tuple[str, str]:
  """The image feature's key and the label's (`label`, else the supervised
  one): one line for a dataset that is not image classification, or a
  `label` that is not one of its ClassLabel features."""
  features = found.info.features
  pairs = found.info.supervised_keys
  if (
    isinstance(pairs, tuple)
    and len(pairs) == 2
    and all(isinstance(k, str) and k in features for k in pairs)
  ):
    image, supervised = pairs
  else:
    image = _only(features, tfds.features.Image)
    supervised = _only(features, tfds.features.ClassLabel)
  labels = _of_kind(features, tfds.features.ClassLabel)
  if label and label not in labels:
    raise UsageError(
      f'dataset {found.info.full_name} has no ClassLabel feature {label!r}'
      f' (its ClassLabel features: {", ".join(labels) or "none"}): set'
      f' {errors.field("label")} to one of them, or drop it'
    )
  label = label or supervised
  is_image = image is not None and _is_image(features[image])
  is_label = (
    isinstance(features[label], tfds.features.ClassLabel) if label else False
  )
  if not (is_image and is_label):
    raise UsageError(
      f'dataset {found.info.full_name} is not image classification here: it'
      ' needs one Image feature and one ClassLabel (its features:'
      f' {", ".join(features.keys())}): set {errors.field("dataset")} to'
      ' one that has them'
    )
  return image, label


def _is_image(feature: tfds.features.FeatureConnector) -> bool:
  """An `Image` or a tensor of one (height, width, channels), of uint8."""
  kinds = (tfds.features.Image, tfds.features.Tensor)
  shaped = isinstance(feature, kinds) and len(feature.shape) == 3
  return shaped and feature.np_dtype == np.uint8


def _of_kind(features: tfds.features.FeaturesDict, kind: type) -> list[str]:
  return [k for k, f in features.items() if isinstance(f, kind)]


def _only(features: tfds.features.FeaturesDict, kind: type) -> str | None:
  found = _of_kind(features, kind)
  return found[0] if len(found) == 1 else None


def facts(
  found: Builder, splits: tuple[str, str], image_size: int, label: str = ''
) -> tuple[tuple[str, ...], str]:
  """The class names, and the digest naming the data a run reads: the
  dataset's name, version and download checksums, the splits, the size
  they are read at and the label read (`keys`)."""
  image, label = keys(found, label)
  shape = found.info.features[image].shape
  if shape[-1] is None:
    raise DataError(
      f"dataset {found.info.full_name} does not fix its images' channels:"
      ' this project cannot stack them; pass a folder of its images with'
      f' {errors.field("image_dir", "DIR")}'
    )
  if None in shape[:2] and not image_size:
    raise UsageError(
      f'dataset {found.info.full_name} has images of several sizes: set'
      f' {errors.field("image_size", "N")} to resize each to NxN'
    )
  lines = [f'xla_mnist tfds source {prepared.FORMAT_VERSION}']
  lines.append(found.info.full_name)
  infos = found.url_infos or {}
  lines += [f'{url} {info.checksum}' for url, info in sorted(infos.items())]
  read = (image, label, tuple(splits), image_size)
  if read != ('image', 'label', ('train', 'test'), 0):  # Else: as before.
    lines.append(' '.join(map(str, read)))
  digest = hashlib.sha256('\n'.join(lines).encode()).hexdigest()
  return tuple(found.info.features[label].names), digest


def read(
  found: Builder, split: str, image_size: int, label: str = ''
) -> prepared.Parts:
  """A split's count and its (uint8 images [n, H, W, C], int64 labels [n]:
  `keys`'s) a part at a time, resized to `image_size` when it is set; one
  line naming a split TFDS lacks."""
  image, label = keys(found, label)
  known = list(found.info.splits.keys())  # Once prepared; else TFDS says.
  asked = [part.split('[')[0].strip() for part in split.split('+')]
  missing = [a for a in asked if known and a not in [*known, 'all']]
  try:
    if missing:
      raise ValueError(f'no split {missing[0]!r}')
    examples = found.as_dataset(split=split, shuffle_files=False)
  except (ValueError, KeyError, AssertionError) as e:
    raise UsageError(
      f'dataset {found.info.full_name} cannot read split {split!r}'
      f' ({errors.first_line(e)}); its splits: {", ".join(known) or "?"}:'
      f' set {errors.field("train_split")} and {errors.field("test_split")}'
      " to its splits or TFDS's slices of one (train[:90%], train[90%:])"
    ) from None

  def pair(example: dict) -> tuple[tf.Tensor, tf.Tensor]:
    pixels = example[image]
    if image_size:
      pixels = resized(pixels, image_size)
    return pixels, tf.cast(example[label], tf.int64)

  count = int(examples.cardinality())  # TFDS's split info: known.
  if count < 0:
    count = int(examples.reduce(0, lambda n, _: n + 1))
  if not count:
    raise DataError(
      f'split {split!r} of {found.info.full_name} holds no examples: set'
      f' {errors.field("train_split")} or {errors.field("test_split")} to'
      ' one that holds some'
    )
  batches = examples.map(pair, num_parallel_calls=tf.data.AUTOTUNE)
  batches = batches.batch(READ_BATCH).prefetch(tf.data.AUTOTUNE)
  return count, batches.as_numpy_iterator()


def resized(pixels: tf.Tensor, size: int) -> tf.Tensor:
  """uint8 [..., H, W, C] as uint8 [..., size, size, C], bilinear as Keras
  resizes, rounded back to whole values."""
  scaled = tf.image.resize(pixels, (size, size), method='bilinear')
  return tf.cast(tf.round(tf.clip_by_value(scaled, 0, 255)), tf.uint8)


def download_hosts(found: Builder) -> list[str]:
  """The hosts TFDS downloads `found`'s files from, as far as it says."""
  urls = [getattr(found, 'URL', '') or '', *(found.url_infos or {})]
  hosts = [urllib.parse.urlparse(u).hostname for u in urls if u]
  return sorted({h for h in hosts if h})
