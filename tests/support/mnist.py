"""(Fashion-)MNIST's facts as its data gives them to a model, for tests that
build a model or checkpoint without loading the data."""

SHAPE = (28, 28, 1)
FACTS = {'image_shape': SHAPE, 'num_classes': 10}
FLAT = (28 * 28,)  # The softmax's and the MLP's input.
DATA = 'x' * 64  # A data digest.
CHECKPOINTED = {'data': DATA, 'image_shape': '28x28x1', 'num_classes': 10}
