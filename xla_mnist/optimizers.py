"""The optimizer a config names, as Keras builds it (docs/training.md):
`check` refuses a bad name, value or combination in one line before TF's
import, which waits for `make`. A field of `config.optimizer_args` left None
takes Keras's default: only what the user set reaches Keras and `recipe`.
Loaded for a config beyond plain SGD at a constant rate only
(`config.plain_sgd`), or a model compiled with its own (`of_model`,
`recipe_of`): the TF1 program's recipe needs none of it."""

from __future__ import annotations

import difflib
import inspect
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import ml_collections

from xla_mnist import config as config_lib
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError

if TYPE_CHECKING:
  import keras

# config.optimizer: Keras's class and its own arguments; all take COMMON.
OPTIMIZERS = {
  'sgd': ('SGD', ('momentum', 'nesterov')),
  'adam': ('Adam', ('beta_1', 'beta_2', 'epsilon', 'amsgrad')),
  'adamw': ('AdamW', ('beta_1', 'beta_2', 'epsilon', 'amsgrad')),
  'rmsprop': ('RMSprop', ('rho', 'momentum', 'epsilon', 'centered')),
  'adagrad': ('Adagrad', ('initial_accumulator_value', 'epsilon')),
  'adamax': ('Adamax', ('beta_1', 'beta_2', 'epsilon')),
  'nadam': ('Nadam', ('beta_1', 'beta_2', 'epsilon')),
  'lion': ('Lion', ('beta_1', 'beta_2')),
}
CLIPS = ('clipnorm', 'clipvalue', 'global_clipnorm')  # Keras takes one.
COMMON = ('weight_decay', 'use_ema', 'ema_momentum', *CLIPS)
_UNIT = (lambda v: _number(v) and 0 <= v < 1, 'a number in [0, 1)')
_ABOVE_0 = (lambda v: _number(v) and v > 0, 'a number above 0')
_FROM_0 = (lambda v: _number(v) and v >= 0, 'a number from 0 up')
_BOOL = (lambda v: type(v) is bool, 'True or False')
_STEPS = (lambda v: type(v) is int and 0 <= v < 2**63, 'a whole number from 0')
# Each field's test, and its values as a message asks for them.
ARGS = dict(
  momentum=_UNIT, nesterov=_BOOL, beta_1=_UNIT, beta_2=_UNIT,
  epsilon=_ABOVE_0, amsgrad=_BOOL, rho=_UNIT, centered=_BOOL,
  initial_accumulator_value=_FROM_0, weight_decay=_FROM_0, clipnorm=_ABOVE_0,
  clipvalue=_ABOVE_0, global_clipnorm=_ABOVE_0, use_ema=_BOOL,
  ema_momentum=_UNIT,
)  # fmt: skip
SCHEDULES = ('constant', 'cosine_decay')  # cosine_decay: Keras's CosineDecay.
SCHEDULE_ARGS = dict(
  warmup_steps=_STEPS,
  decay_steps=_STEPS,  # 0 or unset: the run's steps after the warm-up.
  alpha=(lambda v: _number(v) and 0 <= v <= 1, 'a number in [0, 1]'),
)


def check(config: ml_collections.ConfigDict) -> None:
  """Raises UsageError naming the first bad field and what it accepts (the
  learning rate is `config.check`'s, which calls this)."""
  name, field = config.optimizer, errors.field
  for key, allowed in (('optimizer', OPTIMIZERS), ('schedule', SCHEDULES)):
    if config[key] not in allowed:
      raise UsageError(
        f'{key} {config[key]!r} is not one of {", ".join(allowed)}: set'
        f' {field(key)} to one of them'
      )
  args = _given(config, 'optimizer_args', ARGS)
  arg = {a: field(f'optimizer_args.{a}') for a in ARGS}
  for a in (a for a in args if a not in (*OPTIMIZERS[name][1], *COMMON)):
    takers = ', '.join(n for n, (_, own) in OPTIMIZERS.items() if a in own)
    raise UsageError(
      f'{name} takes no {a}: drop {arg[a]}, or set {field("optimizer")} to'
      f' one that does ({takers})'
    )
  if len(clips := [arg[c] for c in CLIPS if c in args]) > 1:
    raise UsageError(f'Keras clips one way: set only one of {", ".join(clips)}')
  for a, needs, fix in (
    ('ema_momentum', 'use_ema', field('optimizer_args.use_ema', True)),
    ('nesterov', 'momentum', f'{arg["momentum"]} above 0'),
  ):
    if a in args and args[a] is not False and not args.get(needs):
      raise UsageError(
        f'optimizer_args.{a} does nothing without {needs}: set {fix}, or drop'
        f' {arg[a]}'
      )
  if name == 'lion' and args.get('beta_1') == 0:
    raise UsageError(f'lion takes beta_1 above 0 only: set {arg["beta_1"]} so')
  given = _given(config, 'schedule_args', SCHEDULE_ARGS)
  shaping = [f'schedule_args.{a}' for a in given if given[a]]
  if config.schedule == 'constant' and shaping:
    raise UsageError(
      f'{shaping[0]} shapes a decay, and the schedule is constant: set'
      f' {field("schedule", "cosine_decay")}, or drop {field(shaping[0])}'
    )
  warmup, steps = given.get('warmup_steps', 0), config.num_steps
  if type(steps) is int and warmup >= steps:
    raise UsageError(
      f'schedule_args.warmup_steps is {warmup}, of a run of {steps} steps:'
      f' set {field("schedule_args.warmup_steps")} below {steps}'
    )


def _given(config: ml_collections.ConfigDict, group: str, tests: dict) -> dict:
  """`config.<group>`'s fields that are set, each passing its test (a name
  not in `tests`: a typo made from Python; ml_collections' flags refuse it)."""
  for a, value in config[group].items():
    if a not in tests:
      near = difflib.get_close_matches(a, list(tests), 1)
      fix = f'rename it {near[0]}' if near else 'drop it'
      raise UsageError(f'config.{group} has no field {a}: {fix}')
    if value is not None and not tests[a][0](value):
      where = errors.field(f'{group}.{a}')
      raise UsageError(
        f'{group}.{a} is {value!r}: set {where} to {tests[a][1]}'
      )
  return {a: v for a, v in config[group].items() if v is not None}


def _number(value: object) -> bool:
  return type(value) in (int, float) and math.isfinite(value)


def _args(config: ml_collections.ConfigDict) -> dict[str, float | bool]:
  """The arguments set, numbers as floats (Keras refuses an int momentum)."""
  return {
    a: v if ARGS[a] is _BOOL else float(v)
    for a, v in config.optimizer_args.items()
    if v is not None
  }


def _schedule(config: ml_collections.ConfigDict) -> dict[str, int | float]:
  """CosineDecay's arguments, less the rates: the decay fills the run after
  the warm-up by default; `alpha` only if set."""
  args = config.schedule_args
  found = dict(warmup_steps=args.warmup_steps or 0)
  found['decay_steps'] = (
    args.decay_steps or config.num_steps - found['warmup_steps']
  )
  return found | ({} if args.alpha is None else {'alpha': float(args.alpha)})


def learning_rate(
  config: ml_collections.ConfigDict,
) -> float | keras.optimizers.schedules.LearningRateSchedule:
  """`config.learning_rate`, or the cosine that peaks there after a linear
  warm-up from 0 (as optax's `warmup_cosine_decay_schedule`) and ends at
  alpha times it (Keras's default alpha: 0)."""
  peak = float(config.learning_rate)
  if config.schedule == 'constant':
    return peak
  import keras  # noqa: PLC0415 - TF's import, after `check`.

  args = _schedule(config)
  warm = {'warmup_target': peak} if args['warmup_steps'] else {}
  start = 0.0 if warm else peak
  return keras.optimizers.schedules.CosineDecay(start, **args, **warm)


def make(config: ml_collections.ConfigDict) -> keras.optimizers.Optimizer:
  """The optimizer of a `check`ed config, unbuilt: `step.make_optimizer`
  builds it on a model's weights, loss-scaled as `fit` does."""
  import keras  # noqa: PLC0415 - TF's import, after `check`.

  return getattr(keras.optimizers, OPTIMIZERS[config.optimizer][0])(
    learning_rate=learning_rate(config), **_args(config)
  )


def recipe(
  config: ml_collections.ConfigDict,
) -> dict[str, str | int | float | bool]:
  """What makes the optimizer another training, by field path, for the
  checkpoint's fingerprint and the HParams tab: the decay's steps as the
  run resolves them, so that a longer run under the cosine is another."""
  found = {'optimizer': config.optimizer, 'schedule': config.schedule}
  found |= {f'optimizer_args.{a}': v for a, v in _args(config).items()}
  if config.schedule != 'constant':
    found |= {f'schedule_args.{a}': v for a, v in _schedule(config).items()}
  return found


def of_model(
  net: keras.Model, config: ml_collections.ConfigDict
) -> keras.optimizers.Optimizer:
  """The optimizer `net` trains with, unbuilt: the one its factory compiled
  it with, as `fit` trains with it (loss-scaled by compile() under
  `mixed_float16`), else the config's (`make`). A compiled one and a config
  that names another optimizer disagree: one UsageError."""
  own = getattr(net, 'optimizer', None)
  if own is None:
    return make(config)
  if not config_lib.plain_sgd(config):
    from xla_mnist.zoo import factory  # noqa: PLC0415 - a user's model only.

    plain = {'optimizer': 'sgd', 'schedule': 'constant'}
    asked = [k for k, v in plain.items() if config[k] != v] + [
      f'{group}.{a}'
      for group in ('optimizer_args', 'schedule_args')
      for a, v in config[group].items()
      if v is not None
    ]
    raise UsageError(
      f'model {config.model} is compiled with its own optimizer,'
      f' {factory.optimizer_name(own)}, and {errors.field(asked[0])} asks for'
      ' another: drop one, that field or the optimizer of its compile()'
      " (compile(optimizer=None, loss=...) trains with the config's)"
    )
  return own


def recipe_of(
  optimizer: keras.optimizers.Optimizer,
) -> dict[str, str | int | float | bool]:
  """`recipe`'s fields for a built optimizer, a compiled model's, which the
  config does not describe: its class (`optimizer`, lower-case), its rate
  (`learning_rate`; under a schedule, its initial rate), each argument
  unlike its class's default (`optimizer_args.X`), its schedule's class
  (`schedule`: `constant`, `cosine_decay` for CosineDecay) and arguments
  (`schedule_args.X`). Its loss scale is the dtype policy's, recorded apart."""
  inner = getattr(optimizer, 'inner_optimizer', optimizer)
  given = inner.get_config()
  rate = given.pop('learning_rate')
  defaults = inspect.signature(type(inner).__init__).parameters
  found = {'optimizer': type(inner).__name__.lower(), 'schedule': 'constant'}
  for a, v in given.items():
    default = getattr(defaults.get(a), 'default', inspect.Parameter.empty)
    if a != 'name' and v is not None and v != default:
      found[f'optimizer_args.{a}'] = _plain(v)
  if not isinstance(rate, dict):
    return found | {'learning_rate': _plain(rate)}
  shape = rate['config']  # A schedule, serialized.
  found['schedule'] = re.sub(r'(?<!^)(?=[A-Z])', '_', rate['class_name'])
  found['schedule'] = found['schedule'].lower()
  # The peak, as `recipe` records a config's: after a warm-up, its target.
  warm = bool(shape.get('warmup_target'))
  peak = 'warmup_target' if warm else 'initial_learning_rate'
  found['learning_rate'] = _plain(shape.get(peak, 0.0))
  return found | {
    f'schedule_args.{a}': _plain(v)
    for a, v in shape.items()
    if a not in ('name', peak) and v is not None
  }


def _plain(value: object) -> str | int | float | bool:
  """A value as a fingerprint holds it: a float as float32 prints it (a
  rate read back from its variable is 0.0010000000474974513), a list as
  text."""
  if isinstance(value, float):
    return float(f'{value:.7g}')
  return value if isinstance(value, str | int | bool) else str(value)


def rates_of(optimizer: keras.optimizers.Optimizer) -> Callable[[int], float]:
  """`rate(t)`, the learning rate step t (from 1) takes, for the log: the
  built optimizer's (the config's, or a compiled model's) schedule, which
  Keras evaluates at the t - 1 iterations before the step, or its rate."""
  import keras  # noqa: PLC0415 - TF's import, after `check`.

  inner = getattr(optimizer, 'inner_optimizer', optimizer)
  rate = inner.get_config()['learning_rate']
  if not isinstance(rate, dict):
    return lambda _: _plain(rate)
  schedule = keras.optimizers.schedules.deserialize(rate)
  return lambda step: float(schedule(step - 1))
