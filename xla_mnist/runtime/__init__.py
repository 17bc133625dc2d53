"""The process the recipe runs in: the command line, errors, signals,
the environment TF reads, devices, tf.distribute roles, the XLA cache."""
