"""The packaged models (softmax, mlp, cnn) and the model field: names
and factories only, ten logits from seeded weights."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest
from support import mnist

from xla_mnist import config as config_lib
from xla_mnist.configs import default
from xla_mnist.runtime.errors import UsageError


def test_model_field_takes_packaged_names_and_factories_only():
  recipe = default.get_config().to_dict()
  for good in ('softmax', 'mlp', 'cnn', 'my.pkg.models:build', 'm:f'):
    config_lib.check(ml_collections.ConfigDict({**recipe, 'model': good}))
  for bad in ('resnet', 'models.py', 'a:b:c', 'a:', ':f', '', 5):
    config = ml_collections.ConfigDict({**recipe, 'model': bad})
    with pytest.raises(UsageError, match=r'config\.model .*softmax, mlp, cnn'):
      config_lib.check(config)


@pytest.mark.parametrize('name', config_lib.PACKAGED_MODELS)
def test_each_packaged_model_gives_ten_logits_from_seeded_weights(name):
  import tensorflow as tf

  from xla_mnist import model

  a, b, c = (
    model.create_model(name, seed, **mnist.FACTS) for seed in (1, 1, 2)
  )
  images = tf.zeros((3, *mnist.SHAPE), tf.uint8)
  assert a(model.inputs(a, images)).shape == (3, mnist.FACTS['num_classes'])
  for x, y, z in zip(a.weights, b.weights, c.weights, strict=True):
    assert np.array_equal(x, y)
    # The softmax starts at zero, as the TF1 program's; the others at random.
    assert np.array_equal(x, z) == (name == 'softmax' or 'bias' in x.path)
