"""Writes a folder of synthetic colour images, for --config.image_dir offline.

  python scripts/colour_folder.py DIR [--train 5000] [--test 1000] \
      [--classes 10] [--size 32] [--seed 0]

writes DIR/train/<class>/<n>.png and DIR/test/<class>/<n>.png, S x S RGB
PNGs, the layout `--config.image_dir` reads (docs/data.md), classes named
`class0`, `class1`, ... (zero-padded, so that they sort in label order),
the images spread over the classes in turn. It stands in for CIFAR-10,
which TFDS downloads and this project's machines cannot: the images are
SYNTHETIC, made from random numbers, and are not CIFAR-10 or any real
photographs. What a model learns from them says nothing of CIFAR-10; step
times, which depend on the images' shape and not their content, do. Needs
numpy and Pillow (the `dev` extra).

How an image of class c is made, each value in 0..255, from one numpy
generator seeded by --seed (the same arguments write the same files):

- class c has a mean colour, an RGB triple drawn uniformly from 64..192
  once per class, and a grating: a sine wave of amplitude 40 across the
  image, at angle pi * c / C and of 2 + (c mod 3) periods across it;
- the image is that mean colour plus the grating (the same in all three
  channels), plus a brightness offset drawn once per image (normal, sd 24),
  plus noise drawn for every pixel and channel (normal, sd 32), rounded
  and clipped to 0..255.

The offset and noise blur the classes' colours into one another: with the
defaults, an image's average colour alone names its class 83% of the time,
the nearest class-mean image 98% (against chance, 1 / C: 10%). A model that
learns them learns what this recipe put in, nothing more.
"""

import argparse
import math
import pathlib
import sys

import numpy as np
from PIL import Image


def class_images(rng, colours, count, c, classes, size):
  """`count` images of class `c`, uint8 [count, size, size, 3]."""
  angle = math.pi * c / classes
  periods = 2 + c % 3
  y, x = np.mgrid[0:size, 0:size] / size
  along = x * math.cos(angle) + y * math.sin(angle)
  grating = 40 * np.sin(2 * math.pi * periods * along)
  offset = rng.normal(0, 24, (count, 1, 1, 1))
  noise = rng.normal(0, 32, (count, size, size, 3))
  images = colours[c] + grating[None, :, :, None] + offset + noise
  return np.clip(np.rint(images), 0, 255).astype(np.uint8)


def write_split(root, split, count, colours, names, size, rng):
  classes = len(names)
  for c, name in enumerate(names):
    folder = root / split / name
    folder.mkdir(parents=True)
    n = len(range(c, count, classes))
    images = class_images(rng, colours, n, c, classes, size)
    for i, image in enumerate(images):
      Image.fromarray(image, 'RGB').save(folder / f'{i:05d}.png')


def main():
  parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0],
    epilog='Synthetic images, not CIFAR-10: see the script for how.',
  )
  parser.add_argument('dir', type=pathlib.Path)
  parser.add_argument('--train', type=int, default=5000)
  parser.add_argument('--test', type=int, default=1000)
  parser.add_argument('--classes', type=int, default=10)
  parser.add_argument('--size', type=int, default=32)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  if args.classes < 2 or args.size < 1:
    parser.error('--classes must be 2 or more, --size 1 or more')
  if min(args.train, args.test) < args.classes:
    parser.error('--train and --test need an image per class at least')
  if args.dir.exists() and any(args.dir.iterdir()):
    sys.exit(f'error: {args.dir} is not empty: name a new folder')
  rng = np.random.default_rng(args.seed)
  colours = rng.uniform(64, 192, (args.classes, 3))
  width = len(str(args.classes - 1))
  names = [f'class{c:0{width}d}' for c in range(args.classes)]
  for split, count in (('train', args.train), ('test', args.test)):
    write_split(args.dir, split, count, colours, names, args.size, rng)
  print(
    f'{args.dir}: {args.train} train and {args.test} test synthetic '
    f'{args.size}x{args.size} RGB images in {args.classes} classes'
  )


if __name__ == '__main__':
  main()
