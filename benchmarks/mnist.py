"""Fashion-MNIST's facts as its data gives them to a model, for the
benchmarks that build one before or without loading the data."""

FACTS = {'image_shape': (28, 28, 1), 'num_classes': 10}
FLAT = (28 * 28,)  # The softmax's input.
