"""The shared compare run's size (conftest's `compare_workdir`)."""

COMPARE_STEPS = 50
# The fused mode's steps per call: its profiled window (two calls) and the
# sweep's runs hold whole calls, and the profiled runs stay short.
COMPARE_LOOP = 10
COMPARE_SWEEP = (10, 100)  # 100 is the main runs' size: they are reused.
COMPARE_REPEATS = 2  # Timed runs per mode: medians, and their spread.
