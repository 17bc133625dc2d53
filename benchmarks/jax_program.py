"""The recipe as one whole JAX program: the JAX column of the process table.

  python benchmarks/jax_program.py DATA.npz CACHE_DIR

What a JAX user would run against `python -m xla_mnist.train`, launch to
exit: reads prepared data (`DATA.npz`: uint8 train images [N, 784] and int32
labels, the run's batch order [steps, batch], the test split, the learning
rate; `process.jax_data` writes it), trains from zero weights with
`jax_worker`'s in-step-gather `lax.scan` over all steps in one call, evaluates
on the test split, and prints `train S s` and `test accuracy A`. JAX's
persistent compilation cache in CACHE_DIR holds both programs after a first
run, as the trainer's XLA cache does. Imports numpy and JAX only.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax_worker import compile_scan, make_update, zeros


def _accuracy(params, images, labels) -> float:
  kernel, bias = params
  logits = (images.astype(jnp.float32) / 255.0) @ kernel.T + bias
  return jnp.mean(jnp.argmax(logits, axis=1) == labels)


def main(data: str, cache: str) -> None:
  jax.config.update('jax_compilation_cache_dir', cache)
  # Every program cached, however fast it compiles (defaults skip those
  # under 1 s).
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', -1)
  with np.load(data) as f:
    args = tuple(jnp.asarray(f[k]) for k in ('images', 'labels', 'indices'))
    test = jnp.asarray(f['test_images']), jnp.asarray(f['test_labels'])
    lr = float(f['learning_rate'])
  train = compile_scan(make_update(lr), zeros(args), args)
  start = time.perf_counter()
  params, losses = train(zeros(args), *args)
  losses.block_until_ready()
  seconds = time.perf_counter() - start
  accuracy = float(jax.jit(_accuracy)(params, *test))
  print(f'{len(losses)} steps, final loss {float(losses[-1]):.4f}')
  print(f'train {seconds:.3f} s')
  print(f'test accuracy {accuracy:.4f}')


if __name__ == '__main__':
  main(*sys.argv[1:])
