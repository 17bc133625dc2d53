"""The library as a notebook uses it: `train_and_evaluate` in this
process."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from support import mnist

from xla_mnist import model, trainer
from xla_mnist.configs import default
from xla_mnist.runtime.errors import UserError


def small_config(**overrides):
  config = default.get_config()
  config.update(
    dataset='fashion_mnist',
    num_steps=30,
    batch_size=20,
    log_every=10,
    checkpoint_every=0,
    profile_steps=0,
    # The threads this process runs: the suite's earlier tests may have
    # started TF, whose threads never change (another count is refused).
    cpu_threads=tf.config.threading.get_intra_op_parallelism_threads(),
  )
  config.update(overrides)
  return config


@pytest.fixture
def generated_data(idx_folder, tmp_path):
  folder, arrays = idx_folder
  return folder, arrays, str(tmp_path / 'tfds')


def test_train_and_evaluate_returns_the_trained_model_and_its_result(
  generated_data, tmp_path, capsys
):
  folder, arrays, data_dir = generated_data
  config = small_config(idx_dir=folder)
  workdir = str(tmp_path / 'run')
  trained = trainer.train_and_evaluate(config, workdir, data_dir)
  result = trained.result
  assert not trained.was_finished
  assert result.steps == 30 and result.steps_per_loop == 30
  assert result.workdir == workdir
  assert np.isfinite(result.final_loss)
  # The returned model is the trained one: it scores what the result says.
  images, labels = arrays['test']
  logits = trained.model(
    model.preprocess(tf.constant(images[..., None]), mnist.FLAT)
  )
  hits = np.argmax(logits.numpy(), axis=-1) == labels
  assert np.mean(hits) == pytest.approx(result.test_accuracy, abs=1e-6)
  stored = json.loads((tmp_path / 'run' / 'result.json').read_text())
  assert stored['test_accuracy'] == result.test_accuracy
  assert 'step     30/30' in capsys.readouterr().out

  again = trainer.train_and_evaluate(config, workdir, data_dir)
  assert again.was_finished and again.result == result


def test_library_errors_name_arguments_not_flags(generated_data, tmp_path):
  folder, _, data_dir = generated_data
  workdir = str(tmp_path / 'run')
  trainer.train_and_evaluate(small_config(idx_dir=folder), workdir, data_dir)
  with pytest.raises(UserError) as error:
    trainer.train_and_evaluate(
      small_config(idx_dir=folder, seed=9), workdir, data_dir
    )
  message = str(error.value)
  assert 'holds a run with seed 1' in message and 'fresh=True' in message
  assert '--' not in message


def test_a_run_that_finds_its_steps_done_reports_the_restored_model(
  generated_data, tmp_path, capsys
):
  """As after a kill between the last save and the result's write."""
  folder, _, data_dir = generated_data
  config = small_config(idx_dir=folder)
  workdir = tmp_path / 'run'
  first = trainer.train_and_evaluate(config, str(workdir), data_dir).result
  (workdir / 'result.json').unlink()
  capsys.readouterr()

  again = trainer.train_and_evaluate(config, str(workdir), data_dir)
  assert not again.was_finished
  result = again.result
  # Restored (the loss) and recomputed (the accuracy), exactly.
  assert result.final_loss == first.final_loss
  assert result.test_accuracy == first.test_accuracy
  for name in (
    'compile_seconds',
    'train_seconds',
    'paused_seconds',
    'steps_per_second',
    'profile',
  ):
    assert getattr(result, name) is None, name
  text = (workdir / 'result.json').read_text()
  stored = json.loads(text, parse_constant=lambda c: pytest.fail(c))
  assert stored['steps_per_second'] is None
  assert stored['final_loss'] == first.final_loss
  out = capsys.readouterr().out
  assert 'holds step 30 of 30 but no result.json' in out
  assert 'not measured' in result.summary()
  assert '| speed | not measured |' in (workdir / 'report.md').read_text()


def test_a_runs_precision_is_its_own_in_a_process_of_other_runs(
  generated_data, tmp_path
):
  """`config.precision` builds the model under its policy and puts the
  global one back: a float32 run after a bfloat16 one (and after a user's
  own global policy) ends bit for bit where the same run ends first."""
  import keras  # noqa: PLC0415

  folder, _, data_dir = generated_data

  def run(name: str, **fields) -> trainer.Trained:
    config = small_config(idx_dir=folder, model='mlp', jit='off', **fields)
    return trainer.train_and_evaluate(config, str(tmp_path / name), data_dir)

  first = run('first')
  bf16 = run('bf16', precision='mixed_bfloat16')
  assert bf16.result.precision == 'mixed_bfloat16'
  assert bf16.model.dtype_policy.name == 'mixed_bfloat16'
  assert keras.config.dtype_policy().name == 'float32'
  keras.config.set_dtype_policy('mixed_float16')  # A notebook's own.
  try:
    again = run('again')
  finally:
    keras.config.set_dtype_policy('float32')
  assert again.result.precision == 'float32'
  for a, b in zip(first.model.weights, again.model.weights, strict=True):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert not np.allclose(
    first.model.weights[0].numpy(), bf16.model.weights[0].numpy()
  )
