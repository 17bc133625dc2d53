"""Trains the TF1 `mnist_softmax_xla.py` recipe in TF2 with XLA:
`python -m xla_mnist.train --config=fashion_mnist --jit=on`. Three library
calls: `parse` reads the flags onto a config (`--config.x=...` overrides a
field), `process.prepare` sets what TF reads as it starts,
`trainer.train_and_evaluate` trains."""

from __future__ import annotations

# First: catches stop signals before the imports below (see `cli`).
from xla_mnist.runtime import cli  # isort: skip

cli.catch_stop_signals()

import dataclasses
import os

import ml_collections
from absl import flags, logging

# No TensorFlow yet: `main` imports it once flags and config pass their
# checks, so that a usage error comes at once, not after TF's import.
from xla_mnist import parse
from xla_mnist.runtime import console, env, process, xla_cache
from xla_mnist.runtime.errors import Interrupted
from xla_mnist.workdir import files


@dataclasses.dataclass(frozen=True)
class Command:
  """What the flags ask for, checked, with the process prepared for it."""

  config: ml_collections.ConfigDict
  workdir: str
  data_dir: str
  fresh: bool
  profiler_port: int
  cache: xla_cache.Cache


def parse_flags(argv: list[str]) -> Command:
  """Defines train's flags and reads `argv` onto them (see `cli`): a bad
  flag, config or place is one line and exit code 2, before TF starts."""
  env.quiet_by_default()
  name = parse.config_name(parse.resolve_argv(argv)[1])
  argv = parse.define(flags.FLAGS, argv)
  workdir = flags.DEFINE_string(
    'workdir', None, 'Output folder (TensorBoard logs, result.json).'
    ' Default: ./logs/<config name>-<jit>.',
  )  # fmt: skip
  data_dir = flags.DEFINE_string(
    'data_dir', './data', 'TFDS data dir, where the dataset is prepared once.'
  )
  fresh = flags.DEFINE_bool(
    'fresh', False, 'Start over instead of resuming from the workdir\'s latest'
    ' checkpoint.',
  )  # fmt: skip
  cache_dir = flags.DEFINE_string(
    'xla_cache_dir', process.default_cache_dir(), "Keeps XLA's compiled"
    ' programs here, so that a later run of the same program loads them;'
    ' empty: compile every time (docs/resume.md).',
  )  # fmt: skip
  port = flags.DEFINE_integer(
    'profiler_port', 0, "Serves TF's profiler here while training, for"
    " TensorBoard's Capture profile; on every interface, without"
    ' authentication (docs/profiling.md); 0: none.',
    lower_bound=0, upper_bound=65535,
  )  # fmt: skip
  if extra := parse.parsed(flags.FLAGS, argv)[1:]:
    cli.fail(f'unexpected arguments {" ".join(extra)}: flags only', 2)
  config = parse.config_from(flags.FLAGS)
  where = workdir.value or os.path.join('logs', f'{name}-{config.jit}')
  files.check_places(where, data_dir.value, config.idx_dir, config.image_dir)
  return Command(
    config, where, data_dir.value, fresh.value, port.value,
    process.prepare(config, where, cache_dir.value),
  )  # fmt: skip


def main(command: Command) -> None:
  if not flags.FLAGS['verbosity'].present:  # TF and TFDS log chatter.
    logging.set_verbosity(logging.ERROR)
  cache = command.cache
  cached = xla_cache.entries(cache.directory)
  with env.importing_tensorflow():
    from xla_mnist import trainer  # noqa: PLC0415 - imports TF: see the top.

  # Files are written from here on: a signal unwinds (temporary files, the
  # workdir's lock) until the trainer's StopRequest holds it for a save.
  cli.unwind_on_signals()
  try:
    trained = trainer.train_and_evaluate(
      command.config, command.workdir, command.data_dir,
      fresh=command.fresh, profiler_port=command.profiler_port,
    )  # fmt: skip
  except Interrupted as e:  # Before training began, or a second signal.
    raise Interrupted(
      e.signum,
      'stopped before a checkpoint was saved: run the same command to resume'
      ' from the last one, if any',
    ) from None
  lines, result = [trained.result.summary()], trained.result
  if trained.was_finished:
    from xla_mnist.workdir import recorded  # noqa: PLC0415 - found done.

    steps = command.config.num_steps
    lines.append(recorded.finished_line(result, command.workdir, steps))
  elif cache.directory and cache.writable:
    n = len(xla_cache.entries(cache.directory) - cached)
    stored = f'{n} compiled now, stored' if n else 'all loaded from it'
    lines.insert(0, f'XLA cache {cache.directory}: {stored}')
  console.say(*lines)


def run() -> None:
  """The `xla-mnist-train` console script."""
  cli.run(main, parse_flags)


if __name__ == '__main__':
  run()
