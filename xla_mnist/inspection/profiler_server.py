"""TF's profiler server, for on-demand captures while a run trains
(`--profiler_port`); loaded only for a run that asks for it."""

from __future__ import annotations

import logging
import socket

import tensorflow as tf

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError, UserError

LOGGER = logging.getLogger(__name__)
_serving: set[int] = set()  # Ports this process's profiler server is on.


def start(port: int) -> None:
  """Starts TF's profiler server, for on-demand captures of this process
  (TensorBoard's Profile tab, Capture profile, `localhost:<port>`). It
  serves until the process ends: a later run in the process reuses it.
  Raises UserError when the port is taken (TF's server would only log it).
  """
  if type(port) is not int or not 0 <= port <= 65535:
    raise UsageError(
      f'{errors.arg("profiler_port", port)} is no port: pass a whole number'
      ' from 1 to 65535, or 0 for no profiler server'
    )
  if port in _serving:
    return
  family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
  with socket.socket(family) as s:  # TF's server binds [::]:port.
    try:
      s.bind(('', port))
    except OSError as e:
      raise UserError(
        f'{errors.arg("profiler_port", port)}: cannot listen there'
        f' ({e.strerror}): pick another {errors.arg("profiler_port", "PORT")},'
        ' or 0 for no profiler server'
      ) from None
  # TF 2.21's Python API takes a port only; its server listens on every
  # interface (`[::]:PORT`), without authentication: a warning, even quiet.
  LOGGER.warning(
    f'profiler port {port} is open to the network: on every interface,'
    ' without authentication; on a shared machine, close it to others with'
    ' a firewall (docs/profiling.md)'
  )
  tf.profiler.experimental.server.start(port)
  _serving.add(port)
  LOGGER.info(
    f"profiler server on port {port}: capture with TensorBoard's Profile tab"
    f' (Capture profile, localhost:{port})'
  )
