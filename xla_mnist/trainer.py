"""From a config to a trained model and its `Result`: the run's wiring.

Importable from a notebook:

  trained = trainer.train_and_evaluate(get_config(), workdir, data_dir)
  trained.result.test_accuracy, trained.model

A run reads as three phases: build (placement, data, model, checkpoint,
program), fit (the loop and its actions), conclude (evaluation, profile, the
result). One path for every strategy: the process's role (which folders it
writes and reads, whether it keeps outputs) is decided once, by
`distribute.role`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import ml_collections
import tensorflow as tf

from xla_mnist import (
  checkpointing,
  data,
  devices,
  distribute,
  files,
  hlo,
  loop,
  model,
  outputs,
  profiling,
  program,
  report,
  reporting,
  signals,
  step,
)


@dataclasses.dataclass(frozen=True)
class Trained:
  result: outputs.Result
  model: tf.keras.Model
  # The workdir held this run finished: nothing was trained, and `result`
  # is the stored one.
  was_finished: bool = False


@dataclasses.dataclass(frozen=True)
class _Built:
  """What the build phase hands to fit and conclude."""

  device: str
  placement: contextlib.AbstractContextManager
  dataset: data.Data
  net: tf.keras.Model
  optimizer: tf.keras.optimizers.Optimizer
  checkpointer: checkpointing.Checkpointer
  start: int


@dataclasses.dataclass(frozen=True)
class _Fitted:
  """What the fit phase hands to conclude."""

  compiled: program.Compiled
  stats: loop.LoopStats
  profiler: profiling.Profiler
  hlo_fusions: int | None  # `dump_hlo` with jit 'on': fusions in the step.


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  data_dir: str,
  *,
  fresh: bool = False,
  profiler_port: int = 0,
  quiet: bool = False,
) -> Trained:
  """Trains `config`'s recipe, evaluates on the test split, writes outputs.

  Resumes from the workdir's latest checkpoint unless `fresh`; a run found
  finished is returned as it is. `quiet` prints only warnings (the outputs
  are written all the same). A `profiler_port` starts TF's profiler server
  there, for captures while the run trains.

  Raises:
    errors.Stopped: after saving, when a signal asked to stop (at the
      loop's next call boundary; after the last, the run just finishes).
    errors.UserError: naming the argument or config field to change.
  """
  with reporting.lines(quiet):
    return _train_and_evaluate(config, workdir, data_dir, fresh, profiler_port)


def _train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  data_dir: str,
  fresh: bool,
  profiler_port: int,
) -> Trained:
  step.configure_jit(config.jit)  # Before anything compiles a function.
  if profiler_port:
    profiling.start_server(profiler_port)
  outputs.prepare_workdir(workdir)
  devices.configure_threads(config.cpu_threads)
  # Before anything initialises TF's devices: it may split the CPU.
  strategy = distribute.make_strategy(config.strategy, config.num_cpu_devices)
  with (
    distribute.role(strategy, workdir) as role,
    files.workdir_lock(role.write_dir),
    distribute.lost_workers_as_errors(strategy),
    # A signal is kept for the loop's next call boundary (see StopRequest).
    signals.StopRequest(alone=not distribute.has_workers(strategy)) as stop,
    contextlib.closing(
      reporting.Reporter(role.write_dir if role.keeps_outputs else '')
    ) as reporter,
  ):
    built = _build(config, role, strategy, data_dir, fresh, reporter)
    if built.start >= config.num_steps:
      if previous := outputs.read_result(role.restore_dir):
        return Trained(previous, built.net, was_finished=True)
      reporter.line(
        f'note: {built.checkpointer.restore_directory} holds step'
        f' {built.start} of {config.num_steps} but no {outputs.RESULT_FILE}:'
        ' evaluating the restored model; its speed was not measured'
      )
    fitted = _fit(
      built, config, role, strategy, stop, reporter, fresh, profiler_port
    )
    if fitted.stats.stopped_by:
      stats, where = fitted.stats, built.checkpointer.restore_directory
      raise signals.stopped(
        stats.stopped_by, stop.signum, stats.last_step, where
      )
    result = _conclude(built, fitted, config, role, reporter)
  return Trained(result, built.net)


def _build(
  config: ml_collections.ConfigDict,
  role: distribute.Role,
  strategy: tf.distribute.Strategy,
  data_dir: str,
  fresh: bool,
  reporter: reporting.Reporter,
) -> _Built:
  """Placement, data, model and optimizer, and the restored step."""
  device, placement = distribute.placement(strategy, config)
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  reporter.line(
    ('prepared ' if dataset.prepared_now else 'using ') + dataset.source
  )
  with placement, strategy.scope():
    net = model.create_model()
    optimizer = tf.keras.optimizers.SGD(config.learning_rate)
    optimizer.build(net.trainable_variables)
  # Outside the strategy's scope: its string fingerprint cannot be mirrored.
  checkpointer = checkpointing.Checkpointer(
    os.path.join(role.write_dir, checkpointing.CHECKPOINT_DIR),
    os.path.join(role.restore_dir, checkpointing.CHECKPOINT_DIR),
    net,
    optimizer,
    config,
    device,
    dataset.source_digest,
  )
  with placement:
    start = checkpointer.restore(fresh)
    distribute.check_same_start(strategy, start)
  if 0 < start < config.num_steps:
    where = checkpointer.restore_directory
    reporter.line(f'resuming at step {start} from {where}')
  return _Built(device, placement, dataset, net, optimizer, checkpointer, start)


def _fit(
  built: _Built,
  config: ml_collections.ConfigDict,
  role: distribute.Role,
  strategy: tf.distribute.Strategy,
  stop: signals.StopRequest,
  reporter: reporting.Reporter,
  fresh: bool,
  profiler_port: int,
) -> _Fitted:
  """The compiled program, its graph and HLO, and the loop over it."""
  start, end = built.start, config.num_steps
  with built.placement:
    compiled = program.make(
      built.net, built.optimizer, built.dataset.train, config, start, strategy
    )
    # The step's graph for TensorBoard, from the run's one trace.
    reporter.graph(compiled.fn.get_concrete_function(*compiled.specs).graph)
    fusions = _dump_hlo(compiled, config, role.write_dir, reporter)
    profile_steps = config.profile_steps if role.keeps_outputs else 0
    # The last steps, as TF1 traced its last one; never the compile.
    profiler = profiling.Profiler(
      role.write_dir,
      max(end - profile_steps + 1, start + 2),
      end,
      markers=bool(profiler_port),
    )
    actions = (
      loop.LogProgress(config.log_every, reporter.progress).action(),
      loop.Action(
        _saver(built.checkpointer, reporter, fresh),
        config.checkpoint_every,
        losses=True,  # The loop checks them first: no diverged save.
      ),
    )
    stats = loop.Loop(
      compiled.program,
      actions,
      learning_rate=config.learning_rate,
      wrappers=(profiler.around,),
      begin=stop.begin,
      signal=lambda: stop.signum,
      agree=distribute.worker_max(strategy),  # Workers stop together.
    ).run(start, end)
  return _Fitted(compiled, stats, profiler, fusions)


def _saver(
  checkpointer: checkpointing.Checkpointer,
  reporter: reporting.Reporter,
  fresh: bool,
):
  """The checkpoint action: what a checkpoint holds is in TensorBoard too.

  The events are flushed before the save, so that a run killed after it
  resumes with no gap in its scalars (steps after it may repeat). A fresh
  run drops the old run's event files at its first save, as it drops the
  old checkpoints: left beside the new ones, TensorBoard would draw both
  runs as one line; a fresh run that fails before then loses nothing.
  """

  def save(boundary: loop.Boundary) -> None:
    reporter.flush()
    checkpointer.save(boundary.last, float(boundary.losses[-1]))
    if fresh:  # Once the new checkpoint is named.
      reporter.discard_earlier_runs()

  return save


def _conclude(
  built: _Built,
  fitted: _Fitted,
  config: ml_collections.ConfigDict,
  role: distribute.Role,
  reporter: reporting.Reporter,
) -> outputs.Result:
  """Evaluation, the profile's summary, the result and its outputs."""
  with built.placement:
    evaluate = step.make_eval_step(built.net, config.jit)
    test = built.dataset.test
    accuracy = float(evaluate(test.images, test.labels))
  reporter.scalars(config.num_steps, {'eval/test_accuracy': accuracy})
  compiled = fitted.compiled
  graph = compiled.fn.get_concrete_function(*compiled.specs).graph
  profile = fitted.profiler.summarize(graph)
  for line in profile.lines() if profile else []:
    reporter.line(line)
  if config.dump_hlo and config.jit == 'auto':
    clusters = hlo.summarize_clusters(
      os.path.join(role.write_dir, hlo.CLUSTER_DIR)
    )
    for line in clusters.lines() if clusters else ['auto-clustering: none']:
      reporter.line(line)
  ran = built.start < config.num_steps  # Else: the restored model, untimed.
  stats = fitted.stats
  result = outputs.Result(
    dataset=config.dataset,
    jit=config.jit,
    device=built.device,
    steps=config.num_steps if ran else built.start,  # The model's steps.
    batch_size=config.batch_size,
    steps_per_loop=compiled.program.steps_per_loop,
    final_loss=stats.last_loss if ran else built.checkpointer.restored_loss,
    test_accuracy=accuracy,
    **_speed(stats if ran else None),
    traces=compiled.fn.experimental_get_tracing_count(),
    hlo_fusions=fitted.hlo_fusions,
    profile=dataclasses.asdict(profile) if profile else None,
    workdir=role.write_dir if role.keeps_outputs else '',
    device_peak_mib=devices.peak_mib(built.device),
    config=config.to_dict(),
    data_source=built.dataset.source_digest,
    **outputs.machine(),
  )
  if role.keeps_outputs:
    report.publish(result, config, reporter)
  return result


def _speed(stats: loop.LoopStats | None) -> dict[str, float | None]:
  """The loop's time figures; None for what it did not measure: all of them
  when it ran no step, the rate when every step was in the compiling call."""
  timed = stats is not None and stats.timed_steps > 0
  return {
    'compile_seconds': stats.compile_seconds if stats else None,
    'train_seconds': stats.train_seconds if timed else None,
    'paused_seconds': stats.paused_seconds if stats else None,
    'steps_per_second': (
      stats.timed_steps / max(stats.train_seconds, 1e-9) if timed else None
    ),
  }


def _dump_hlo(
  compiled: program.Compiled,
  config: ml_collections.ConfigDict,
  workdir: str,
  reporter: reporting.Reporter,
) -> int | None:
  """`dump_hlo` with jit 'on': the HLO files and the fusion count."""
  if not (config.dump_hlo and config.jit == 'on'):
    return None
  dump = hlo.dump(
    compiled.fn, compiled.specs, os.path.join(workdir, hlo.HLO_DIR)
  )
  for line in dump.lines():
    reporter.line(line)
  return dump.fusions
