"""A model its factory compiled (issue 51): its optimizer is the run's, a
config that names another is one line, and what the checkpoint's
fingerprint records of it (`optimizers.recipe_of`) tells trainings apart
as the config's recipe does. The weights it trains to are `fit`'s:
test_keras_fit.py."""

from __future__ import annotations

import keras
import pytest
from support import keras_panel, mnist

from unit.test_optimizers import configured
from xla_mnist import model, optimizers, step
from xla_mnist.runtime.errors import UsageError

Adam, SGD = keras.optimizers.Adam, keras.optimizers.SGD


def test_a_compiled_models_optimizer_is_the_one_the_step_applies():
  net = model.create_model(keras_panel.compiled_adam, **mnist.FACTS)
  config = configured({'model': 'support.keras_panel:compiled_adam'})
  assert step.make_optimizer(net, config) is net.optimizer
  assert net.optimizer.built
  uncompiled = model.create_model(keras_panel.own_loss, **mnist.FACTS)
  built = step.make_optimizer(uncompiled, configured({'optimizer': 'adam'}))
  assert isinstance(built, Adam)


@pytest.mark.parametrize(
  'fields, named',
  [
    ({'optimizer': 'adam'}, 'optimizer asks'),
    ({'schedule': 'cosine_decay'}, 'schedule asks'),
    ({'optimizer_args.momentum': 0.9}, 'optimizer_args.momentum asks'),
  ],
)
def test_a_config_optimizer_beside_a_compiled_one_is_one_line(fields, named):
  net = model.create_model(keras_panel.compiled_adam, **mnist.FACTS)
  config = configured({'model': 'support.keras_panel:compiled_adam', **fields})
  with pytest.raises(UsageError) as refused:
    step.make_optimizer(net, config)
  line = str(refused.value)
  assert 'compiled with its own optimizer, Adam (learning rate 0.01)' in line
  assert named in line and '\n' not in line


def test_compile_without_an_optimizer_trains_with_the_configs():
  net = model.create_model(keras_panel.compiled_loss_only, **mnist.FACTS)
  built = step.make_optimizer(net, configured({'learning_rate': 0.25}))
  assert isinstance(built, SGD) and float(built.learning_rate) == 0.25


@pytest.mark.parametrize(
  'optimizer, recipe',
  [
    (SGD(0.5), {'optimizer': 'sgd', 'learning_rate': 0.5}),
    (Adam(1e-3), {'optimizer': 'adam', 'learning_rate': 0.001}),
    (
      Adam(1e-3, beta_2=0.99, use_ema=True),
      {
        'optimizer': 'adam', 'learning_rate': 0.001,
        'optimizer_args.beta_2': 0.99, 'optimizer_args.use_ema': True,
      },
    ),
    (
      keras.optimizers.LossScaleOptimizer(Adam(1e-3)),
      {'optimizer': 'adam', 'learning_rate': 0.001},
    ),
  ],
)  # fmt: skip
def test_recipe_of_a_built_optimizer_records_what_differs(optimizer, recipe):
  assert optimizers.recipe_of(optimizer) == {'schedule': 'constant', **recipe}


def test_recipe_of_a_compiled_optimizer_has_the_configs_fields():
  """Keyed as the config's recipe: a compiled run and a config's run of
  another optimizer differ in `optimizer`, the line's first field."""
  config = configured({'optimizer': 'adam', 'optimizer_args.beta_2': 0.99})
  compiled = optimizers.recipe_of(Adam(1e-3, beta_2=0.99))
  assert compiled == {**optimizers.recipe(config), 'learning_rate': 0.001}
  plain = {'optimizer': 'sgd', 'schedule': 'constant', 'learning_rate': 0.5}
  assert optimizers.recipe_of(SGD(0.5)) == plain


def test_a_compiled_schedule_is_recorded_and_logged_as_keras_steps_it():
  cosine = keras.optimizers.schedules.CosineDecay(0.1, 10, alpha=0.1)
  assert optimizers.recipe_of(SGD(cosine)) == {
    'optimizer': 'sgd',
    'schedule': 'cosine_decay',
    'learning_rate': 0.1,
    'schedule_args.decay_steps': 10,
    'schedule_args.alpha': 0.1,
    'schedule_args.warmup_steps': 0,
  }
  rate = optimizers.rates_of(SGD(cosine))
  assert rate(1) == pytest.approx(0.1)
  assert rate(11) == pytest.approx(0.01)
  assert optimizers.rates_of(Adam(1e-3))(7) == 0.001
