"""What XLA did and why a step takes its time: the profiled window, the
capture's breakdown, HLO dumps, a model other than the seed's tried and
noted, and compare's explanation."""
