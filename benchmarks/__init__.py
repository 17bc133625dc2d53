"""Speed measurements of the training step; see bench.py."""
