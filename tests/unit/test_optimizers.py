"""optimizers: the optimizer a config names, refused in one line before TF's
import, built by Keras with Keras's defaults for what the config leaves
unset, and recorded as the recipe a checkpoint and the HParams tab hold."""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys

import ml_collections
import pytest

from xla_mnist import config as config_lib
from xla_mnist import optimizers, parse
from xla_mnist.configs import default
from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def configured(fields: dict, typed: bool = True) -> ml_collections.ConfigDict:
  """The default config with `fields` ('optimizer_args.beta_2': 0.99) set:
  `typed`, through the placeholders' types, as a config file sets them;
  else on a plain copy, as from Python a dict-built config (a wrong type
  reaches `check`)."""
  config = default.get_config()
  if not typed:
    config = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
  for path, value in fields.items():
    *groups, name = path.split('.')
    node = config
    for group in groups:
      node = node[group]
    node[name] = value
  return config


# Each: the fields set, and the field the one line must name.
BAD = [
  ({'learning_rate': -0.1}, 'learning_rate'),
  ({'learning_rate': 0.0}, 'learning_rate'),
  ({'learning_rate': math.nan}, 'learning_rate'),
  ({'learning_rate': math.inf}, 'learning_rate'),
  ({'optimizer': 'adm'}, 'optimizer'),
  ({'optimizer': 'Adam'}, 'optimizer'),
  ({'optimizer': 'ftrl'}, 'optimizer'),  # Keras's, not offered.
  ({'optimizer': 'adabelief'}, 'optimizer'),  # Not Keras's.
  ({'optimizer': ''}, 'optimizer'),
  ({'optimizer': 'adam', 'optimizer_args.momentum': 0.9}, 'args.momentum'),
  ({'optimizer': 'adam', 'optimizer_args.nesterov': True}, 'args.nesterov'),
  ({'optimizer': 'adamw', 'optimizer_args.rho': 0.9}, 'args.rho'),
  ({'optimizer_args.amsgrad': True}, 'optimizer_args.amsgrad'),  # sgd
  ({'optimizer_args.epsilon': 1e-8}, 'optimizer_args.epsilon'),  # sgd
  ({'optimizer_args.beta_1': 0.9}, 'optimizer_args.beta_1'),  # sgd
  ({'optimizer': 'lion', 'optimizer_args.epsilon': 1e-7}, 'args.epsilon'),
  ({'optimizer': 'rmsprop', 'optimizer_args.beta_2': 0.9}, 'args.beta_2'),
  ({'optimizer': 'adam', 'optimizer_args.centered': True}, 'args.centered'),
  (
    {'optimizer': 'nadam', 'optimizer_args.initial_accumulator_value': 0.1},
    'optimizer_args.initial_accumulator_value',
  ),
  ({'optimizer_args.momentum': 1.0}, 'optimizer_args.momentum'),
  ({'optimizer_args.momentum': -0.5}, 'optimizer_args.momentum'),
  ({'optimizer': 'adam', 'optimizer_args.beta_1': 1.0}, 'args.beta_1'),
  ({'optimizer': 'adam', 'optimizer_args.beta_1': -0.1}, 'args.beta_1'),
  ({'optimizer': 'adam', 'optimizer_args.beta_2': 1.5}, 'args.beta_2'),
  ({'optimizer': 'adam', 'optimizer_args.beta_2': math.nan}, 'args.beta_2'),
  ({'optimizer': 'adam', 'optimizer_args.epsilon': 0.0}, 'args.epsilon'),
  ({'optimizer': 'adam', 'optimizer_args.epsilon': -1e-7}, 'args.epsilon'),
  ({'optimizer': 'rmsprop', 'optimizer_args.rho': 1.0}, 'args.rho'),
  (
    {'optimizer': 'adagrad', 'optimizer_args.initial_accumulator_value': -1},
    'optimizer_args.initial_accumulator_value',
  ),
  ({'optimizer_args.weight_decay': -0.01}, 'optimizer_args.weight_decay'),
  ({'optimizer_args.clipnorm': 0.0}, 'optimizer_args.clipnorm'),
  ({'optimizer_args.clipnorm': -1.0}, 'optimizer_args.clipnorm'),
  ({'optimizer_args.clipvalue': 0.0}, 'optimizer_args.clipvalue'),
  ({'optimizer_args.global_clipnorm': -2.0}, 'args.global_clipnorm'),
  (
    {'optimizer_args.clipnorm': 1.0, 'optimizer_args.global_clipnorm': 1.0},
    'optimizer_args.global_clipnorm',
  ),
  (
    {'optimizer_args.clipnorm': 1.0, 'optimizer_args.clipvalue': 1.0},
    'optimizer_args.clipvalue',
  ),
  (
    {'optimizer_args.use_ema': True, 'optimizer_args.ema_momentum': 1.0},
    'optimizer_args.ema_momentum',
  ),
  (
    {'optimizer_args.use_ema': True, 'optimizer_args.ema_momentum': -0.1},
    'optimizer_args.ema_momentum',
  ),
  ({'optimizer_args.ema_momentum': 0.9}, 'optimizer_args.use_ema'),
  (
    {'optimizer_args.use_ema': False, 'optimizer_args.ema_momentum': 0.9},
    'optimizer_args.use_ema',
  ),
  ({'optimizer_args.nesterov': True}, 'optimizer_args.momentum'),
  (
    {'optimizer_args.nesterov': True, 'optimizer_args.momentum': 0.0},
    'optimizer_args.momentum',
  ),
  ({'optimizer': 'lion', 'optimizer_args.beta_1': 0.0}, 'args.beta_1'),
  ({'schedule': 'cosine'}, 'schedule'),
  ({'schedule': 'exponential_decay'}, 'schedule'),
  ({'schedule': 'CosineDecay'}, 'schedule'),
  ({'schedule_args.warmup_steps': 10}, 'schedule'),  # Under 'constant'.
  ({'schedule_args.decay_steps': 10}, 'schedule_args.decay_steps'),
  ({'schedule_args.alpha': 0.1}, 'schedule_args.alpha'),
  (
    {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': 1000},
    'schedule_args.warmup_steps',
  ),  # The run's 1000 steps: no decay left.
  (
    {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': 5000},
    'schedule_args.warmup_steps',
  ),
  (
    {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': -1},
    'schedule_args.warmup_steps',
  ),
  (
    {'schedule': 'cosine_decay', 'schedule_args.decay_steps': -5},
    'schedule_args.decay_steps',
  ),
  (
    {'schedule': 'cosine_decay', 'schedule_args.alpha': 1.5},
    'schedule_args.alpha',
  ),
  (
    {'schedule': 'cosine_decay', 'schedule_args.alpha': -0.1},
    'schedule_args.alpha',
  ),
]
# Wrong types, which only a config built without the placeholders' types
# (a dict's, from Python) can hold.
BAD_UNTYPED = [
  ({'optimizer_args.momentum': '0.9'}, 'optimizer_args.momentum'),
  ({'optimizer_args.momentum': 0.9, 'optimizer_args.nesterov': 1}, 'nesterov'),
  ({'optimizer_args.use_ema': 'yes'}, 'optimizer_args.use_ema'),
  ({'optimizer_args.weight_decay': [0.1]}, 'optimizer_args.weight_decay'),
  (
    {'schedule': 'cosine_decay', 'schedule_args.decay_steps': 1.5},
    'schedule_args.decay_steps',
  ),
  (
    {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': True},
    'schedule_args.warmup_steps',
  ),
  ({'optimizer_args.beta2': 0.9}, 'optimizer_args'),  # A typo from Python.
  ({'schedule_args.warmup': 10}, 'schedule_args'),
]
GOOD = [
  {},
  {'optimizer_args.momentum': 0.9, 'optimizer_args.nesterov': True},
  {'optimizer_args.nesterov': False},  # Keras's default, said.
  {
    'optimizer': 'adam',
    'learning_rate': 1e-3,
    'optimizer_args.beta_1': 0.8,
    'optimizer_args.beta_2': 0.99,
    'optimizer_args.epsilon': 1e-8,
    'optimizer_args.amsgrad': True,
  },
  {'optimizer': 'adamw', 'optimizer_args.weight_decay': 0.01},
  {'optimizer': 'adamw', 'optimizer_args.weight_decay': 0.0},
  {
    'optimizer': 'rmsprop',
    'optimizer_args.rho': 0.95,
    'optimizer_args.momentum': 0.5,
    'optimizer_args.centered': True,
  },
  {'optimizer': 'adagrad', 'optimizer_args.initial_accumulator_value': 0.0},
  {'optimizer': 'adamax', 'optimizer_args.epsilon': 1e-6},
  {'optimizer': 'nadam', 'optimizer_args.beta_2': 0.0},
  {'optimizer': 'lion', 'optimizer_args.beta_1': 0.95},
  {'optimizer_args.clipnorm': 1.0},
  {'optimizer_args.clipvalue': 0.5},
  {'optimizer_args.global_clipnorm': 1},  # An int, made a float.
  {'optimizer_args.use_ema': True},
  {'optimizer_args.use_ema': True, 'optimizer_args.ema_momentum': 0.999},
  {'schedule': 'cosine_decay'},
  {
    'schedule': 'cosine_decay',
    'schedule_args.warmup_steps': 100,
    'schedule_args.alpha': 0.1,
  },
  {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': 999},
  {'schedule': 'cosine_decay', 'schedule_args.decay_steps': 10**6},
  {'schedule': 'cosine_decay', 'schedule_args.alpha': 1.0},
  {'schedule_args.alpha': 0.0},  # Keras's default, said: no decay asked.
]


def refusal(config: ml_collections.ConfigDict) -> str:
  """`config.check`'s line, as a run's: it checks the learning rate, then
  calls `optimizers.check` for anything beyond plain SGD."""
  with pytest.raises(UsageError) as error:
    config_lib.check(config)
  return str(error.value)


@pytest.mark.parametrize('fields, field', BAD, ids=str)
def test_check_refuses_each_bad_value_in_one_line_naming_its_field(
  fields, field
):
  message = refusal(configured(fields))
  assert '\n' not in message
  if field.startswith('args.'):  # Short for optimizer_args., to fit a line.
    field = f'optimizer_{field}'
  assert f'config.{field}' in message, message
  assert 'set ' in message or 'drop ' in message or 'rename ' in message


@pytest.mark.parametrize('fields, field', BAD_UNTYPED, ids=str)
def test_check_refuses_a_wrong_type_from_python(fields, field):
  message = refusal(configured(fields, typed=False))
  assert '\n' not in message
  assert field in message, message


def test_a_command_line_hears_its_flags():
  config = configured({'optimizer': 'adam', 'optimizer_args.momentum': 0.9})
  with errors.speaking_flags():
    message = refusal(config)
  assert message == (
    'adam takes no momentum: drop --config.optimizer_args.momentum, or set'
    ' --config.optimizer to one that does (sgd, rmsprop)'
  )


@pytest.mark.parametrize('fields', GOOD, ids=str)
def test_check_accepts_good_configs(fields):
  config_lib.check(configured(fields))
  config_lib.check(configured(fields, typed=False))


def test_check_imports_no_tensorflow():
  """In a fresh process: the checks of every good and bad config leave TF
  and Keras unloaded (a usage error comes at once), and plain SGD's leave
  this module unloaded too."""
  code = """
import json, sys
from xla_mnist import config
from xla_mnist.configs import default
from xla_mnist.runtime.errors import UsageError
config.check(default.get_config())
loaded = [m for m in ['xla_mnist.optimizers'] if m in sys.modules]
from tests.unit.test_optimizers import BAD, GOOD, configured
for fields in GOOD:
  config.check(configured(fields))
for fields, _ in BAD:
  try:
    config.check(configured(fields))
  except UsageError:
    pass
  else:
    raise SystemExit(f'accepted {fields}')
from xla_mnist import optimizers
optimizers.recipe(configured(GOOD[-4]))
mods = ('tensorflow', 'keras')
print(json.dumps(loaded + [m for m in mods if m in sys.modules]))
"""
  proc = subprocess.run(
    [sys.executable, '-c', code],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout) == []


def test_the_command_line_sets_every_field():
  config = parse.config_of(
    ['--config=mlp', '--config.optimizer=adamw',
     '--config.optimizer_args.beta_2=0.99', '--config.optimizer_args.amsgrad',
     '--config.optimizer_args.weight_decay=0', '--config.optimizer_args.'
     'use_ema=True', '--config.optimizer_args.global_clipnorm=1',
     '--config.schedule=cosine_decay', '--config.schedule_args.warmup_steps=50',
     '--config.schedule_args.decay_steps=400', '--config.schedule_args.alpha=0']
  )  # fmt: skip
  assert config.optimizer == 'adamw'
  assert config.optimizer_args.to_dict() | {} == {
    **dict.fromkeys(optimizers.ARGS),
    'beta_2': 0.99,
    'amsgrad': True,
    'weight_decay': 0.0,
    'use_ema': True,
    'global_clipnorm': 1.0,  # Typed: a float from '1'.
  }
  assert config.schedule_args.to_dict() == {
    'warmup_steps': 50,
    'decay_steps': 400,
    'alpha': 0.0,
  }
  optimizers.check(config)
  with pytest.raises(UsageError, match='could not convert'):
    parse.config_of(['--config.optimizer_args.beta_2=high'])


def test_the_config_has_exactly_the_fields_checked():
  config = default.get_config()
  assert set(config.optimizer_args) == set(optimizers.ARGS)
  assert set(config.schedule_args) == set(optimizers.SCHEDULE_ARGS)
  assert all(v is None for v in config.optimizer_args.values())


def test_each_optimizer_takes_what_its_keras_class_takes():
  """The table is Keras's: an argument refused is one Keras's class lacks,
  and one allowed is one it has."""
  import keras

  for name, (class_name, own) in optimizers.OPTIMIZERS.items():
    taken = set(
      inspect.signature(getattr(keras.optimizers, class_name)).parameters
    )
    assert set(optimizers.ARGS) & taken == {*own, *optimizers.COMMON}, name
    assert keras.optimizers.get(name).__class__.__name__ == class_name


def keras_config(optimizer) -> dict:
  """Its config, less the name Keras numbers per process (`adam_2`)."""
  return {k: v for k, v in optimizer.get_config().items() if k != 'name'}


@pytest.mark.parametrize(
  'fields', [f for f in GOOD if 'schedule' not in f], ids=str
)
def test_make_is_keras_with_the_arguments_set_and_its_defaults(fields):
  import keras

  config = configured(fields)
  made = optimizers.make(config)
  class_name = optimizers.OPTIMIZERS[config.optimizer][0]
  set_args = {
    path.split('.')[1]: value
    for path, value in fields.items()
    if path.startswith('optimizer_args.')
  }
  direct = getattr(keras.optimizers, class_name)(
    learning_rate=config.learning_rate,
    **{k: float(v) if type(v) is int else v for k, v in set_args.items()},
  )
  assert type(made) is type(direct)
  assert keras_config(made) == keras_config(direct)


def test_unset_arguments_take_keras_defaults():
  made = optimizers.make(configured({'optimizer': 'adamw'})).get_config()
  assert (made['weight_decay'], made['beta_2'], made['epsilon']) == (
    0.004,
    0.999,
    1e-7,
  )
  sgd = optimizers.make(default.get_config()).get_config()
  assert (sgd['momentum'], sgd['nesterov'], sgd['use_ema']) == (
    0.0,
    False,
    False,
  )


def rate_at(optimizer, step: int) -> float:
  optimizer.iterations.assign(step)
  return float(optimizer.learning_rate)


def test_cosine_decay_warms_up_then_decays_over_the_run():
  config = configured(
    {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': 100,
     'schedule_args.alpha': 0.1}
  )  # fmt: skip
  optimizer = optimizers.make(config)
  assert rate_at(optimizer, 0) == 0.0
  assert rate_at(optimizer, 50) == pytest.approx(0.25)
  assert rate_at(optimizer, 100) == pytest.approx(0.5)  # learning_rate.
  assert rate_at(optimizer, 550) == pytest.approx(0.5 * (0.1 + 0.9 * 0.5))
  assert rate_at(optimizer, 1000) == pytest.approx(0.05)  # The run's end.
  assert rate_at(optimizer, 5000) == pytest.approx(0.05)
  schedule = optimizers.learning_rate(config).get_config()
  assert schedule | {'name': None} == {
    'initial_learning_rate': 0.0,
    'decay_steps': 900,
    'alpha': 0.1,
    'name': None,
    'warmup_target': 0.5,
    'warmup_steps': 100,
  }


def test_cosine_decay_without_warmup_starts_at_the_rate():
  config = configured(
    {'schedule': 'cosine_decay', 'schedule_args.decay_steps': 200}
  )
  optimizer = optimizers.make(config)
  assert rate_at(optimizer, 0) == pytest.approx(0.5)
  assert rate_at(optimizer, 100) == pytest.approx(0.25)
  assert rate_at(optimizer, 200) == pytest.approx(0.0, abs=1e-7)  # alpha 0.
  assert rate_at(optimizer, 1000) == pytest.approx(0.0, abs=1e-7)
  assert optimizers.learning_rate(default.get_config()) == 0.5  # Constant.


def test_weight_decay_and_the_moving_average_reach_keras():
  import keras

  config = configured(
    {'learning_rate': 0.1, 'optimizer_args.weight_decay': 0.5,
     'optimizer_args.use_ema': True, 'optimizer_args.ema_momentum': 0.5}
  )  # fmt: skip
  weight = keras.Variable([1.0])
  optimizer = optimizers.make(config)
  optimizer.build([weight])
  optimizer.apply_gradients([(keras.ops.zeros([1]), weight)])
  assert float(weight[0]) == pytest.approx(1 - 0.1 * 0.5)  # Decay alone.
  optimizer.apply_gradients([(keras.ops.zeros([1]), weight)])
  assert float(weight[0]) == pytest.approx(0.95**2)
  optimizer.finalize_variable_values([weight])  # As fit ends: the average.
  assert float(weight[0]) == pytest.approx(0.5 * 0.95 + 0.5 * 0.95**2)


@pytest.mark.parametrize('policy', ['float32', 'mixed_float16'])
def test_the_step_builds_it_on_a_model_loss_scaled_under_mixed_float16(
  policy,
):
  import keras

  from xla_mnist import step

  layer = keras.layers.Dense(2, dtype=policy)
  layer.build((None, 3))
  optimizer = step.make_optimizer(layer, configured({'optimizer': 'adam'}))
  assert optimizer.built
  scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
  assert scaled == (policy == 'mixed_float16')
  inner = optimizer.inner_optimizer if scaled else optimizer
  assert type(inner) is keras.optimizers.Adam
  assert float(optimizer.learning_rate) == 0.5  # Through the wrapper too.


def test_plain_sgd_is_what_make_builds_and_records_without_this_module():
  """A default run leaves this module unloaded (`config.plain_sgd`): the
  step's plain SGD and the fingerprint's fields are `make`'s and `recipe`'s
  for it; any field set makes the config another's."""
  import keras

  from xla_mnist import step
  from xla_mnist.workdir import checkpointing

  plain = configured({'learning_rate': 0.1})
  assert config_lib.plain_sgd(plain)
  layer = keras.layers.Dense(2)
  layer.build((None, 3))
  built = step.make_optimizer(layer, plain)
  assert type(built) is keras.optimizers.SGD
  assert keras_config(built) == keras_config(optimizers.make(plain))
  recorded = checkpointing.recipe(plain)
  assert recorded.items() >= optimizers.recipe(plain).items()
  for fields in GOOD[1:]:
    config = configured(fields)
    assert not config_lib.plain_sgd(config), fields
    assert checkpointing.recipe(config).items() >= (
      optimizers.recipe(config).items()
    )


def test_rates_are_the_rate_each_step_takes():
  config = configured(
    {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': 100}
  )
  optimizer = optimizers.make(config)
  rate = optimizers.rates_of(optimizer)
  for step in (1, 2, 50, 101, 600, 1000):
    assert rate(step) == rate_at(optimizer, step - 1)
  assert rate(1) == 0.0 and rate(101) == 0.5
  assert optimizers.rates_of(optimizers.make(default.get_config()))(7) == 0.5


def test_recipe_is_flat_and_tells_trainings_apart():
  base = optimizers.recipe(default.get_config())
  assert base == {'optimizer': 'sgd', 'schedule': 'constant'}
  assert optimizers.recipe(default.get_config()) == base
  cosine = {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': 100}
  recipes = [
    optimizers.recipe(configured(fields))
    for fields in (
      {},
      {'optimizer': 'adam'},
      {'optimizer': 'adam', 'optimizer_args.beta_2': 0.99},
      {'optimizer_args.momentum': 0.9},
      {'optimizer_args.momentum': 0.9, 'optimizer_args.nesterov': True},
      {'schedule': 'cosine_decay'},
      cosine,
      {**cosine, 'schedule_args.alpha': 0.1},
      {**cosine, 'num_steps': 2000},  # The decay spans the run.
    )
  ]
  assert all(a != b for i, a in enumerate(recipes) for b in recipes[i + 1 :])
  assert recipes[-1]['schedule_args.decay_steps'] == 1900
  for recipe in recipes:
    assert all(type(v) in (str, int, float, bool) for v in recipe.values())
  again = optimizers.recipe(
    configured({**cosine, 'schedule_args.alpha': 0.1}, typed=False)
  )
  assert again == recipes[-2]
  assert optimizers.recipe(configured({'optimizer_args.clipnorm': 1})) == (
    optimizers.recipe(configured({'optimizer_args.clipnorm': 1.0}))
  )
