"""The CNN of Flax's MNIST example on Fashion-MNIST, offline: plain SGD as
the seed's recipe, at the rate and steps that train it well in minutes on
two CPU cores."""

import ml_collections

from xla_mnist.configs import fashion_mnist


def get_config() -> ml_collections.ConfigDict:
  config = fashion_mnist.get_config()
  config.model = 'cnn'
  config.learning_rate = 0.1
  config.num_steps = 1500
  # One compiled step per call: inside the fused loop's XLA while loop,
  # XLA:CPU leaves the gradients' convolutions in a form its fast (Eigen)
  # kernels do not take, and a step ran 35x slower (docs/models.md).
  config.steps_per_loop = 1
  return config
