"""The packaged models and a user's own factory: every jit mode, the fused
loop, the accuracy floors, exact resume, refusals, and the bad factories.
Runs train in this process as a notebook's do (`train_here`), but where the
command is the subject: tf.distribute's logical CPUs, a signal, and a
factory's module found on PYTHONPATH."""

from __future__ import annotations

import json
import math
import os
import signal

import numpy as np
import pytest
from support.cli import assert_one_line_error, run_train
from support.models import FACTORIES, importable
from support.runs import final_state, interrupt, train_here

from xla_mnist.runtime.errors import UsageError


def run_model(data_dir, workdir, *args: str) -> dict:
  """A short run in this process; its result.json."""
  train_here(
    f'--data_dir={data_dir}', f'--workdir={workdir}', '--config.log_every=2',
    *args,
  )  # fmt: skip
  return json.loads((workdir / 'result.json').read_text())


@pytest.mark.slow
@pytest.mark.parametrize('jit', ['off', 'on', 'auto'])
@pytest.mark.parametrize('name', ['mlp', 'cnn'])
def test_each_model_trains_in_each_jit_mode_in_the_fused_loop(
  name, jit, fashion_data_dir, tmp_path, capsys
):
  """Calls of 3 steps (K > 1): the fused XLA loop for `on`."""
  result = run_model(
    fashion_data_dir,
    tmp_path,
    f'--config={name}',
    f'--jit={jit}',
    '--config.num_steps=6',
    '--config.steps_per_loop=3',
    '--config.batch_size=20',
    '--config.profile_steps=3',
  )
  assert result['steps'] == 6 and result['steps_per_loop'] == 3
  assert result['config']['model'] == name and result['jit'] == jit
  # XLA:CPU's convolutions in a loop's body are slow: said, for XLA's loop.
  said = capsys.readouterr().out
  noted = 'note: the fused loop holds convolutions (Conv2D,' in said
  assert noted == (name == 'cnn' and jit == 'on')
  assert math.isfinite(result['final_loss'])
  assert (tmp_path / 'breakdown.json').is_file()


@pytest.mark.slow
@pytest.mark.parametrize('name', ['mlp', 'cnn'])
def test_each_model_trains_under_mirrored_on_two_cpus(
  name, fashion_data_dir, tmp_path
):
  """The same loop under tf.distribute: one step a call, two replicas, on
  logical CPUs that a process makes before TF starts its devices."""
  proc = run_train(
    f'--data_dir={fashion_data_dir}',
    f'--workdir={tmp_path}',
    f'--config={name}',
    '--strategy=mirrored',
    '--config.num_cpu_devices=2',
    '--config.num_steps=4',
    '--config.batch_size=20',
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / 'result.json').read_text())
  assert result['config']['model'] == name and result['steps'] == 4
  assert result['device'] == '2 replicas (mirrored)'
  assert math.isfinite(result['final_loss'])


# From runs of a fraction of each config's steps (README has the full runs'
# figures); well above chance (0.1): each learns.
FLOORS = {'mlp': (300, 0.78), 'cnn': (150, 0.62)}


@pytest.mark.slow
@pytest.mark.parametrize('name', FLOORS)
def test_each_packaged_model_learns_fashion_mnist(
  name, fashion_data_dir, tmp_path
):
  steps, floor = FLOORS[name]
  result = run_model(
    fashion_data_dir,
    tmp_path,
    f'--config={name}',
    f'--config.num_steps={steps}',
    '--config.profile_steps=0',
  )
  assert result['test_accuracy'] >= floor, result['test_accuracy']


@pytest.fixture
def factories(tmp_path) -> dict[str, str]:
  """The environment that puts the user's module on PYTHONPATH, ahead of
  what PYTHONPATH held (the checkout under test, say)."""
  folder = tmp_path / 'user'
  folder.mkdir()
  (folder / 'user_models.py').write_text(FACTORIES)
  path = os.environ.get('PYTHONPATH', '')
  return {'PYTHONPATH': os.pathsep.join(filter(None, [str(folder), path]))}


@pytest.fixture
def user_models(factories, tmp_path, monkeypatch) -> None:
  """The user's module importable in this process, imported anew."""
  importable(monkeypatch, tmp_path / 'user')


def user_args(data_dir, workdir, factory: str, *extra: str) -> list[str]:
  return [
    '--config=fashion_mnist',
    f'--config.model=user_models:{factory}',
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
    '--config.num_steps=60',
    '--config.steps_per_loop=5',
    '--config.log_every=5',
    '--config.checkpoint_every=10',
    '--config.profile_steps=5',
    *extra,
  ]


@pytest.mark.slow
@pytest.mark.parametrize('jit', ['off', 'on', 'auto'])
def test_a_users_model_trains_in_each_jit_mode(
  jit, user_models, fashion_data_dir, tmp_path
):
  workdir = tmp_path / 'run'
  train_here(*user_args(fashion_data_dir, workdir, 'small', f'--jit={jit}'))
  result = json.loads((workdir / 'result.json').read_text())
  assert result['config']['model'] == 'user_models:small'
  assert result['test_accuracy'] > 0.5  # 60 steps of 100: it learns.
  assert (workdir / 'breakdown.json').is_file()
  assert result['profile'] is not None


@pytest.mark.slow
def test_a_users_model_resumes_exactly_after_sigterm_and_only_as_itself(
  factories, fashion_data_dir, tmp_path
):
  straight, stopped = tmp_path / 'straight', tmp_path / 'stopped'
  proc = run_train(*user_args(fashion_data_dir, straight, 'small'), **factories)
  assert proc.returncode == 0, proc.stderr[-3000:]
  args = user_args(fashion_data_dir, stopped, 'small')
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('PYTHONPATH', factories['PYTHONPATH'])
    proc = interrupt(args, 20, signal.SIGTERM)
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
  step = int(final_state(stopped)['step/.ATTRIBUTES/VARIABLE_VALUE'])
  assert 20 <= step < 60
  other = user_args(fashion_data_dir, stopped, 'wider')
  assert_one_line_error(
    run_train(*other, **factories),
    2,
    "with model_name 'user_models:small'",
    "has 'user_models:wider'",
    '--fresh',
  )
  proc = run_train(*args, **factories)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'resuming at step {step}' in proc.stdout
  state, expected = final_state(stopped), final_state(straight)
  assert state.keys() == expected.keys()
  for key, value in expected.items():
    assert np.array_equal(state[key], value), key
  result, reference = (
    json.loads((w / 'result.json').read_text()) for w in (stopped, straight)
  )
  assert result['final_loss'] == reference['final_loss']
  assert result['test_accuracy'] == reference['test_accuracy']


# A factory per fault, refused in one line before the workdir is made, with
# what the line must name.
BAD_FACTORIES = [
  ('user_models:absent', ('user_models.absent is missing',)),
  ('user_models:not_a_model', ('returned a list, not a Keras model',)),
  ('user_models:five_outputs', ('(2, 5)', 'not (2, 10)')),
  ('user_models:raises', ('RuntimeError: no weights file here',)),
  (
    'user_models:stringly',
    ('XLA cannot compile (AsString)', 'config.jit=off', 'auto'),
  ),
]


@pytest.mark.slow
@pytest.mark.parametrize(('model', 'said'), BAD_FACTORIES)
def test_a_bad_factory_is_refused_before_the_workdir_is_made(
  model, said, user_models, fashion_data_dir, tmp_path
):
  workdir = tmp_path / 'run'
  with pytest.raises(UsageError) as refused:
    train_here(
      '--config=fashion_mnist', f'--config.model={model}',
      f'--data_dir={fashion_data_dir}', f'--workdir={workdir}',
    )  # fmt: skip
  for fragment in (f'model {model}', *said):
    assert fragment in str(refused.value)
  assert refused.value.exit_code == 2 and '\n' not in str(refused.value)
  assert not workdir.exists()


@pytest.mark.slow
def test_a_factory_the_command_cannot_import_is_one_line(
  factories, fashion_data_dir, tmp_path
):
  """The command's line names PYTHONPATH, where its module was looked for."""
  workdir = tmp_path / 'run'
  proc = run_train(
    '--config=fashion_mnist',
    '--config.model=missing_module:small',
    f'--data_dir={fashion_data_dir}',
    f'--workdir={workdir}',
    **factories,
  )
  assert_one_line_error(
    proc, 2, 'model missing_module:small', 'cannot import missing_module',
    'PYTHONPATH',
  )  # fmt: skip
  assert not workdir.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
  ('model', 'said'),
  [
    ('no_such_module:make', 'cannot import no_such_module'),
    ('user_models:absent', 'user_models.absent is missing'),
  ],
)
def test_a_factory_that_cannot_be_found_is_refused_before_the_data(
  model, said, factories, tmp_path
):
  """Before the data are prepared: an empty data dir, which the run would
  fill from Debian's IDX files, stays empty."""
  data_dir, workdir = tmp_path / 'data', tmp_path / 'run'
  data_dir.mkdir()
  proc = run_train(
    '--config=fashion_mnist', f'--config.model={model}',
    f'--data_dir={data_dir}', f'--workdir={workdir}', **factories,
  )  # fmt: skip
  assert_one_line_error(proc, 2, f'model {model}', said)
  assert not list(data_dir.iterdir()) and not workdir.exists()


@pytest.mark.slow
def test_an_op_xla_cannot_compile_trains_with_jit_off(
  user_models, fashion_data_dir, tmp_path
):
  trained = train_here(
    *user_args(fashion_data_dir, tmp_path, 'stringly', '--jit=off')
  )
  assert trained.result.test_accuracy > 0.5


@pytest.mark.slow
def test_the_mlp_learns_more_with_adam_than_with_sgd_at_its_rate(
  fashion_data_dir, tmp_path
):
  """Issue 51's acceptance: the optimizer is the user's, and it shows in
  what the model learns, 500 steps at Keras's Adam rate 1e-3."""
  accuracy = {
    name: run_model(
      fashion_data_dir, tmp_path / name, '--config=mlp',
      '--config.num_steps=500', '--config.learning_rate=1e-3',
      f'--config.optimizer={name}', '--config.profile_steps=0',
      '--config.log_every=100',
    )['test_accuracy']
    for name in ('sgd', 'adam')
  }  # fmt: skip
  assert accuracy['adam'] > accuracy['sgd'] + 0.1, accuracy
