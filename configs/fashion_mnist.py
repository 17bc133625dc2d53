"""The default recipe on Fashion-MNIST, which trains offline from Debian's
`dataset-fashion-mnist` files (/usr/share/datasets/fashion-mnist)."""

import ml_collections

from xla_mnist.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset = 'fashion_mnist'
  return config
