"""The recipe in JAX, run by `baselines.JaxVariants` in JAX's own interpreter.

  [XLA_MNIST_JAX_PROFILE_DIR=P] python benchmarks/jax_worker.py DIR

Imports numpy and JAX only, never TF or this package: installing JAX beside
TF makes every `import tensorflow` import it too (TF Lite's util module does,
+0.6 s and +150 MB measured), so JAX usually lives in another venv. Reads
`DIR/data.npz` (uint8 images [N, 784], int32 labels, int32 indices [steps,
batch], learning rate), trains from zero weights once per variant, writes each
variant's weights to `DIR/<variant>.npz` in the Linear layout (kernel [10,
784], bias) and prints one JSON list of the timings, steps per call and
losses, with the size of XLA:CPU's thread pool it ran with (set by the
environment: `threads.JAX_SETTINGS`).

With $XLA_MNIST_JAX_PROFILE_DIR (`benchmarks.kernels`; an environment
variable, as `baselines.JaxVariants` passes its environment on), after the
timed runs, lax.scan runs once more under JAX's profiler, never timed: the
capture goes under that folder (`plugins/profile/<time>/<host>.xplane.pb`),
the call marked as one step marker, `train` with step_num = the steps it ran,
as the trainer marks its calls; then `PROFILE.json` beside it names the steps
and the versions. A folder that holds it already is left alone: one
capture per benchmark, not one per round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

PROFILE_DIR_ENV = 'XLA_MNIST_JAX_PROFILE_DIR'
PROFILE_FILE = 'PROFILE.json'
XLA_POOL_THREAD = 'tf_XLAEigen'  # The name of XLA:CPU's pool's threads.
Params = tuple[jax.Array, jax.Array]  # kernel [10, 784], bias [10]


def _loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
  kernel, bias = params
  logits = x @ kernel.T + bias
  picked = jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]
  return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked)


def make_update(lr: float) -> Callable:
  """One SGD step on the batch `rows`, gathered and scaled inside the step."""

  def update(params: Params, images, labels, rows) -> tuple[Params, jax.Array]:
    x = images[rows].astype(jnp.float32) / 255.0
    loss, grads = jax.value_and_grad(_loss)(params, x, labels[rows])
    params = tuple(p - lr * g for p, g in zip(params, grads, strict=True))
    return params, loss

  return update


def _jit_step(update: Callable, params: Params, args: tuple) -> tuple:
  """jax.jit per step, called from a Python loop (the JAX tutorial's loop).

  Called through `jax.jit`'s C++ fast path (an AOT-compiled object's call is
  Python, ms per call); so, as for TF's per-step programs, the first call
  compiles and its step counts as compile.
  """
  images, labels, indices = args
  rows = list(indices)  # Index vectors made before the clock.
  step = jax.jit(update)
  start = time.perf_counter()
  params, loss = step(params, images, labels, rows[0])
  losses = [loss.block_until_ready()]
  compiled = time.perf_counter()
  for batch in rows[1:]:
    params, loss = step(params, images, labels, batch)
    losses.append(loss)
  losses = np.asarray(jnp.stack(losses))  # Waits for all.
  return params, losses, compiled - start, time.perf_counter() - compiled


def compile_scan(update: Callable, params: Params, args: tuple) -> Callable:
  def train(params: Params, images, labels, indices):
    body = lambda p, rows: update(p, images, labels, rows)  # noqa: E731
    return jax.lax.scan(body, params, indices)

  return jax.jit(train).lower(params, *args).compile()


def _scan(update: Callable, params: Params, args: tuple) -> tuple:
  """lax.scan over all steps: the whole loop in one compiled call.

  A first run, discarded, counts as compile: XLA:CPU's first execution in a
  process pays a one-time cost (tens of ms) that the fused TF program's
  warm-up also takes out of its timed calls (docs/speed.md).
  """

  start = time.perf_counter()
  compiled_train = compile_scan(update, params, args)
  jax.block_until_ready(compiled_train(params, *args))
  compiled = time.perf_counter()
  params, losses = compiled_train(params, *args)
  losses = np.asarray(losses)  # Waits for all.
  return params, losses, compiled - start, time.perf_counter() - compiled


def _profile(
  update: Callable, params: Params, args: tuple, folder: str
) -> None:
  """Runs lax.scan over all steps under the profiler, then writes
  PROFILE_FILE.

  Compiled and run once before the trace, so the capture holds neither
  compile nor the first execution's one-time cost; the executable lives
  through the trace, so XLA stores its optimized HLO in the capture.
  """
  compiled_train = compile_scan(update, params, args)
  jax.block_until_ready(compiled_train(params, *args))
  steps = len(args[2])
  jax.profiler.start_trace(folder)
  try:
    with jax.profiler.StepTraceAnnotation('train', step_num=steps):
      jax.block_until_ready(compiled_train(params, *args))
  finally:
    jax.profiler.stop_trace()
  done = os.path.join(folder, PROFILE_FILE)
  with open(done + '.tmp', 'w') as f:
    json.dump({'steps': steps, 'versions': _versions()}, f)
  os.replace(done + '.tmp', done)


VARIANTS = {'jax jit step': _jit_step, 'jax lax.scan': _scan}


def zeros(args: tuple) -> Params:
  return jnp.zeros((10, args[0].shape[1])), jnp.zeros(10)


def main(folder: str) -> None:
  with np.load(f'{folder}/data.npz') as f:
    args = tuple(jnp.asarray(f[k]) for k in ('images', 'labels', 'indices'))
    lr = float(f['learning_rate'])
  update = make_update(lr)
  report = []
  for name, run in VARIANTS.items():
    params, losses, compile_s, train_s = run(update, zeros(args), args)
    per_call = 1 if run is _jit_step else len(losses)
    timed = len(losses) - (run is _jit_step)
    np.savez(f'{folder}/{name}.npz', *(np.asarray(p) for p in params))
    report.append(
      {
        'variant': name,
        'compile_seconds': compile_s,
        'train_seconds': train_s,
        'timed_steps': timed,
        'steps_per_loop': per_call,
        'losses': losses.tolist(),
      }
    )
  profile_dir = os.environ.get(PROFILE_DIR_ENV, '')
  if profile_dir and not os.path.exists(
    os.path.join(profile_dir, PROFILE_FILE)
  ):
    try:  # A diagnostic: the timings stand without it.
      _profile(update, zeros(args), args, profile_dir)
    except Exception as e:  # noqa: BLE001 - whatever the profiler raises.
      print(
        f'warning: no JAX profile: {type(e).__name__}: {e}', file=sys.stderr
      )
  print(
    json.dumps(
      {
        'jax': jax.__version__,
        'xla_pool_threads': _xla_pool_threads(),
        'variants': report,
      }
    )
  )


def _xla_pool_threads() -> int | None:
  """The threads of XLA:CPU's pool in this process, which Linux lists by
  the name XLA gives them (None elsewhere): one per CPU at JAX's defaults,
  $PJRT_NPROC when set."""
  tasks = '/proc/self/task'
  if not os.path.isdir(tasks):
    return None
  count = 0
  for task in os.listdir(tasks):
    try:
      with open(os.path.join(tasks, task, 'comm')) as f:
        count += f.read().strip() == XLA_POOL_THREAD
    except FileNotFoundError:  # A thread that ended since the listing.
      continue
  return count


def _versions() -> dict[str, str]:
  """JAX's and jaxlib's versions and commits: jaxlib carries its XLA."""
  from jax._src import lib  # noqa: PLC0415 - private: the extension version.
  from jaxlib import version as jaxlib_version  # noqa: PLC0415

  return {
    'jax': jax.__version__,
    'jaxlib': jaxlib_version._version,
    'jaxlib_git': jaxlib_version._git_hash or '',
    'xla_extension': str(lib.jaxlib_extension_version),
  }


if __name__ == '__main__':
  main(sys.argv[1])
