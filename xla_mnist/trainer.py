"""From a config to a trained model and its `Result`: build, fit, conclude.

One path for every strategy, the process's role decided once by
`distribute.role`; a notebook calls `train_and_evaluate` as the CLI does.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

import ml_collections

from xla_mnist.runtime import env

with env.library_importing_tensorflow():  # Quietly, as a command does.
  import tensorflow as tf
import keras

from xla_mnist import config as config_lib
from xla_mnist import data, loop, program, step
from xla_mnist import model as model_lib
from xla_mnist.inspection import profiling
from xla_mnist.runtime import (
  console,
  devices,
  distribute,
  errors,
  process,
  signals,
)
from xla_mnist.workdir import checkpointing, files, outputs, report, reporting

if TYPE_CHECKING:
  from xla_mnist.inspection.hlo import HloReport


@dataclasses.dataclass(frozen=True)
class Trained:
  result: outputs.Result
  model: keras.Model
  was_finished: bool = False  # Found finished: `result` is the stored one.


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  data_dir: str,
  *,
  model: model_lib.Factory | None = None,
  fresh: bool = False,
  profiler_port: int = 0,
  quiet: bool = False,
) -> Trained:
  """Trains `config`'s recipe, evaluates on the test split, writes outputs.

  `workdir` holds the run's checkpoints and outputs, `data_dir` the data
  TFDS prepares once. Resumes from the workdir's newest checkpoint unless
  `fresh`; a run found finished is returned as it is. `model`, a factory
  function `f(input_shape, num_classes)` returning a Keras model (one
  defined in a notebook, say), trains in place of `config.model`, which
  then records its name (`module:function`). A `profiler_port` starts TF's
  profiler server there, for captures while the run trains. `quiet` prints
  only warnings (the outputs are written all the same).

  Raises:
    errors.Stopped: after saving, when a signal asked to stop (at the
      loop's next call boundary; after the last, the run just finishes).
    errors.UserError: naming the argument or config field to change.
  """
  if model is not None:
    from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

    config = ml_collections.ConfigDict(config.to_dict())
    config.model = factory.name_of(model)
  with console.lines(quiet):
    config_lib.check(config)
    process.apply(config, workdir)
    if profiler_port:
      from xla_mnist.inspection import profiler_server  # noqa: PLC0415

      profiler_server.start(profiler_port)
    strategy = distribute.make_strategy(config.strategy, config.num_cpu_devices)
    if model is None and config.model not in config_lib.PACKAGED_MODELS:
      from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

      factory.imported(config.model, model_lib.FIX)  # Before the data load.
    dataset = data.of_config(config, data_dir)
    note = None
    if config.model != 'softmax':  # Tried before anything is written.
      from xla_mnist.inspection import model_notes  # noqa: PLC0415

      note = model_notes.check(config, model, **dataset.facts)

    def attempt() -> Trained:
      outputs.prepare_workdir(workdir)
      outputs.check_not_compared(workdir)
      with (
        distribute.role(strategy, workdir) as role,
        files.workdir_lock(role.write_dir),
        distribute.lost_workers_as_errors(strategy),
        # A signal waits for the loop's next call boundary (see StopRequest).
        signals.StopRequest(alone=not distribute.has_workers(strategy)) as stop,
        reporting.Reporter(role.outputs_dir) as reporter,
      ):
        reporter.line(*([note] if note else []))
        run = _Run(
          config, model or config.model, role, strategy, stop, reporter,
          fresh, profiler_port,
        )  # fmt: skip
        try:
          return run.phases(dataset)
        except tf.errors.ResourceExhaustedError as e:
          raise errors.UserError(
            f'the run needs more memory than this machine has'
            f' ({errors.first_line(e)}): lower {errors.field("batch_size")}'
            f' or {errors.field("steps_per_loop")}, or train a smaller model'
          ) from None

    return process.retry_on_cache_fault(
      attempt,
      finished=lambda: checkpointing.newest_step(workdir) == config.num_steps,
      workers=config.strategy == 'multi_worker',
    )


@dataclasses.dataclass(frozen=True)
class _Built:
  """What `_Run.build` makes of the recipe, whole before the loop starts."""

  device: str
  placement: contextlib.AbstractContextManager
  dataset: data.Data
  net: keras.Model
  optimizer: keras.optimizers.Optimizer
  checkpointer: checkpointing.Checkpointer
  start: int  # The step the run resumes at.
  probabilities: bool  # The model gives probabilities, not logits.
  compiled: program.Compiled
  hlo_report: HloReport | None
  profiler: profiling.Profiler


@dataclasses.dataclass(frozen=True)
class _Run:
  """One run's phases, over the recipe and where it runs."""

  config: ml_collections.ConfigDict
  model: str | model_lib.Factory  # config.model, or the factory itself.
  role: distribute.Role
  strategy: tf.distribute.Strategy
  stop: signals.StopRequest
  reporter: reporting.Reporter
  fresh: bool
  profiler_port: int

  def phases(self, dataset: data.Data) -> Trained:
    """Build, fit, conclude; or the stored result of a finished run."""
    built = self.build(dataset)
    start, end = built.start, self.config.num_steps
    if start >= end:
      from xla_mnist.workdir import recorded  # noqa: PLC0415 - found done.

      if previous := recorded.finished(self.role.restore_dir, start, end):
        # The model as the run ended it (`conclude`): under `use_ema`, averaged.
        built.optimizer.finalize_variable_values(built.net.trainable_variables)
        return Trained(previous, built.net, was_finished=True)
    stats = self.fit(built)
    if stats.stopped_by:
      raise signals.stopped(
        stats.stopped_by, stats.last_step, self.stop.signum,
        built.checkpointer.restore_directory,
      )  # fmt: skip
    return Trained(self.conclude(built, stats), built.net)

  def build(self, dataset: data.Data) -> _Built:
    """Placement, model, the restored step, the program, its profiler."""
    config, role, reporter = self.config, self.role, self.reporter
    device, placement = distribute.placement(self.strategy, config)
    prepared = 'prepared ' if dataset.prepared_now else 'using '
    reporter.line(prepared + dataset.source, dataset.input_line)
    with placement, self.strategy.scope():
      net = model_lib.create_model(
        self.model, config.seed, **dataset.facts, precision=config.precision
      )
      optimizer = step.make_optimizer(net, config)
    probabilities, note = model_lib.outputs(
      net, self.model, dataset.image_shape
    )
    reporter.line(*filter(None, [note]))
    # Outside the strategy's scope: its string fingerprint cannot be mirrored.
    checkpointer = checkpointing.Checkpointer(
      role.write_dir, role.restore_dir, net, optimizer, config, device,
      checkpointing.data_facts(dataset.source_digest, **dataset.facts),
    )  # fmt: skip
    with placement:
      start = checkpointer.restore(self.fresh)
      distribute.check_same_start(self.strategy, start)
      if 0 < start < config.num_steps:
        where = checkpointer.restore_directory
        reporter.line(f'resuming at step {start} from {where}')
      compiled = program.make(
        net, optimizer, dataset.train, config, start, self.strategy,
        probabilities,
      )  # fmt: skip
      reporter.graph(compiled.graph)  # For TensorBoard's Graphs tab.
      hlo_report = None
      if config.dump_hlo:  # The HLO report's module loads only when asked.
        from xla_mnist.inspection import hlo  # noqa: PLC0415

        hlo_report = hlo.dump_if_asked(
          config, compiled.fn, compiled.specs, role.write_dir
        )
    reporter.line(*(hlo_report.lines() if hlo_report else []))
    if config.model != 'softmax':  # The seed's model has no convolution.
      from xla_mnist.inspection import model_notes  # noqa: PLC0415

      reporter.line(*model_notes.loop_note(compiled, config.jit, device))
    profiler = profiling.Profiler.last_steps(
      role.outputs_dir, config.profile_steps, start, config.num_steps,
      markers=bool(self.profiler_port),
    )  # fmt: skip
    return _Built(
      device, placement, dataset, net, optimizer, checkpointer, start,
      probabilities, compiled, hlo_report, profiler,
    )  # fmt: skip

  def fit(self, built: _Built) -> loop.LoopStats:
    """The loop over the program, with its actions and the profiler."""
    config = self.config
    # The rate each step takes: the config's, a schedule's, compile()'s.
    rate = lambda _: config.learning_rate  # noqa: E731
    if config.schedule != 'constant' or getattr(built.net, 'optimizer', 0):
      from xla_mnist import optimizers  # noqa: PLC0415 - such a run's only.

      rate = optimizers.rates_of(built.optimizer)

    def progress(step: int, end: int, loss: float, speed: float) -> None:
      self.reporter.progress(step, end, loss, speed)
      self.reporter.scalars(step, {'train/learning_rate': rate(step)})

    actions = (
      loop.log_progress(config.log_every, progress),
      # The save needs the losses: the loop checks them first, so that no
      # checkpoint holds a diverged state.
      loop.Action(
        lambda b: built.checkpointer.save_with_events(
          b.last, float(b.losses[-1]), self.reporter
        ),
        config.checkpoint_every,
        losses=True,
      ),
    )
    with built.placement:
      return loop.Loop(
        built.compiled.program,
        actions,
        learning_rate=config.learning_rate,
        wrappers=(built.profiler.around,),
        begin=self.stop.begin,
        signal=lambda: self.stop.signum,
        agree=distribute.worker_max(self.strategy),  # Workers stop together.
      ).run(built.start, config.num_steps)

  def conclude(self, built: _Built, stats: loop.LoopStats) -> outputs.Result:
    """Evaluation, the profile's summary, the result and its outputs."""
    config, role, compiled = self.config, self.role, built.compiled
    with built.placement:
      # As `fit` ends: the moving average in place of the weights, under
      # `use_ema` (else nothing), after the last save holds the raw ones.
      built.optimizer.finalize_variable_values(built.net.trainable_variables)
      accuracy = step.evaluate(built.net, config.jit, built.dataset.test)
      model_losses = step.model_losses(built.net, built.dataset.test)
    self.reporter.scalars(config.num_steps, {'eval/test_accuracy': accuracy})
    profile = built.profiler.summarize(compiled.graph)
    self.reporter.line(*(profile.lines() if profile else []))
    if config.dump_hlo:
      from xla_mnist.inspection import hlo  # noqa: PLC0415 - when asked.

      self.reporter.line(*hlo.clusters_if_asked(config, role.write_dir))
    ran = built.start < config.num_steps  # Else: the restored model, untimed.
    result = outputs.Result(
      **outputs.recipe(config),
      device=built.device,
      steps=config.num_steps if ran else built.start,  # The model's steps.
      steps_per_loop=compiled.program.steps_per_loop,
      final_loss=stats.last_loss if ran else built.checkpointer.restored_loss,
      test_accuracy=accuracy,
      **stats.timing(measured=ran),
      traces=compiled.fn.experimental_get_tracing_count(),
      hlo_fusions=built.hlo_report.fusions if built.hlo_report else None,
      profile=dataclasses.asdict(profile) if profile else None,
      workdir=role.outputs_dir,
      device_peak_mib=devices.peak_mib(built.device),
      data_source=built.dataset.source_digest,
      image_shape=list(built.dataset.image_shape),
      class_names=list(built.dataset.class_names),
      recipe=checkpointing.recipe(config, built.net),
      precision=built.net.dtype_policy.name,
      outputs='probabilities' if built.probabilities else 'logits',
      model_losses=model_losses,
      **outputs.machine(),
    )
    if role.keeps_outputs:
      report.publish(result, config, self.reporter)
    return result
