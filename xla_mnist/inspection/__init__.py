"""What XLA did and why a step takes its time: the profiled window, the
capture's breakdown, HLO dumps, and compare's explanation."""
