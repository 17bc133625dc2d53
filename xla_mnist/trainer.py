"""The training loop: config in, a trained model and its `Result` out.

Importable from a notebook: `train_and_evaluate(get_config(), workdir, dir)`.
The loop runs calls of up to K steps (`steps_per_loop`) of a compiled program
over the resident uint8 dataset: K = 1 calls the step once per batch, K > 1
runs K steps inside one program (tf.distribute strategies run one step per
call, fed by tf.data). Every call boundary is a place to log, check the loss,
checkpoint and profile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterator

import ml_collections
import numpy as np
import tensorflow as tf

from xla_mnist import (
  checkpointing,
  data,
  devices,
  distribute,
  files,
  hlo,
  model,
  outputs,
  profiling,
  report,
  step,
)
from xla_mnist.errors import Stopped

# steps_per_loop = 0 picks this K for --jit=on, 1 for the other modes.
FUSED_STEPS = 100


@dataclasses.dataclass(frozen=True)
class Program:
  """A compiled training function and the way the loop calls it."""

  fn: tf.types.experimental.PolymorphicFunction
  specs: tuple  # Its input signature, for the graph and the HLO dump.
  steps_per_call: int
  run: Callable[[int], tf.Tensor]  # count -> losses: [count] or a scalar.
  warm_up: Callable[[], None] | None  # Compiles without training, if it can.


def steps_per_loop(config: ml_collections.ConfigDict) -> int:
  if config.steps_per_loop:
    return min(config.steps_per_loop, config.num_steps)
  fused = config.jit == 'on' and config.strategy == 'default'
  return min(FUSED_STEPS, config.num_steps) if fused else 1


def make_program(
  net: tf.keras.Model,
  optimizer: tf.keras.optimizers.Optimizer,
  train: data.Split,
  config: ml_collections.ConfigDict,
  start_step: int,
  strategy: tf.distribute.Strategy,
) -> Program:
  """Builds the training function for the config's jit mode, K and strategy.

  The loop calls the traced concrete function, not the `tf.function`: that
  skips matching Python arguments to a trace, a sizeable part of a small
  step's dispatch time.
  """
  batch = config.batch_size
  k = steps_per_loop(config)
  if config.strategy != 'default':  # One step per call, fed by tf.data.
    fn = distribute.make_distributed_step(
      strategy, net, optimizer, config.jit, batch
    )
    specs = (
      tf.TensorSpec((batch, *train.images.shape[1:]), tf.uint8),
      tf.TensorSpec((batch,), tf.int64),
    )
    batches = _started(
      data.train_batches(train, batch, config.seed, start_step)
    )
    return Program(fn, specs, 1, lambda _: fn(*next(batches)), warm_up=None)
  # A block of indices per call of K > 1; for K = 1, one tf.data call and
  # one unstack per FUSED_STEPS steps, not per step.
  blocks = _started(
    data.batch_indices(train.size, batch, config.seed, start_step).batch(
      k if k > 1 else FUSED_STEPS
    )
  )
  data_specs = (
    tf.TensorSpec(train.images.shape, tf.uint8),
    tf.TensorSpec(train.labels.shape, tf.int64),
  )
  if k == 1:
    fn = step.make_indexed_step(net, optimizer, config.jit, batch)
    specs = (*data_specs, tf.TensorSpec((batch,), tf.int32))
    call = fn.get_concrete_function(*specs)
    rows = (row for block in blocks for row in tf.unstack(block))

    def run_step(_: int) -> tf.Tensor:
      return call(train.images, train.labels, next(rows))

    # The first step compiles: no warm-up.
    return Program(fn, specs, 1, run_step, warm_up=None)
  fn = step.make_train_loop(net, optimizer, config.jit, batch)
  specs = (
    *data_specs,
    tf.TensorSpec((k, batch), tf.int32),
    tf.TensorSpec((), tf.int32),
  )
  call = fn.get_concrete_function(*specs)

  def run(count: int) -> tf.Tensor:
    losses = call(train.images, train.labels, next(blocks), tf.constant(count))
    return losses if count == k else losses[:count]

  def warm_up() -> None:
    no_steps = (tf.zeros((k, batch), tf.int32), tf.constant(0))
    call(train.images, train.labels, *no_steps).numpy()

  return Program(fn, specs, k, run, warm_up)


def _started(dataset: tf.data.Dataset) -> Iterator:
  """An iterator over `dataset` whose first element is already made.

  tf.data starts its pipeline at the first element (tens of ms here): set-up,
  not training, so it happens before the loop's clock starts.
  """
  iterator = iter(dataset)
  return itertools.chain([next(iterator)], iterator)


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  data_dir: str,
  fresh: bool = False,
) -> outputs.Result:
  """Trains `config`'s recipe, evaluates on the test split, writes outputs.

  Resumes from the workdir's latest checkpoint unless `fresh`. Raises
  `Stopped` after saving when SIGINT or SIGTERM arrives. Under a multi-worker
  strategy only the chief keeps outputs. The other workers resume from the
  chief's checkpoints in `workdir` (TF's pattern: the workers share it), write
  theirs (saving is collective) to a temporary folder deleted at the end, and
  do not profile.
  """
  step.configure_jit(config.jit)  # Before anything compiles a function.
  outputs.prepare_workdir(workdir)
  devices.configure_threads(config.cpu_threads)
  # Before anything initialises TF's devices: it may split the CPU.
  strategy = distribute.make_strategy(config.strategy, config.num_cpu_devices)
  if distribute.is_chief(strategy):
    with (
      files.workdir_lock(workdir),
      distribute.lost_workers_as_errors(strategy),
    ):
      result = _train(config, workdir, data_dir, fresh, strategy)
      outputs.write_result(result)
      report.write_report(result, config)
    return result
  unprofiled = config.copy_and_resolve_references()
  with unprofiled.unlocked():
    unprofiled.profile_steps = 0
  with (
    distribute.lost_workers_as_errors(strategy),
    tempfile.TemporaryDirectory(prefix='xla_mnist-worker-') as scratch,
  ):
    result = _train(unprofiled, scratch, data_dir, fresh, strategy, workdir)
  return dataclasses.replace(result, workdir='')


def _train(
  config: ml_collections.ConfigDict,
  workdir: str,
  data_dir: str,
  fresh: bool,
  strategy: tf.distribute.Strategy,
  resume_from: str = '',
) -> outputs.Result:
  """Data, model, program, loop and evaluation, writing into `workdir`.

  Resumes from the checkpoints of `resume_from`, if given, not `workdir`'s.
  """
  if config.strategy == 'default':
    device = devices.select(config.device)
    placement = tf.device(device)
  else:
    device = f'{strategy.num_replicas_in_sync} replicas ({config.strategy})'
    placement = contextlib.nullcontext()
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  print(('prepared ' if dataset.prepared_now else 'using ') + dataset.source)

  with placement, strategy.scope():
    net = model.create_model()
    optimizer = tf.keras.optimizers.SGD(config.learning_rate)
    optimizer.build(net.trainable_variables)
  # Outside the strategy's scope: its string fingerprint cannot be mirrored.
  checkpointer = checkpointing.Checkpointer(
    workdir, net, optimizer, config, resume_from
  )
  checkpoints = checkpointer.resume_directory
  with placement:
    start_step = checkpointer.restore(fresh)
    distribute.check_same_start(strategy, start_step)
    if start_step >= config.num_steps:
      previous = outputs.read_result(resume_from or workdir)
      raise Stopped(
        (previous.summary() + '\n' if previous else '')
        + f'{checkpoints} holds this finished run ({start_step}'
        ' steps), left as it is: pass --fresh to train again'
      )
    if start_step:
      print(f'resuming at step {start_step} from {checkpoints}')
    program = make_program(
      net, optimizer, dataset.train, config, start_step, strategy
    )
    writer = tf.summary.create_file_writer(workdir)
    with writer.as_default(step=start_step):
      # The first scalar sets up TF's summary ops (about 0.1 s): here, not in
      # the timed loop.
      tf.summary.scalar('learning_rate', config.learning_rate)
      # The step's graph for TensorBoard, from the run's one trace (made here
      # under a strategy, in `make_program` on one device).
      tf.summary.graph(program.fn.get_concrete_function(*program.specs).graph)
      hlo_fusions = _dump_hlo(program, config, workdir)
      loop = _Loop(config, workdir, start_step, program, checkpointer)
      with checkpointing.StopRequest() as stop:
        loop.run(stop)
      evaluate = step.make_eval_step(net, config.jit)
      accuracy = float(evaluate(dataset.test.images, dataset.test.labels))
      tf.summary.scalar('test_accuracy', accuracy, step=config.num_steps)
    writer.close()

  profile = loop.profiler.summarize()
  for line in profile.lines() if profile else []:
    print(line)
  if config.dump_hlo and config.jit == 'auto':
    clusters = hlo.summarize_clusters(os.path.join(workdir, hlo.CLUSTER_DIR))
    for line in clusters.lines() if clusters else ['auto-clustering: none']:
      print(line)
  result = outputs.Result(
    dataset=config.dataset,
    jit=config.jit,
    device=device.removeprefix('/device:'),
    steps=config.num_steps,
    batch_size=config.batch_size,
    steps_per_loop=program.steps_per_call,
    final_loss=loop.last_loss,
    test_accuracy=accuracy,
    compile_seconds=loop.compile_seconds,
    train_seconds=loop.train_seconds,
    other_seconds=loop.other_seconds,
    steps_per_second=loop.timed_steps / max(loop.train_seconds, 1e-9),
    traces=program.fn.experimental_get_tracing_count(),
    hlo_fusions=hlo_fusions,
    profile=dataclasses.asdict(profile) if profile else None,
    workdir=workdir,
  )
  return result


def _dump_hlo(
  program: Program, config: ml_collections.ConfigDict, workdir: str
) -> int | None:
  """`--dump_hlo` with `--jit=on`: the HLO files and the fusion count."""
  if not (config.dump_hlo and config.jit == 'on'):
    return None
  dump = hlo.dump(program.fn, program.specs, os.path.join(workdir, hlo.HLO_DIR))
  for line in dump.lines():
    print(line)
  return dump.fusions


class _Loop:
  """Runs the training calls and does the work due at their boundaries."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    workdir: str,
    start_step: int,
    program: Program,
    checkpointer: checkpointing.Checkpointer,
  ):
    self.config = config
    self.program = program
    self.checkpointer = checkpointer
    self.step = self.start_step = start_step
    last = config.num_steps
    # The last few steps, as TF1 traced its last one; never the compile.
    first = max(last - config.profile_steps + 1, start_step + 2)
    self.profiler = profiling.Profiler(workdir, first, last)
    self.compile_seconds = 0.0
    self.train_seconds = 0.0
    self.timed_steps = 0
    self.last_loss = float('nan')
    self._pending: list[tuple[int, tf.Tensor]] = []  # (first step, losses)
    self._window = (start_step, 0.0)  # (step, clock) of the last log line.
    self._saving_seconds = 0.0  # Checkpoint saves between calls.

  @property
  def other_seconds(self) -> float:
    """Checkpoint saves and profiler set-up: not training, not timed as it."""
    return self._saving_seconds + self.profiler.seconds

  def _clock(self) -> float:
    """The training clock: wall time less `other_seconds`."""
    return time.perf_counter() - self.other_seconds

  def run(self, stop: checkpointing.StopRequest) -> None:
    if self.program.warm_up:
      start = time.perf_counter()
      self.program.warm_up()
      self.compile_seconds = time.perf_counter() - start
    train_start = self._clock()
    self._window = (self.step, train_start)
    while self.step < self.config.num_steps:
      first = self.step + 1
      last = min(self.step + self.program.steps_per_call, self.config.num_steps)
      call_start = self._clock()
      with self.profiler.step(first, last):
        losses = self.program.run(last - first + 1)
        if self.profiler.covers(first, last):
          losses = losses.numpy()  # The marker must span the work.
      self._pending.append((first, losses))
      self.step = last
      if not self.program.warm_up and first == self.start_step + 1:
        np.asarray(losses)  # This call compiled; wait for it.
        train_start = self._clock()
        self.compile_seconds = train_start - call_start
        self._window = (first, train_start)
      if self._due(first, last):
        self._sync()
      if stop.requested or self.checkpointer.should_save(last):
        self._sync()  # Never save a diverged state: the loss is checked.
        save_start = time.perf_counter()
        self.checkpointer.save(last)
        self._saving_seconds += time.perf_counter() - save_start
      if stop.requested:
        saver = self.checkpointer
        where = (
          f'checkpoint saved in {saver.directory}; run the same command to'
          ' resume'
          if saver.resumes_from_own
          else "this worker keeps no checkpoints; all resume from the chief's"
          f' latest in {saver.resume_directory}'
        )
        raise Stopped(
          f'stopped by {stop.requested} after step {last}: {where}',
          stop.signum,
        )
    self._sync()
    self.train_seconds = self._clock() - train_start
    # Without a warm-up, the first call's step was timed as the compile.
    ran = self.step - self.start_step
    self.timed_steps = ran - (ran > 0 and not self.program.warm_up)
    self.checkpointer.save(self.step)

  def _due(self, first: int, last: int) -> bool:
    """Whether a log step falls in first..last, or training ends there."""
    every = self.config.log_every
    return last // every > (first - 1) // every or last == self.config.num_steps

  def _sync(self) -> None:
    """Waits for the pending calls, then logs their loss at the cadence."""
    if not self._pending:
      return
    firsts, losses = zip(*self._pending, strict=True)
    values = np.concatenate([np.reshape(v, -1) for v in losses])
    self._pending.clear()
    now = self._clock()
    window_step, window_time = self._window
    rate = (self.step - window_step) / max(now - window_time, 1e-9)
    self._window = (self.step, now)
    self.last_loss = float(values[-1])
    for offset, loss in enumerate(values):
      i = firsts[0] + offset
      checkpointing.check_finite(loss, i, self.config.learning_rate)
      if i % self.config.log_every == 0 or i == self.config.num_steps:
        print(
          f'step {i:>6}/{self.config.num_steps}'
          f'  loss {loss:.4f}  {rate:,.0f} steps/s'
        )
        tf.summary.scalar('loss', loss, step=i)
        tf.summary.scalar('steps_per_second', rate, step=i)
