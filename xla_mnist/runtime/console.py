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
  notebook's cell, a test's capture), as any stdout takes it."""

  # logging's own attribute, read at each line and never set.
  stream = property(lambda _: sys.stdout, lambda *_: None)

  def format(self, record: logging.LogRecord) -> str:
    return streams.printable(super().format(record))

  def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802
    """A stdout that cannot be written (closed, full, a pipe whose reader
    went away) stops the run after a save (`streams`), rather than becoming
    logging's traceback at every line."""
    error = sys.exc_info()[1]
    if sys.stdout is None or isinstance(error, (OSError, ValueError)):
      streams.lost('stdout', error)  # ValueError: a closed file object.
    else:
      super().handleError(record)  # A bug of the record: to see whole.


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
