"""A model other than the seed's, in this process: a user's tried on one
compiled step before the run, the fused loop's note on convolutions.
(`system/test_model_contract.py` runs each fault through the command.)"""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf
from support import keras_panel, mnist

from xla_mnist import model, program
from xla_mnist.configs import default
from xla_mnist.inspection import model_notes
from xla_mnist.runtime.errors import UsageError

FACTS = tuple(mnist.FACTS.values())  # image_shape, num_classes


def config_for(name, **fields):
  config = default.get_config()
  config.model = name
  config.update(fields)
  return config


def compiled(name, split, **fields):
  config = config_for(name, batch_size=8, num_steps=4, **fields)
  net = model.create_model(name, **mnist.FACTS)
  optimizer = keras.optimizers.SGD(0.1)
  optimizer.build(net.trainable_variables)
  strategy = tf.distribute.get_strategy()
  return program.make(net, optimizer, split, config, 0, strategy)


def test_the_fused_loop_notes_its_convolutions_on_a_cpu_only(split):
  cnn = compiled('cnn', split, steps_per_loop=2)
  (note,) = model_notes.loop_note(cnn, 'on', 'CPU:0')
  assert 'Conv2D' in note and 'steps_per_loop' in note, note
  assert model_notes.loop_note(cnn, 'on', 'GPU:0') == []
  assert model_notes.loop_note(compiled('mlp', split), 'on', 'CPU:0') == []
  per_step = compiled('cnn', split, steps_per_loop=1)
  assert model_notes.loop_note(per_step, 'on', 'CPU:0') == []


def test_packaged_models_need_no_try():
  assert model_notes.check(config_for('cnn'), None, *FACTS) is None


def test_a_users_model_is_tried_on_one_compiled_step():
  """Each fault is one UsageError; weights with no gradient, a note."""
  with pytest.raises(UsageError, match='no trainable weights'):
    model_notes.check(
      config_for('panel:all_frozen'), keras_panel.all_frozen, *FACTS
    )
  config = config_for('panel:partly_unused')
  note = model_notes.check(config, keras_panel.partly_unused, *FACTS)
  assert 'get no gradient' in note and 'unused' in note, note
  assert (
    model_notes.check(config_for('panel:bare'), keras_panel.bare, *FACTS)
    is None
  )
