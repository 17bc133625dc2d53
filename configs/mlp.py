"""A multi-layer perceptron (784-300-100-10, ReLU) on Fashion-MNIST, offline:
plain SGD as the seed's recipe, at the rate and steps that train it well."""

import ml_collections

from xla_mnist.configs import fashion_mnist


def get_config() -> ml_collections.ConfigDict:
  config = fashion_mnist.get_config()
  config.model = 'mlp'
  config.learning_rate = 0.1
  config.num_steps = 5000
  return config
