"""The one voice of the library and its commands: the `xla_mnist` logger.

Every line a run shows is a record of Python's logging: a command shows them
on stdout (`show`), a notebook quiets or redirects them as any library's, a
test captures them. Errors are not lines: they end a command on stderr
(`cli.fail`) or reach Python as exceptions.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from xla_mnist.runtime import streams

LOGGER = logging.getLogger('xla_mnist')


class _Stdout(logging.StreamHandler):
  """Writes the message alone to whatever `sys.stdout` is at each line (a
  notebook's cell, a test's capture), as any stdout takes it; a stdout that
  cannot be written stops the run after a save (`streams.Guarded`), rather
  than becoming logging's traceback at every line."""

  # logging's own attribute, read at each line and never set.
  stream = property(
    lambda _: streams.Guarded('stdout', sys.stdout), lambda *_: None
  )

  def format(self, record: logging.LogRecord) -> str:
    return streams.printable(super().format(record))


def say(*texts: str) -> None:
  """Each text as a line of its own."""
  for text in texts:
    LOGGER.info(text)


def show() -> None:
  """Prints the library's lines on stdout, unless the `xla_mnist` logger has
  a handler already: the caller's logging set-up wins."""
  if not LOGGER.handlers:
    LOGGER.addHandler(_Stdout())
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False  # absl's root handler would print it again.


@contextlib.contextmanager
def lines(quiet: bool) -> Iterator[None]:
  """The library's lines shown for a while, or only its warnings if `quiet`."""
  show()
  level = LOGGER.level
  if quiet:
    LOGGER.setLevel(logging.WARNING)
  try:
    yield
  finally:
    LOGGER.setLevel(level)
