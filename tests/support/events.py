"""A run's event files as TensorBoard reads them."""

from __future__ import annotations


def event_scalars(logdir: str, tag: str) -> list[tuple[int, float]]:
  """TF2's scalars as TensorBoard reads them (tensors), every one kept."""
  import tensorflow as tf
  from tensorboard.backend.event_processing import event_accumulator

  events = event_accumulator.EventAccumulator(
    logdir, size_guidance={event_accumulator.TENSORS: 0}
  )
  events.Reload()
  return [
    (e.step, float(tf.make_ndarray(e.tensor_proto)))
    for e in events.Tensors(tag)
  ]
