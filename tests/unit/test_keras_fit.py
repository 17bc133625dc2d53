"""Keras's `fit` is the oracle: a panel of ordinary Keras models
(support/keras_panel.py) trained a few steps by the project, in every jit
mode, and by Keras's own `train_on_batch` on the same batches from the same
initial weights with the same optimizer (SGD; Keras's others and a schedule
on one model: OPTIMIZERS; a model its factory compiled, its own, and its
loss), end with the same variables.

The project's run goes through `trainer.train_and_evaluate`, the path of a
real run (the model's check, the step, the fused loop's warm-up); Keras's
step is compiled as the mode compiles (XLA for `on` and `fused`, TF's graph
for `off`, TF's graph under the process's auto-clustering for `auto`). The
two then run the same ops on the same numbers, so they agree to float32
rounding, not bit for bit: the loop gathers and scales each batch inside its
compiled step where Keras is fed the batch, and XLA may fuse and reorder
the two programs' arithmetic differently. TOLERANCE bounds that; a model
trained another way (a loss without `model.losses`, logits taken for
probabilities, a random draw or a statistic out of step) differs by orders
of magnitude more after a few steps. Models that draw random numbers
(Dropout, GaussianNoise) share Keras's seeds: `create_model` seeds Keras
before each build, so both draw the same numbers, and their generators'
states must match exactly.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from support import mnist
from support.idx import make_idx_folder

# `early`: the panel's 96 trainings take two minutes and more (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.early]

STEPS, BATCH, LR, SEED = 6, 16, 0.05, 3


# mode: (jit, steps per call)
MODES = {
  'off': ('off', 1),
  'on': ('on', 1),
  'auto': ('auto', 1),
  'fused': ('on', 3),
}


PANEL = (
  'dense_l2',
  'add_loss',
  'subclassed',
  'no_training_arg',
  'batchnorm',
  'dropout',
  'noise',
  'frozen',
  'keras_io_convnet',
  'softmax_layer',
  'bf16',
  'fp16',
  'compiled_adam',
  'compiled_one_hot',
  'compiled_fp16',
  'compiled_loss_only',
  'own_loss',
  'pixel_embedding',
)


# The models a Keras user compiles with from_logits=False.
PROBABILITIES = {'keras_io_convnet', 'softmax_layer', 'compiled_one_hot'}
# The models compiled with a loss of one-hot labels: `fit` is given them so
# (`keras.utils.to_categorical`), as keras-io's examples give them.
ONE_HOT = {'compiled_one_hot', 'compiled_loss_only'}


# The optimizers beyond SGD (issue 51), each trained on one model in every
# mode: the config's fields, and Keras's own optimizer for `compile`, built
# from Keras's classes directly, not by `optimizers.make`. Adam and RMSprop
# divide each gradient by its own size, less `epsilon`: with Keras's 1e-7, a
# gradient that is float32 rounding (one that is 0 but for it, ~1e-8) would
# step by a fraction of LR either way, so the panel sets an epsilon above
# that (5e-7 from fit's then; 1e-4 with Keras's epsilon).
EPSILON = {'optimizer_args.epsilon': 1e-3}
OPTIMIZERS = {
  'adam': (
    {'optimizer': 'adam', **EPSILON},
    lambda k: k.optimizers.Adam(LR, epsilon=1e-3),
  ),
  'adamw_decay': (
    {'optimizer': 'adamw', 'optimizer_args.weight_decay': 0.1, **EPSILON},
    lambda k: k.optimizers.AdamW(LR, weight_decay=0.1, epsilon=1e-3),
  ),
  'rmsprop': (
    {'optimizer': 'rmsprop', **EPSILON},
    lambda k: k.optimizers.RMSprop(LR, epsilon=1e-3),
  ),
  'sgd_nesterov': (
    {'optimizer_args.momentum': 0.9, 'optimizer_args.nesterov': True},
    lambda k: k.optimizers.SGD(LR, momentum=0.9, nesterov=True),
  ),
  'warmup_cosine': (
    {'schedule': 'cosine_decay', 'schedule_args.warmup_steps': 2,
     'schedule_args.alpha': 0.1},
    lambda k: k.optimizers.SGD(
      k.optimizers.schedules.CosineDecay(
        0.0, STEPS - 2, alpha=0.1, warmup_target=LR, warmup_steps=2
      )
    ),
  ),
  'adam_ema': (
    {'optimizer': 'adam', 'optimizer_args.use_ema': True,
     'optimizer_args.ema_momentum': 0.5, **EPSILON},
    lambda k: k.optimizers.Adam(
      LR, epsilon=1e-3, use_ema=True, ema_momentum=0.5
    ),
  ),
}  # fmt: skip
# Their model, with a Dropout's random state. Not one whose gradient is 0
# but for rounding whatever epsilon (a bias before a BatchNormalization).
OPTIMIZED = 'dropout'


# Largest |ours - fit's| of any variable after STEPS steps: float32 rounding
# grown over a few steps; bfloat16 and float16 (8 and 11 bits of mantissa)
# round where float32 would not.
TOLERANCE = {'float32': 1e-5, 'mixed_bfloat16': 2e-2, 'mixed_float16': 2e-3}


@pytest.fixture(scope='module')
def idx_dir(tmp_path_factory) -> str:
  folder = str(tmp_path_factory.mktemp('panel') / 'idx')
  make_idx_folder(folder, train=80, test=40)
  return folder


def config_for(name: str, mode: str, idx_dir: str):
  from xla_mnist.configs import default

  jit, per_call = MODES[mode]
  config = default.get_config()
  config.update(
    model=f'support.keras_panel:{name}',
    idx_dir=idx_dir,
    learning_rate=LR,
    batch_size=BATCH,
    num_steps=STEPS,
    seed=SEED,
    jit=jit,
    steps_per_loop=per_call,
    profile_steps=0,
    checkpoint_every=0,
    cpu_threads=0,  # This process's TF may have started with its default.
  )
  return config


def fit_model(name: str, mode: str, config, data_dir: str, optimizer=None):
  """Keras's own training of the panel's model `name` on the run's batches,
  by `optimizer(keras)` (SGD at LR by default) and the sparse cross-entropy,
  or as its factory compiled it, its moving average swapped in at the end
  as `fit` ends."""
  import keras
  import tensorflow as tf
  from support import keras_panel

  from xla_mnist import data, model

  net = model.create_model(getattr(keras_panel, name), SEED, **mnist.FACTS)
  if not getattr(net, 'optimizer', None):  # Else its factory's compile().
    net.compile(
      optimizer=(optimizer or (lambda k: k.optimizers.SGD(LR)))(keras),
      loss=getattr(net, 'loss', None)
      or keras.losses.SparseCategoricalCrossentropy(
        from_logits=name not in PROBABILITIES
      ),
    )
  net.jit_compile = MODES[mode][0] == 'on'
  train = data.load(config.dataset, config.idx_dir, data_dir).train
  rows = data.index_blocks(train.size, BATCH, SEED, 0, STEPS)
  for indices in next(rows):
    images = model.inputs(net, tf.gather(train.images, indices))
    labels = tf.gather(train.labels, indices).numpy()
    if name in ONE_HOT:
      labels = keras.utils.to_categorical(labels, mnist.FACTS['num_classes'])
    net.train_on_batch(images, labels)
  net.optimizer.finalize_variable_values(net.trainable_variables)
  return net


# `kernels`: oneDNN's and Eigen's kernels round differently; the two
# trainings must agree under either (make test runs both).
@pytest.mark.kernels
@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('name', PANEL)
def test_the_loop_trains_as_keras_fit_does(name, mode, idx_dir, tmp_path):
  assert_trains_as_fit(name, mode, idx_dir, tmp_path)


@pytest.mark.kernels
@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('optimizer', OPTIMIZERS)
def test_each_optimizer_trains_as_keras_fit_does(
  optimizer, mode, idx_dir, tmp_path
):
  assert_trains_as_fit(OPTIMIZED, mode, idx_dir, tmp_path, optimizer)


def assert_trains_as_fit(
  name: str, mode: str, idx_dir: str, tmp_path, optimizer: str = ''
) -> None:
  """Our run and `fit`'s of model `name`, by `OPTIMIZERS[optimizer]` or SGD,
  end with the same variables, within TOLERANCE."""
  from xla_mnist import trainer
  from xla_mnist.runtime import process

  fields, keras_optimizer = OPTIMIZERS.get(optimizer, ({}, None))
  config = config_for(name, mode, idx_dir)
  for path, value in fields.items():
    group, _, field = path.rpartition('.')
    (config[group] if group else config)[field] = value
  data_dir = str(tmp_path / 'data')
  try:
    ours = trainer.train_and_evaluate(
      config, str(tmp_path / 'run'), data_dir, quiet=True
    )
    keras_fit = fit_model(name, mode, config, data_dir, keras_optimizer)
  finally:
    process.configure_jit('on')  # `auto` is process-wide.
  precision = ours.model.dtype_policy.name
  assert ours.result.precision == precision == keras_fit.dtype_policy.name
  assert ours.result.outputs == (
    'probabilities' if name in PROBABILITIES else 'logits'
  )
  worst = 0.0
  for a, b in zip(ours.model.variables, keras_fit.variables, strict=True):
    assert (a.name, a.shape) == (b.name, b.shape)
    x, y = np.asarray(a.numpy(), np.float64), np.asarray(b.numpy(), np.float64)
    if 'seed_generator' in a.path:
      np.testing.assert_array_equal(x, y, err_msg=a.path)
    worst = max(worst, float(np.max(np.abs(x - y), initial=0)))
  print(f'{name} {optimizer} {mode}: largest difference from fit {worst:.3g}')
  assert worst <= TOLERANCE[precision], f'{name} {optimizer} {mode}: {worst}'


def test_a_model_trained_without_its_regularizers_would_differ(
  idx_dir, tmp_path
):
  """The tolerance is far below what leaving `model.losses` out changes:
  `dense_l2` and its bare twin, trained from the same weights."""
  from xla_mnist import trainer

  runs = [
    trainer.train_and_evaluate(
      config_for(name, 'on', idx_dir), str(tmp_path / name), str(tmp_path),
      quiet=True,
    ).model
    for name in ('dense_l2', 'bare')
  ]  # fmt: skip
  [a, _], [b, _] = (net.layers[0].get_weights() for net in runs)
  assert np.max(np.abs(a - b)) > 100 * TOLERANCE['float32']


def test_a_function_trains_from_python_and_its_policy_stays_its_own(
  idx_dir, tmp_path
):
  """A notebook's factory is a function: the run records its name, and the
  mixed policy it sets holds for its model only, not the next run's."""
  import keras
  from support import keras_panel

  from xla_mnist import trainer

  def notebook_model(input_shape, num_classes):
    return keras_panel.bf16(input_shape, num_classes)

  config = config_for('bare', 'on', idx_dir)
  run = trainer.train_and_evaluate(
    config, str(tmp_path / 'nb'), str(tmp_path), model=notebook_model,
    quiet=True,
  )  # fmt: skip
  name = f'{__name__}:{notebook_model.__qualname__}'
  assert run.result.config['model'] == name
  assert run.result.precision == 'mixed_bfloat16'
  assert (
    config.model == 'support.keras_panel:bare'
  )  # The caller's is as it was.
  assert keras.config.dtype_policy().name == 'float32'
  config.model = 'softmax'
  after = trainer.train_and_evaluate(
    config, str(tmp_path / 'after'), str(tmp_path), quiet=True
  )
  assert after.result.precision == 'float32'
  assert {v.dtype for v in after.model.variables} == {'float32'}


def test_a_built_model_is_refused_for_a_factory(idx_dir, tmp_path):
  """The run builds the model from the config's seed: a model already
  built cannot be given, and the line says what to pass instead."""
  from support import keras_panel

  from xla_mnist import trainer
  from xla_mnist.runtime.errors import UsageError

  built = keras_panel.bare((28, 28, 1), 10)
  with pytest.raises(UsageError, match='a built Keras model, not a factory'):
    trainer.train_and_evaluate(
      config_for('bare', 'on', idx_dir), str(tmp_path), str(tmp_path),
      model=built,
    )  # fmt: skip
  assert not os.path.exists(tmp_path / 'result.json')


def test_an_integer_input_gets_the_pixels_as_integers(idx_dir, tmp_path):
  """An Embedding over the pixels' values sees 0 to 255, not [0, 1] cast
  to 0 and 1: the rows of values above 1 train."""
  import tensorflow as tf
  from support import keras_panel

  from xla_mnist import model, trainer

  net = model.create_model(keras_panel.pixel_embedding, SEED, **mnist.FACTS)
  images = np.arange(2 * 784).reshape(2, 28, 28, 1).astype(np.uint8)
  given = model.inputs(net, tf.constant(images))
  assert given.dtype == tf.int32
  np.testing.assert_array_equal(given.numpy(), images.reshape(2, 784))
  (rows,) = [v for v in net.weights if 'embeddings' in v.path]
  start = rows.numpy()
  run = trainer.train_and_evaluate(
    config_for('pixel_embedding', 'on', idx_dir), str(tmp_path / 'run'),
    str(tmp_path / 'data'), quiet=True,
  )  # fmt: skip
  (rows,) = [v for v in run.model.weights if 'embeddings' in v.path]
  moved = np.any(rows.numpy() != start, axis=1)
  assert moved[2:].sum() > 100, moved
