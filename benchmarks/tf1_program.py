r"""TF1's mnist_softmax_xla.py as TF1 users ran it, through tf.compat.v1.

  python -m benchmarks.tf1_program [--xla] [--steps=1000] [--trace=FILE]

A graph with placeholders, a session fed numpy batches by `feed_dict`,
`GradientDescentOptimizer`, XLA through the session's `global_jit_level`, and
the last step traced into a Chrome timeline. The benchmark imports `train`
(same data and batch order as every variant); run whole, it is the other
column of the whole-process table: it reads the IDX files with numpy and
shuffles each epoch with numpy, as TF1's `input_data` did, and imports
nothing of this package.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import time

import numpy as np

from benchmarks import threads

FASHION_DIR = '/usr/share/datasets/fashion-mnist'


def train(
  images: np.ndarray,
  labels: np.ndarray,
  indices: np.ndarray,
  learning_rate: float,
  xla: bool,
  trace: str = '',
) -> tuple[float, float, np.ndarray, list[np.ndarray]]:
  """Trains on float32 `images` [N, 784] in [0, 1], batch `indices[i]` at i.

  Returns (compile s, train s, losses, [kernel [784, 10], bias]). Compile is
  everything up to the end of the first step (graph, session, XLA); train is
  the remaining steps, each a `sess.run` of the update and the loss.
  """
  import tensorflow as tf

  tf1 = tf.compat.v1
  start = time.perf_counter()
  graph = tf.Graph()
  with graph.as_default():
    x = tf1.placeholder(tf.float32, [None, images.shape[1]])
    y_ = tf1.placeholder(tf.int64, [None])
    w = tf1.Variable(tf.zeros([images.shape[1], 10]))
    b = tf1.Variable(tf.zeros([10]))
    y = tf.matmul(x, w) + b
    loss = tf1.losses.sparse_softmax_cross_entropy(labels=y_, logits=y)
    train_step = tf1.train.GradientDescentOptimizer(learning_rate).minimize(
      loss
    )
    init = tf1.global_variables_initializer()
  config = tf1.ConfigProto(
    intra_op_parallelism_threads=threads.TF1_POOL_THREADS,
    inter_op_parallelism_threads=threads.TF1_POOL_THREADS,
  )
  levels = tf1.OptimizerOptions
  config.graph_options.optimizer_options.global_jit_level = (
    levels.ON_1 if xla else levels.OFF
  )
  losses = np.empty(len(indices), np.float32)
  with tf1.Session(graph=graph, config=config) as sess:
    sess.run(init)
    for i, rows in enumerate(indices):
      if i == 1:
        compiled = time.perf_counter()
      feed = {x: images[rows], y_: labels[rows]}
      if trace and i == len(indices) - 1:
        losses[i] = _traced_step(sess, [train_step, loss], feed, trace)[1]
      else:
        losses[i] = sess.run([train_step, loss], feed_dict=feed)[1]
    end = time.perf_counter()
    weights = sess.run([w, b])
  if len(indices) == 1:
    compiled = end
  return compiled - start, end - compiled, losses, weights


def _traced_step(sess, fetches: list, feed: dict, path: str) -> list:
  """One `sess.run` traced into a Chrome timeline, as the TF1 program did."""
  import tensorflow as tf
  from tensorflow.python.client import timeline

  options = tf.compat.v1.RunOptions(
    trace_level=tf.compat.v1.RunOptions.FULL_TRACE
  )
  metadata = tf.compat.v1.RunMetadata()
  out = sess.run(fetches, feed, options=options, run_metadata=metadata)
  with open(path, 'w') as f:
    f.write(
      timeline.Timeline(metadata.step_stats).generate_chrome_trace_format()
    )
  return out


def read_idx(folder: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """float32 images [N, 784] in [0, 1] and int64 labels, as `input_data`."""
  prefix = 'train' if split == 'train' else 't10k'
  with gzip.open(f'{folder}/{prefix}-images-idx3-ubyte.gz') as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16)
  with gzip.open(f'{folder}/{prefix}-labels-idx1-ubyte.gz') as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
  images = images.reshape(len(labels), -1).astype(np.float32)
  return images / np.float32(255.0), labels


def epoch_indices(size: int, batch: int, steps: int, seed: int) -> np.ndarray:
  """[steps, batch] rows: each epoch a numpy permutation, remainder dropped."""
  rng = np.random.RandomState(seed)
  per_epoch = size // batch
  epochs = -(-steps // per_epoch)
  orders = [rng.permutation(size)[: per_epoch * batch] for _ in range(epochs)]
  return np.concatenate(orders).reshape(-1, batch)[:steps]


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[1])
  parser.add_argument('--xla', action='store_true')
  parser.add_argument('--steps', type=int, default=1000)
  parser.add_argument('--batch_size', type=int, default=100)
  parser.add_argument('--data', default=FASHION_DIR)
  parser.add_argument('--trace', default='', help='Chrome timeline file.')
  args = parser.parse_args(argv)
  if args.xla:  # Read once, when TF starts: ON_1 clusters nothing without it.
    os.environ['TF_XLA_FLAGS'] = '--tf_xla_cpu_global_jit'
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  images, labels = read_idx(args.data, 'train')
  indices = epoch_indices(len(labels), args.batch_size, args.steps, seed=1)
  compile_s, train_s, losses, (w, b) = train(
    images, labels, indices, 0.5, args.xla, args.trace
  )
  test_images, test_labels = read_idx(args.data, 'test')
  accuracy = np.mean(np.argmax(test_images @ w + b, axis=1) == test_labels)
  print(
    f'test accuracy {accuracy:.4f}  (compile {compile_s:.2f} s, train'
    f' {train_s:.3f} s, final loss {losses[-1]:.4f})'
  )


if __name__ == '__main__':
  main(sys.argv[1:])
