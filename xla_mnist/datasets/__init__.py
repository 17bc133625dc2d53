"""TFDS builders of our own: the IDX folder builder."""
