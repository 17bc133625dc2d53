"""A user's Keras model trained as `fit` would train it (docs/models.md,
"What fit does, the loop does too"): a softmax output, regularizers, random
layers stopped and resumed, mixed precision, and every legal model form
trained or refused in one line. Runs train in this process as a notebook's
do (`train_here`), but where the command is the subject: a signal,
tf.distribute's logical CPUs, and where a factory's module is found."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
from support.cli import assert_one_line_error, run_module, run_train
from support.runs import final_state, interrupt, train_here

from xla_mnist.runtime.errors import UsageError
from xla_mnist.workdir import resuming

pytestmark = pytest.mark.slow

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# tests/ ahead of what PYTHONPATH held, for support.keras_panel.
PANEL_ENV = {
  'PYTHONPATH': os.pathsep.join(
    filter(None, [TESTS, os.environ.get('PYTHONPATH', '')])
  )
}


def args(data_dir, workdir, name: str, *extra: str) -> list[str]:
  return [
    '--config=fashion_mnist',
    f'--config.model=support.keras_panel:{name}',
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
    '--config.learning_rate=0.1',
    '--config.profile_steps=0',
    *extra,
  ]


def result(workdir) -> dict:
  return json.loads((workdir / 'result.json').read_text())


def test_keras_ios_convnet_unchanged_trains_as_its_logits_twin(
  fashion_data_dir, tmp_path, capsys
):
  """keras-io's "Simple MNIST convnet" ends in a softmax: it trains on its
  probabilities, says so, and learns as the same network ending in logits.
  (Batches of 32: the convnet's step is most of this test's time.)"""
  accuracy = {}
  for name in ('keras_io_convnet', 'convnet_logits'):
    workdir = tmp_path / name
    train_here(
      *args(
        fashion_data_dir, workdir, name, '--config.num_steps=150',
        '--config.batch_size=32', '--config.steps_per_loop=1',
      ),
    )  # fmt: skip
    said = capsys.readouterr().out
    softmax = 'gives probabilities' in said
    assert softmax == (name == 'keras_io_convnet'), said
    assert result(workdir)['outputs'] == (
      'probabilities' if softmax else 'logits'
    )
    accuracy[name] = result(workdir)['test_accuracy']
  assert accuracy['keras_io_convnet'] > 0.6, accuracy
  assert abs(accuracy['keras_io_convnet'] - accuracy['convnet_logits']) < 0.05


@pytest.mark.parametrize('per_call', [1, 5])
def test_a_dropout_model_resumes_bit_for_bit_after_sigterm(
  per_call, fashion_data_dir, tmp_path
):
  """Dropout and GaussianNoise draw from seed generators that live in
  `model.variables` only: checkpointed, and restored after the fused loop's
  warm-up, so the resumed run draws the numbers the uninterrupted one did."""
  straight, stopped = tmp_path / 'straight', tmp_path / 'stopped'
  extra = (
    '--config.num_steps=60',
    f'--config.steps_per_loop={per_call}',
    '--config.log_every=5',
    '--config.checkpoint_every=10',
  )
  proc = run_train(
    *args(fashion_data_dir, straight, 'noise', *extra), **PANEL_ENV
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('PYTHONPATH', PANEL_ENV['PYTHONPATH'])
    proc = interrupt(
      args(fashion_data_dir, stopped, 'noise', *extra), 20, signal.SIGTERM
    )
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
  proc = run_train(
    *args(fashion_data_dir, stopped, 'noise', *extra), **PANEL_ENV
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'resuming at step' in proc.stdout
  state, expected = final_state(stopped), final_state(straight)
  assert state.keys() == expected.keys()
  assert any('model_state' in key for key in state), list(state)
  for key, value in expected.items():
    assert np.array_equal(state[key], value), key
  assert result(stopped)['final_loss'] == result(straight)['final_loss']


@pytest.mark.parametrize('jit', ['off', 'auto', 'on'])
def test_a_mixed_bfloat16_model_trains_and_records_its_policy(
  jit, fashion_data_dir, tmp_path
):
  workdir = tmp_path / 'run'
  flags = ('--config.num_steps=100', f'--jit={jit}')
  train_here(*args(fashion_data_dir, workdir, 'bf16', *flags))
  assert result(workdir)['precision'] == 'mixed_bfloat16'
  assert result(workdir)['test_accuracy'] > 0.5
  # Resuming it as a float32 model of the same shapes is another run.
  more = ('--config.num_steps=200', f'--jit={jit}')
  with pytest.raises(UsageError) as refused:
    train_here(
      *args(fashion_data_dir, workdir, 'bare', *more),
    )  # fmt: skip
  for fragment in ('support.keras_panel:bf16', 'fresh=True'):
    assert fragment in str(refused.value)


def test_regularizers_shrink_the_kernels_and_the_report_says_how_much(
  fashion_data_dir, tmp_path
):
  norms = {}
  for name in ('bare', 'l2_strong'):
    workdir = tmp_path / name
    trained = train_here(
      *args(fashion_data_dir, workdir, name, '--config.num_steps=100'),
    )  # fmt: skip
    # The kernels, under whichever of their checkpoint's paths TF keeps.
    kernels = [v for v in final_state(workdir).values() if np.ndim(v) == 2]
    norms[name] = sum(float(np.sum(k**2)) for k in kernels)
    losses = result(workdir)['model_losses']
    assert (losses is None) == (name == 'bare')
  assert norms['l2_strong'] < 0.5 * norms['bare'], norms
  said = trained.result.summary()  # The lines that end a command's run.
  assert 'model.losses (regularizers, add_loss) of the trained' in said


# A model form per case: legal Keras, refused in one line before the workdir
# is made, with what the line must name.
REFUSED = [
  ('underscored', ("is named '__hidden'", 'refuses as a name scope')),
  ('spaced_layer', ("has a layer named 'my dense'", 'refuses as a name')),
  ('two_inputs', ('takes 2 inputs',)),
  ('two_outputs', ('gives 2 outputs', '(2, 10), (2, 1)')),
  ('int_outputs', ('int32', 'not (2, 10) floats')),
  ('all_frozen', ('no trainable weights', 'trainable = True')),
  ('no_gradient', ('no gradient reaches any trainable weight',)),
  ('own_train_step', ('overrides train_step', 'cannot call', 'compute_loss')),
  ('compiled_no_loss', ('compiled without a loss', 'model.losses alone')),
  ('compiled_box_loss', ('its loss _box_loss fails on the integer labels',)),
]


@pytest.mark.parametrize(('name', 'said'), REFUSED)
def test_each_model_form_keras_cannot_train_is_one_line(
  name, said, fashion_data_dir, tmp_path
):
  workdir = tmp_path / 'run'
  with pytest.raises(UsageError) as refused:
    train_here(*args(fashion_data_dir, workdir, name))
  for fragment in (f'support.keras_panel:{name}', *said):
    assert fragment in str(refused.value)
  assert refused.value.exit_code == 2 and '\n' not in str(refused.value)
  assert not workdir.exists()
  # Keras as it was: no name scope left open, as a failed trace leaves one.
  probe = keras.layers.Dense(1, name='probe')
  probe.build((None, 4))
  assert probe.kernel.path == 'probe/kernel'


@pytest.mark.parametrize(
  'name', ['unknown_sizes', 'rank_two', 'partly_unused', 'listed_output']
)
def test_odd_but_trainable_forms_train(
  name, fashion_data_dir, tmp_path, capsys
):
  workdir = tmp_path / 'run'
  with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter('always')  # Shown again, if shown before.
    train_here(
      *args(fashion_data_dir, workdir, name, '--config.num_steps=30'),
    )  # fmt: skip
  said = capsys.readouterr().out
  assert (name == 'partly_unused') == ('get no gradient' in said)
  # Said once, in the run's words: not again by Keras's optimizer, whose
  # warning speaks of compile().
  assert not [w for w in warned if 'Gradients do not exist' in str(w.message)]


MODULE = textwrap.dedent(
  """
  import keras

  def small(input_shape, num_classes):
    return keras.Sequential(
      [keras.Input(input_shape), keras.layers.Flatten(),
       keras.layers.Dense(num_classes)]
    )
  """
)


@pytest.mark.parametrize('how', ['console script', 'python -m'])
def test_a_factorys_module_is_found_in_the_current_directory(
  how, fashion_data_dir, tmp_path
):
  """As docs/models.md says, however the command was started: a console
  script's sys.path holds its bin folder, not the current directory."""
  (tmp_path / 'here_models.py').write_text(MODULE)
  flags = [
    '--config=fashion_mnist',
    '--config.model=here_models:small',
    f'--data_dir={fashion_data_dir}',
    f'--workdir={tmp_path / "run"}',
    '--config.num_steps=20',
  ]
  if how == 'python -m':
    proc = run_module('xla_mnist.train', *flags, cwd=str(tmp_path))
  else:
    script = os.path.join(os.path.dirname(sys.executable), 'xla-mnist-train')
    proc = subprocess.run(
      [script, *flags], cwd=tmp_path, capture_output=True, text=True,
      timeout=300,
    )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert re.search(r'test accuracy \d', proc.stdout)


def test_a_notebooks_function_cannot_cross_to_another_process(
  fashion_data_dir, tmp_path
):
  """What compare's runs and the export meet when a run was trained from a
  notebook's function: one line that says what they need."""
  proc = run_train(
    '--config=fashion_mnist',
    '--config.model=__main__:my_model',
    f'--data_dir={fashion_data_dir}',
    f'--workdir={tmp_path / "run"}',
  )
  assert_one_line_error(
    proc, 2, '__main__:my_model', 'another program', 'module:my_model'
  )


@pytest.mark.parametrize('name', ['dense_l2', 'add_loss', 'compiled_loss_only'])
def test_model_losses_count_once_over_mirrored_replicas(
  name, fashion_data_dir, tmp_path
):
  """Each replica adds its share of `model.losses`, as Keras's trainer
  divides them: two mirrored CPUs end where one device does (and one
  device where `fit` does: test_keras_fit.py). Counted once per replica,
  the regularizers would weigh twice. A compiled loss (`compute_loss`)
  divides its own, as under `fit`."""
  extra = ('--config.num_steps=10', '--config.batch_size=20', '--jit=on')
  runs = {
    'one': ('--config.steps_per_loop=1',),
    'mirrored': ('--strategy=mirrored', '--config.num_cpu_devices=2'),
  }
  for label, flags in runs.items():
    workdir = tmp_path / label
    proc = run_train(
      *args(fashion_data_dir, workdir, name, *extra, *flags), **PANEL_ENV
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
  one, two = (final_state(tmp_path / label) for label in runs)
  weights = [key for key in one if np.ndim(one[key])]  # Kernels, biases.
  assert len(weights) == 4 and all(key in two for key in weights)
  for key in weights:
    np.testing.assert_allclose(two[key], one[key], atol=1e-5, err_msg=key)
  losses = [result(tmp_path / label)['final_loss'] for label in runs]
  assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_a_compiled_model_trains_with_its_optimizer_and_says_so(
  fashion_data_dir, tmp_path, capsys
):
  """Its compile()'s Adam and loss, named in a line (test_keras_fit.py:
  the weights are `fit`'s); a config that names another optimizer too is
  refused in one line that names both, before the workdir is made."""
  workdir = tmp_path / 'run'
  train_here(
    *args(fashion_data_dir, workdir, 'compiled_adam', '--config.num_steps=30')
  )
  said = capsys.readouterr().out
  assert (
    'note: model support.keras_panel:compiled_adam is compiled: it trains'
    ' with its own Adam (learning rate 0.01) and its loss'
    ' SparseCategoricalCrossentropy(from_logits=True), as fit does'
  ) in said, said
  # Recorded as it trained, not as the config says (SGD at 0.1): in the
  # result, and in the fingerprint a resume is held to.
  recipe = result(workdir)['recipe']
  assert (recipe['optimizer'], recipe['learning_rate']) == ('adam', 0.01)
  assert recipe['optimizer_args.epsilon'] == 1e-3
  found = resuming.Scan(str(workdir / 'checkpoints'))
  stored = resuming.stored_fingerprint(found.path(found.newest))
  assert stored.items() >= recipe.items()
  other = tmp_path / 'other'
  with pytest.raises(UsageError) as refused:
    train_here(
      *args(
        fashion_data_dir, other, 'compiled_adam', '--config.optimizer=rmsprop'
      )
    )
  line = str(refused.value)
  for fragment in ('compiled with its own optimizer, Adam', 'optimizer'):
    assert fragment in line
  assert refused.value.exit_code == 2 and '\n' not in line
  assert not other.exists()


def test_a_one_hot_loss_takes_the_labels_one_hot_and_says_so(
  fashion_data_dir, tmp_path, capsys
):
  """`categorical_crossentropy`, as keras-io's convnet compiles it: `fit`
  refuses integer labels for it (a shape error), and its user gives it
  `to_categorical`'s rows, as the run does; it learns."""
  workdir = tmp_path / 'run'
  train_here(
    *args(
      fashion_data_dir, workdir, 'compiled_one_hot', '--config.num_steps=100'
    )
  )
  said = capsys.readouterr().out
  assert "its loss 'categorical_crossentropy', on the labels one-hot" in said
  assert result(workdir)['test_accuracy'] > 0.6
