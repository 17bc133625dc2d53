"""The packaged CNN on colour images: CIFAR-10 by TFDS's builder (it
downloads once), or any folder of 32x32 RGB images with
--config.image_dir=DIR. The CNN builds for the data's shape and classes;
one compiled step per call, as configs/cnn.py says why."""

import ml_collections

from xla_mnist.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset = 'cifar10'
  config.model = 'cnn'
  config.learning_rate = 0.05
  config.batch_size = 64
  config.num_steps = 2000
  config.steps_per_loop = 1
  return config
