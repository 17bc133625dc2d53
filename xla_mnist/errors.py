"""Errors that end a run with a one-line message instead of a traceback.

`train.main` catches `UserError`, prints `error: <message>` and exits with
`exit_code`: 2 for usage errors (bad flags or config), 1 for run-time
failures (bad data, unwritable workdir, a workdir in use), following the
usual CLI convention.
"""


class UserError(Exception):
  """A failure the user can fix; its message names the problem and the fix."""

  exit_code = 1


class UsageError(UserError):
  """A bad flag or config value."""

  exit_code = 2


class DataError(UserError):
  """Missing, corrupt or unreachable data."""


class Stopped(Exception):  # noqa: N818 - not an error: a clean, saved stop.
  """The run ends early with its state saved: a signal, or nothing to do.

  Stopped by a signal, the exit code is 128 + its number, as a shell reports
  a process the signal killed: the work is saved but not finished, and a
  scheduler or `train && next` must see that.
  """

  def __init__(self, message: str, signum: int = 0):
    super().__init__(message)
    self.exit_code = 128 + signum if signum else 0
