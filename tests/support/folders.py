"""Folders of images from Debian's real Fashion-MNIST, in the layout TFDS's
ImageFolder and Keras read (`root/<split>/<class>/<image>`), and the same
images as IDX files: a folder run and an IDX run train on the same data."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from support.idx import FASHION_DIR, IDX_NAMES, require_fashion_mnist, write_idx

from xla_mnist.datasets import idx_builder
from xla_mnist.runtime import layout


def fashion(split: str, count: int) -> tuple[np.ndarray, np.ndarray]:
  """The first `count` images [N, 28, 28] and labels of a real split."""
  require_fashion_mnist()
  images, labels = idx_builder.read_split(FASHION_DIR, split)
  return images[:count, ..., 0], labels[:count]


def encode(pixels: np.ndarray, ext: str) -> bytes:
  """uint8 [H, W] or [H, W, C] as a PNG or JPEG file's bytes."""
  image = pixels if pixels.ndim == 3 else pixels[..., None]
  if ext == 'png':
    return tf.io.encode_png(image).numpy()
  return tf.io.encode_jpeg(image, quality=95).numpy()


def write_fashion_folder(
  root: str, counts: dict[str, int], ext: str = 'png'
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Writes each split's first images as `<split>/<class name>/<i>.<ext>`
  (class folders named by TFDS's names, made safe for a path); returns the
  arrays written, as their IDX files hold them."""
  names = [
    n.replace('/', '_') for n in layout.IDX_CLASSES['fashion_mnist']
  ]  # fmt: skip
  written = {}
  for split, count in counts.items():
    images, labels = fashion(split, count)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
      folder = os.path.join(root, split, names[label])
      os.makedirs(folder, exist_ok=True)
      with open(os.path.join(folder, f'{i:05d}.{ext}'), 'wb') as f:
        f.write(encode(image, ext))
    written[split] = (images, labels)
  return written


def write_idx_folder(
  root: str, arrays: dict[str, tuple[np.ndarray, np.ndarray]]
) -> None:
  """The same splits as four IDX files."""
  os.makedirs(root, exist_ok=True)
  for split, (images, labels) in arrays.items():
    images_name, labels_name = IDX_NAMES[split]
    write_idx(os.path.join(root, images_name), layout.IMAGE_MAGIC, images)
    write_idx(os.path.join(root, labels_name), layout.LABEL_MAGIC, labels)
