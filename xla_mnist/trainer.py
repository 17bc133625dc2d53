"""From a config to a trained model and its `Result`: the run's wiring.

Importable from a notebook:

  trained = trainer.train_and_evaluate(get_config(), workdir, data_dir)
  trained.result.test_accuracy, trained.model

One path for every strategy: the process's role (which folders it writes and
reads, whether it keeps outputs) is decided once, by `distribute.role`; the
data, the model, the compiled program, the restore, the loop with its
actions, the evaluation and the outputs follow.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import tensorflow as tf
from tensorboard.plugins.hparams import api as hp

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
  signals,
  step,
)
from xla_mnist.errors import UserError


@dataclasses.dataclass(frozen=True)
class Trained:
  result: outputs.Result
  model: tf.keras.Model
  # The workdir held this run finished: nothing was trained, and `result`
  # is the stored one.
  was_finished: bool = False


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  data_dir: str,
  fresh: bool = False,
  profiler_port: int = 0,
) -> Trained:
  """Trains `config`'s recipe, evaluates on the test split, writes outputs.

  Resumes from the workdir's latest checkpoint unless `fresh`; a run found
  finished is returned as it is. Raises `errors.Stopped` after saving when
  SIGINT or SIGTERM arrives (at the loop's next call boundary; after the
  last, the run just finishes), and `errors.UserError` (naming the argument or
  config field to change) for what the caller can fix. A `profiler_port`
  starts TF's profiler server there, for captures while the run trains, and
  marks every call as a step for them.
  """
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
    # From here on, a signal is kept for the loop's next call boundary.
    signals.StopRequest() as stop,
  ):
    try:
      trained = _train(
        config, role, data_dir, fresh, strategy, profiler_port, stop
      )
    except tf.errors.OpError as e:
      # TF names the event file it failed to write; other errors pass.
      if _EVENTS_PREFIX not in str(e):
        raise
      reason = str(e).rpartition('}}')[2].splitlines()[0].rpartition('; ')[2]
      raise UserError(
        f'cannot write the TensorBoard events into {role.write_dir}'
        f' ({reason}): free space there and run the same command again, or'
        ' pass another workdir=DIR'
      ) from None
    if role.keeps_outputs and not trained.was_finished:
      try:
        outputs.write_result(trained.result)
        report.write_report(trained.result, config)
      except OSError as e:
        raise UserError(
          f'cannot write the result into {workdir} ({e.strerror}): free'
          ' space there and run the same command again, or pass another'
          ' workdir=DIR'
        ) from None
  return trained


_EVENTS_PREFIX = 'events.out.tfevents.'  # TensorBoard's event files.


def _event_files(directory: str) -> list[str]:
  """The TensorBoard event files in `directory`, as a fresh run replaces.

  TensorBoard draws every file of a run folder: left beside a fresh run's,
  an old run's scalars would cross the new ones at the same steps.
  """
  if not os.path.isdir(directory):
    return []
  names = sorted(
    n for n in os.listdir(directory) if n.startswith(_EVENTS_PREFIX)
  )
  return [os.path.join(directory, n) for n in names]


def _train(
  config: ml_collections.ConfigDict,
  role: distribute.Role,
  data_dir: str,
  fresh: bool,
  strategy: tf.distribute.Strategy,
  profiler_port: int,
  stop: signals.StopRequest,
) -> Trained:
  device, placement = distribute.placement(strategy, config)
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  print(('prepared ' if dataset.prepared_now else 'using ') + dataset.source)
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
  )
  with placement:
    start = checkpointer.restore(fresh, superseded=_event_files(role.write_dir))
    end = config.num_steps
    distribute.check_same_start(strategy, start)
  ran = start < end  # Else the result is the restored model's, untimed.
  if not ran:
    if previous := outputs.read_result(role.restore_dir):
      return Trained(previous, net, was_finished=True)
    print(
      f'note: {checkpointer.restore_directory} holds step {start} of {end}'
      f' but no {outputs.RESULT_FILE}: evaluating the restored model; its'
      ' speed was not measured'
    )
  elif start:
    print(f'resuming at step {start} from {checkpointer.restore_directory}')
  with placement:
    compiled = program.make(
      net, optimizer, dataset.train, config, start, strategy
    )
    writer = tf.summary.create_file_writer(role.write_dir)
    with writer.as_default(step=start):
      # The first scalar sets up TF's summary ops (slow, once): here, not in
      # the timed loop.
      tf.summary.scalar('train/learning_rate', config.learning_rate)
      # The step's graph for TensorBoard, from the run's one trace.
      tf.summary.graph(compiled.fn.get_concrete_function(*compiled.specs).graph)
      hlo_fusions = _dump_hlo(compiled, config, role.write_dir)
      clock = loop.Clock()
      profile_steps = config.profile_steps if role.keeps_outputs else 0
      # The last steps, as TF1 traced its last one; never the compile.
      profiler = profiling.Profiler(
        role.write_dir,
        max(end - profile_steps + 1, start + 2),
        end,
        clock,
        markers=bool(profiler_port),
      )
      save = checkpointing.SaveCheckpoint(
        checkpointer, config.checkpoint_every, clock, writer.flush
      )
      actions = (
        loop.CheckFinite(config.learning_rate),  # First: before any save.
        loop.LogProgress(config.log_every, clock, _scalars),
        profiler,
        save,
        signals.StopOnSignal(
          stop,
          save,
          checkpointer.restore_directory,
          distribute.worker_max(strategy),  # Workers stop together.
        ),
      )
      stats = loop.Loop(compiled.program, actions, clock).run(start, end)
      evaluate = step.make_eval_step(net, config.jit)
      accuracy = float(evaluate(dataset.test.images, dataset.test.labels))
      tf.summary.scalar('eval/test_accuracy', accuracy, step=end)

  profile = profiler.summarize()
  for line in profile.lines() if profile else []:
    print(line)
  if config.dump_hlo and config.jit == 'auto':
    clusters = hlo.summarize_clusters(
      os.path.join(role.write_dir, hlo.CLUSTER_DIR)
    )
    for line in clusters.lines() if clusters else ['auto-clustering: none']:
      print(line)
  result = outputs.Result(
    dataset=config.dataset,
    jit=config.jit,
    device=device,
    steps=end if ran else start,  # The steps the model has.
    batch_size=config.batch_size,
    steps_per_loop=compiled.program.steps_per_call,
    final_loss=stats.last_loss if ran else checkpointer.restored_loss,
    test_accuracy=accuracy,
    **_speed(stats if ran else None),
    traces=compiled.fn.experimental_get_tracing_count(),
    hlo_fusions=hlo_fusions,
    profile=dataclasses.asdict(profile) if profile else None,
    workdir=role.write_dir if role.keeps_outputs else '',
    schema_version=outputs.SCHEMA_VERSION,
    peak_host_mib=outputs.peak_host_mib(),
    device_peak_mib=_device_peak_mib(device),
    config=config.to_dict(),
    versions=outputs.versions(),
    cpu_model=outputs.cpu_model(),
  )
  if role.keeps_outputs:
    with writer.as_default(step=end):
      _outcome_summaries(result, config)
  writer.close()
  return Trained(result, net)


def _speed(stats: loop.LoopStats | None) -> dict[str, float | None]:
  """The loop's time figures; None for what it did not measure: all of them
  when it ran no step, the rate when every step was in the compiling call."""
  timed = stats is not None and stats.timed_steps > 0
  return {
    'compile_seconds': stats.compile_seconds if stats else None,
    'train_seconds': stats.train_seconds if timed else None,
    'other_seconds': stats.paused_seconds if stats else None,
    'steps_per_second': (
      stats.timed_steps / max(stats.train_seconds, 1e-9) if timed else None
    ),
  }


def _hparams(
  result: outputs.Result, config: ml_collections.ConfigDict
) -> dict[str, str | int | float]:
  """What sets one run apart from another, as the HParams tab lists it."""
  return {
    'jit': result.jit,
    'steps_per_call': result.steps_per_loop,
    'device': result.device,
    'strategy': config.strategy,
    'batch_size': result.batch_size,
    'learning_rate': config.learning_rate,
    'seed': config.seed,
    'num_steps': result.steps,
    'dataset': result.dataset,
  }


def _outcome_summaries(
  result: outputs.Result, config: ml_collections.ConfigDict
) -> None:
  """The run's outcome in TensorBoard: HParams, perf and memory scalars, and
  the report in the Text tab, so that runs compare there, not only in files.

  No experiment summary (`hparams_config`): TensorBoard then builds it from
  all the runs, lists first the hyperparameters whose values differ, and
  takes every scalar tag as a metric (its last value).
  """
  hp.hparams(_hparams(result, config))
  for tag, value in (
    ('perf/compile_seconds', result.compile_seconds),
    ('perf/run_steps_per_second', result.steps_per_second),
  ):
    if value is not None:  # Not measured: no point rather than a false one.
      tf.summary.scalar(tag, value)
  tf.summary.scalar('memory/peak_host_mib', result.peak_host_mib)
  if result.device_peak_mib is not None:
    tf.summary.scalar('memory/device_peak_mib', result.device_peak_mib)
  tf.summary.text('report', report.render(result, config))


def _device_peak_mib(device: str) -> float | None:
  """The device allocator's peak, where TF tracks one (GPU, TPU)."""
  if not device.startswith(('GPU', 'TPU')):
    return None  # CPU:0, or a strategy's replicas: no one allocator.
  try:
    info = tf.config.experimental.get_memory_info(device)
  except (ValueError, tf.errors.OpError):
    return None
  return info['peak'] / 2**20


def _scalars(step_number: int, values: dict[str, float]) -> None:
  for tag, value in values.items():
    tf.summary.scalar(tag, value, step=step_number)


def _dump_hlo(
  compiled: program.Compiled, config: ml_collections.ConfigDict, workdir: str
) -> int | None:
  """`dump_hlo` with jit 'on': the HLO files and the fusion count."""
  if not (config.dump_hlo and config.jit == 'on'):
    return None
  dump = hlo.dump(
    compiled.fn, compiled.specs, os.path.join(workdir, hlo.HLO_DIR)
  )
  for line in dump.lines():
    print(line)
  return dump.fusions
