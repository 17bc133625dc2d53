r"""The recipe trained by Keras's own `model.fit`, one of compare's runs: what
a Keras user gets from `compile(jit_compile=..., steps_per_execution=...)`.

  python -m xla_mnist.inspection.keras_fit <train's flags>

It takes train's flags (compare gives them as to a loop's run) and maps
the jit mode onto fit's: `--jit=off` is `jit_compile=False`, `--jit=on`
`jit_compile=True`, and the config's steps per call (`steps_per_loop`, K)
is `steps_per_execution`. The same model, optimizer (`step.make_optimizer`),
loss, batches (the loop's order, fed by tf.data as a Keras user feeds fit),
steps and threads as the loop's run; it writes `result.json` as a run does
(compare reads it back alike) and `keras.json`, what Keras's default
`jit_compile="auto"` picks here, computed by Keras itself (`auto_pick`).

Timed (`--config.profile_steps=0`): compile is the time to the second
execution's start (the first traces, compiles and runs K steps), train the
rest of fit; no callback waits on a batch's end, so fit dispatches as it
does for a user. Profiled: the last `profile_steps` steps, whole
executions, each marked as a loop's call is (`profiling.Profiler`), its
`breakdown.json` the same kernels and host split.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

from xla_mnist import config as config_lib
from xla_mnist import parse
from xla_mnist.runtime import cli, env, errors, process
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files, outputs

KERAS_FILE = 'keras.json'  # What `jit_compile="auto"` picks, and why.


@dataclasses.dataclass(frozen=True)
class AutoPick:
  """What Keras's default `jit_compile="auto"` resolves to for this model on
  this machine, and the two facts Keras decides it by
  (`keras/src/trainers/trainer.py`, `_resolve_auto_jit_compile`)."""

  picks: bool  # jit_compile as "auto" resolved it.
  accelerators: list[str]  # Device types TF sees beside the CPU.
  supports_jit: bool  # Every layer supports XLA: True is kept, not dropped.

  def said(self) -> str:
    """Why, in a clause."""
    if not self.accelerators:
      return (
        'TensorFlow sees no GPU or TPU here, and Keras turns XLA off on a'
        ' CPU-only machine'
      )
    seen = ', '.join(self.accelerators)
    if not self.supports_jit:
      return f'{seen} seen, but a layer of the model does not support XLA'
    if not self.picks:
      return f'{seen} seen, but Keras does not use XLA under a tf.distribute'
    return f'{seen} seen and every layer supports XLA'

  @classmethod
  def load(cls, workdir: str) -> AutoPick:
    with open(os.path.join(workdir, KERAS_FILE)) as f:
      return cls(**json.load(f))


def auto_pick(net, optimizer, loss) -> AutoPick:
  """Keras's own answer: `net` compiled with "auto", then with True (which
  Keras drops where a layer does not support XLA), each read back."""
  import tensorflow as tf  # noqa: PLC0415 - after `process.prepare`.

  net.compile(optimizer=optimizer, loss=loss, jit_compile='auto')
  picks = bool(net.jit_compile)
  net.compile(optimizer=optimizer, loss=loss, jit_compile=True)
  kinds = {d.device_type for d in tf.config.list_physical_devices()}
  return AutoPick(picks, sorted(kinds - {'CPU'}), bool(net.jit_compile))


def main(argv: list[str]) -> None:
  argv = argv[1:]  # Train's flags, for `parse` and the run's paths.
  config = parse.config_of(argv)
  workdir = parse.value_of('--workdir', argv) or 'logs/fit'
  data_dir = parse.value_of('--data_dir', argv) or './data'
  cache = parse.value_of('--xla_cache_dir', argv)
  outputs.prepare_workdir(workdir)
  process.prepare(config, workdir, cache)
  env.quiet_by_default()
  with env.importing_tensorflow():
    import tensorflow as tf  # noqa: PLC0415 - after `process.prepare`.
  with files.workdir_lock(workdir):
    fit(config, workdir, data_dir, tf)


def fit(config, workdir: str, data_dir: str, tf) -> outputs.Result:
  """Trains `config`'s recipe by `model.fit` in `workdir`: see the top."""
  from xla_mnist import data, step  # noqa: PLC0415
  from xla_mnist import model as model_lib  # noqa: PLC0415
  from xla_mnist.inspection import profiling  # noqa: PLC0415
  from xla_mnist.runtime import devices  # noqa: PLC0415
  from xla_mnist.workdir import checkpointing  # noqa: PLC0415

  process.apply(config, workdir)
  device = devices.select(config.device)
  dataset = data.of_config(config, data_dir)
  per_call = config_lib.steps_per_loop(config)
  steps = config.num_steps
  with tf.device(device):
    net = model_lib.create_model(
      config.model, config.seed, **dataset.facts, precision=config.precision
    )
    probabilities, _ = model_lib.outputs(net, config.model, dataset.image_shape)
    optimizer = step.make_optimizer(net, config)
    loss, one_hot = _loss(net, config, probabilities)
    picked = auto_pick(net, optimizer, loss)
    _compile(net, optimizer, loss, config, per_call)
    batches = _batches(net, dataset.train, config, tf, one_hot)
    profiler = profiling.Profiler.last_steps(
      workdir, config.profile_steps, 0, steps, markers=False
    )
    clock = _Clock(per_call, profiler if config.profile_steps else None)
    start = time.perf_counter()
    history = net.fit(
      batches,
      steps_per_epoch=steps,
      epochs=1,
      shuffle=False,
      verbose=0,
      callbacks=[clock.callback],
    )
    end = time.perf_counter()
    net.optimizer.finalize_variable_values(net.trainable_variables)
    accuracy = step.evaluate(net, 'off', dataset.test)
  profile = profiler.summarize()
  files.write_atomically(
    os.path.join(workdir, KERAS_FILE),
    json.dumps(dataclasses.asdict(picked)) + '\n',
  )
  second = clock.second or end  # One execution: nothing after the compile.
  timed = steps - per_call
  result = outputs.Result(
    **outputs.recipe(config),
    device=device.removeprefix('/device:'),
    steps=steps,
    steps_per_loop=per_call,
    final_loss=float(history.history['loss'][-1]),  # The epoch's mean.
    test_accuracy=accuracy,
    compile_seconds=second - start,
    train_seconds=end - second if timed else None,
    paused_seconds=0.0,
    steps_per_second=timed / (end - second) if timed else None,
    traces=1,
    hlo_fusions=None,
    profile=dataclasses.asdict(profile) if profile else None,
    workdir=workdir,
    **outputs.machine(),
    data_source=dataset.source_digest,
    image_shape=list(dataset.image_shape),
    class_names=list(dataset.class_names),
    precision=net.dtype_policy.name,
    outputs='probabilities' if probabilities else 'logits',
    recipe=checkpointing.recipe(config, net),
  )
  outputs.write_result(result)
  return result


def _compile(net, optimizer, loss, config, per_call: int) -> None:
  """`net` compiled at the run's setting, which Keras keeps or refuses: it
  turns `jit_compile=True` off with a warning only, for a layer it deems
  unfit for XLA, and the rows would not be XLA's."""
  on = config.jit == 'on'
  net.compile(
    optimizer=optimizer, loss=loss, jit_compile=on,
    steps_per_execution=per_call,
  )  # fmt: skip
  if net.jit_compile != on:
    raise UserError(
      f"Keras's fit turned XLA (jit_compile) off for model {config.model}"
      " (a layer it deems unfit for XLA), so its rows would not be XLA's:"
      f' compare it without fit ({errors.arg("fit", False)})'
    )


def _loss(net, config, probabilities: bool) -> tuple[object, bool]:
  """The loop's loss, as fit is given it, and whether it takes the labels
  one-hot: a user's model's own (compile()'s, its `compute_loss`), as the
  loop trains it (`factory.fit_loss`), else the sparse cross-entropy."""
  import keras  # noqa: PLC0415 - after TF's start.

  if config.model not in config_lib.PACKAGED_MODELS:
    from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

    if factory.own_loss(net):
      return net.loss, factory.takes_one_hot(net)
  return keras.losses.SparseCategoricalCrossentropy(
    from_logits=not probabilities
  ), False


def _batches(net, train, config, tf, one_hot: bool):
  """The loop's batches, in its order, fed by tf.data as a Keras user feeds
  fit, the labels one-hot where the model's loss takes them so."""
  from xla_mnist import data  # noqa: PLC0415
  from xla_mnist import model as model_lib  # noqa: PLC0415

  size, seed, steps = train.size, config.seed, config.num_steps
  rows = next(data.index_blocks(size, config.batch_size, seed, 0, steps))

  def batch(indices):
    images = model_lib.inputs(net, tf.gather(train.images, indices))
    labels = tf.gather(train.labels, indices)
    if one_hot:
      labels = tf.one_hot(labels, net.output_shape[-1])
    return images, labels

  batches = tf.data.Dataset.from_tensor_slices(rows).map(batch)
  return batches.prefetch(tf.data.AUTOTUNE)


class _Clock:
  """fit's callback: the second execution's start, and, profiling, each
  execution of the window traced whole and marked."""

  def __init__(self, per_call: int, profiler) -> None:
    import keras  # noqa: PLC0415

    self.second: float | None = None
    self._per_call = per_call
    self._profiler = profiler
    self._traced = contextlib.ExitStack()
    # Keras waits on a batch's end only for a callback that asks to see it.
    hooks = {'on_train_batch_begin': self._begin}
    if profiler:
      hooks['on_train_batch_end'] = self._end
    self.callback = keras.callbacks.LambdaCallback(**hooks)

  def _begin(self, batch: int, logs=None) -> None:
    if batch == self._per_call and self.second is None:
      self.second = time.perf_counter()
    if self._profiler:
      last = batch + self._per_call
      around = self._profiler.around(batch + 1, last, contextlib.nullcontext)
      self._traced.enter_context(around)

  def _end(self, batch: int, logs=None) -> None:
    float(logs['loss'])  # The marker spans the execution's work.
    self._traced.close()


def run() -> None:
  cli.catch_stop_signals()  # As compare passes them on (`cli`).
  # No flags of its own: train's are parsed by `parse`, absl's left alone.
  cli.run(main, lambda argv: cli.parse(argv, known_only=True))


if __name__ == '__main__':
  run()
