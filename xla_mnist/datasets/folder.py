"""A folder of the user's images, in the layout TFDS's `ImageFolder` and
Keras's `image_dataset_from_directory` read: `root/<split>/<class>/<image>`.

Class names are the class folders' names, sorted, as both of them give them
(label i is the i-th); every split must hold the same classes, each class
at least one image. PNG, JPEG, GIF and BMP (the formats Keras reads, by
their endings; other files are passed over, as Keras does), decoded by TF's
own decoders: grayscale, grayscale with alpha, RGB and RGBA, the folder's
images brought to the most channels any of them has (grey spread to RGB,
opaque alpha added). Images of one size keep it; images of several are
refused unless `image_size` resizes each to that square.

The folder's identity is its images' contents: hashed once, then known
from the files' versions (`prepared.Stamps`), so that a changed file, a
new or a removed one makes the folder another source, prepared again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from xla_mnist.datasets import prepared, registered
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import DataError

EXTENSIONS = ('.png', '.jpg', '.jpeg', '.gif', '.bmp')
Listing = dict[str, list[tuple[str, int]]]  # Split: [(path, label)].


def listing(
  root: str, splits: tuple[str, ...]
) -> tuple[tuple[str, ...], Listing]:
  """The class names and each split's images with their labels; one line
  naming a split, class or folder that cannot serve."""
  if not os.path.isdir(root):
    problem = 'is not a folder' if os.path.exists(root) else 'does not exist'
    raise DataError(
      f'image folder {root} {problem}: point {errors.field("image_dir")} at'
      ' the folder holding a folder per split of a folder per class'
    )
  classes: dict[str, list[str]] = {}
  for split in splits:
    where = os.path.join(root, split)
    if not os.path.isdir(where):
      found = ', '.join(_folders(root)) or 'none'
      raise DataError(
        f'image folder {root} has no split folder {split!r} (its folders:'
        f' {found}): put the images in {where}/<class>/, or set'
        f' {errors.field("train_split")} and {errors.field("test_split")} to'
        ' its split folders'
      )
    classes[split] = _folders(where)
  names = sorted(set().union(*classes.values()))
  if len(names) < 2:
    raise DataError(
      f'image folder {root} has {len(names)} class folder(s) in its splits:'
      ' a classifier needs two at least, a folder of images each'
    )
  for split, have in classes.items():
    if missing := [n for n in names if n not in have]:
      raise DataError(
        f'image folder {root}: split {split!r} has no class folder'
        f' {missing[0]!r}, which another split has: every split needs the'
        ' same classes, each with images'
      )
  images: Listing = {}
  for split in splits:
    images[split] = []
    for label, name in enumerate(names):
      where = os.path.join(root, split, name)
      found = sorted(
        f for f in os.listdir(where)
        if f.lower().endswith(EXTENSIONS) and not f.startswith('.')
      )  # fmt: skip
      if not found:
        raise DataError(
          f'class folder {where} holds no image ({", ".join(EXTENSIONS)}):'
          ' put images of that class there, or remove the folder from every'
          ' split'
        )
      images[split] += [(os.path.join(where, f), label) for f in found]
  return tuple(names), images


def _folders(where: str) -> list[str]:
  return sorted(
    e.name for e in os.scandir(where)
    if e.is_dir() and not e.name.startswith('.')
  )  # fmt: skip


def digest(
  root: str,
  images: Listing,
  stamps: prepared.Stamps,
  splits: tuple[str, ...],
  image_size: int,
  settled: int,
) -> str:
  """sha256 naming the images' contents, labels and splits and the size they
  are read at: hashed once, then taken from `stamps` while no file's
  version changed (kept only if no file changed after `settled`, ns: a
  change within its timestamps' granularity could keep its version)."""
  entries = [(s, p, label) for s in splits for p, label in images[s]]
  head = f'xla_mnist image folder {prepared.FORMAT_VERSION} {splits}'
  versions = hashlib.sha256(f'{head} {image_size}\n'.encode())
  newest = 0
  for split, path, label in entries:
    version = prepared.file_version(path) or [0] * 5
    newest = max(newest, *version[3:])
    versions.update(f'{split} {label} {path} {version}\n'.encode())
  key = os.path.join(os.path.abspath(root), '')  # The folder, not a file.
  version = [versions.hexdigest()]
  if (known := stamps.entries.get(key)) and known[0] == version:
    return known[1]
  contents = hashlib.sha256(f'{head} {image_size}\n'.encode())
  for split, path, label in entries:
    with open(path, 'rb') as f:
      content = hashlib.sha256(f.read()).hexdigest()
    name = os.path.relpath(path, os.path.join(root, split))
    contents.update(f'{split} {label} {name} {content}\n'.encode())
  if newest < settled:
    stamps.entries[key] = [version, contents.hexdigest()]
    stamps.changed = True
  return contents.hexdigest()


def channels(images: Listing, splits: tuple[str, ...], image_size: int) -> int:
  """The channels the folder's images are brought to, found by a first
  pass that decodes every image for its shape only, so that a folder
  larger than memory is read once more, a part at a time (`read`); one
  line where images differ in size and `image_size` does not resize them."""
  paths = [path for s in splits for path, _ in images[s]]
  shapes = dict(zip(paths, map(tuple, _each(paths, tf.shape)), strict=True))
  have = {shape[-1] for shape in shapes.values()}
  sizes = {shape[:2]: path for path, shape in shapes.items()}
  if len(sizes) > 1 and not image_size:
    (a, path_a), (b, path_b) = list(sizes.items())[:2]
    raise DataError(
      f'images differ in size: {path_a} is {a[1]}x{a[0]}, {path_b} is'
      f' {b[1]}x{b[0]}: set {errors.field("image_size", "N")} to resize'
      ' each to NxN'
    )
  # Alpha (2, 4) and colour (3, 4) anywhere: RGBA, so that none is lost.
  return 4 if have & {2, 4} and have & {3, 4} else max(have)


def read(
  images: list[tuple[str, int]], channels: int, image_size: int
) -> prepared.Parts:
  """A split's count and its (uint8 images [n, H, W, C], int64 labels [n])
  a part at a time, decoded by tf.data in parallel, each image brought to
  `channels` (`channels()`) and resized to `image_size` if set."""
  labels = np.array([label for _, label in images], np.int64)

  def parts() -> Iterator[prepared.Arrays]:
    decoded = _each([p for p, _ in images], tf.identity)
    for start in range(0, len(images), registered.READ_BATCH):
      part = labels[start : start + registered.READ_BATCH]
      pixels = [_sized(_channels(next(decoded), channels), image_size)
                for _ in part]  # fmt: skip
      yield np.stack(pixels), part

  return len(images), parts()


def _sized(pixels: np.ndarray, image_size: int) -> np.ndarray:
  if not image_size or pixels.shape[:2] == (image_size, image_size):
    return pixels
  return registered.resized(pixels, image_size).numpy()


def _each(
  paths: list[str], then: Callable[[tf.Tensor], tf.Tensor]
) -> Iterator[np.ndarray]:
  """`then` of each file's pixels as decoded (channels as stored), by
  tf.data in parallel; one line naming the first file TF cannot decode."""
  files = tf.data.Dataset.from_tensor_slices(paths)
  decode = lambda p: tf.io.decode_image(  # noqa: E731
    tf.io.read_file(p), expand_animations=False
  )
  pixels = files.map(
    lambda p: then(decode(p)), num_parallel_calls=tf.data.AUTOTUNE
  )
  try:
    yield from pixels.as_numpy_iterator()
  except tf.errors.OpError:
    for path in paths:  # Which one: each alone, in order.
      try:
        decode(path)
      except tf.errors.OpError as e:
        raise DataError(
          f'image {path} cannot be read ({errors.first_line(e)}): replace'
          ' or remove it'
        ) from None
    raise DataError(  # Each alone was read: the parallel read itself failed.
      f'the images of {os.path.commonpath(paths)} cannot be read together'
      ' (tf.data failed, each image alone is readable): run again'
    ) from None


def _channels(pixels: np.ndarray, channels: int) -> np.ndarray:
  """`pixels` with `channels` channels: grey spread to RGB, an opaque alpha
  added, a grey image's alpha kept (1: grey, 2: grey and alpha, 3: RGB, 4:
  RGBA); never fewer than it has (the folder takes the most any has)."""
  have = pixels.shape[-1]
  if have == channels:
    return pixels
  colour = pixels[..., : 3 if have >= 3 else 1]
  if channels >= 3 and colour.shape[-1] == 1:
    colour = np.repeat(colour, 3, axis=-1)
  if channels in (1, 3):
    return colour
  alpha = (
    pixels[..., -1:] if have in (2, 4) else np.full_like(colour[..., :1], 255)
  )
  return np.concatenate([colour, alpha], axis=-1)
