"""xla_mnist: TF1's mnist_softmax_xla.py in TF2, to see and measure XLA."""
