"""The environment TensorFlow reads as it starts, set before it starts.

TF reads its log level as it loads, and TF_XLA_FLAGS and XLA_FLAGS once, at
its first function (TF 2.21): set later, they change nothing. Everything
here imports no TensorFlow, so the CLI sets it while it reads its flags.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
from collections.abc import Iterator

from xla_mnist.runtime import streams

# TF's persistent compilation cache, and its mode that stores nothing.
CACHE_DIRECTORY = '--tf_xla_persistent_cache_directory'
CACHE_READ_ONLY = '--tf_xla_persistent_cache_read_only'


def quiet_by_default() -> None:
  """Hides TF's C++ log unless the user set TF_CPP_MIN_LOG_LEVEL: a failed
  CUDA probe on a CPU machine, and on an XLA cache hit an error from TF
  reading the binary entry as text first, nothing to act on."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


def verbose() -> bool:
  """Whether the user asked to see TF's own log (TF_CPP_MIN_LOG_LEVEL < 3)."""
  return os.environ.get('TF_CPP_MIN_LOG_LEVEL', '0') not in ('3', '4')


@contextlib.contextmanager
def importing_tensorflow() -> Iterator[None]:
  """Wraps a CLI's import of TF: checked first (`check_user_flags`: a flag
  TF cannot take would end the process inside it, past any Python handler),
  quiet, without matplotlib; then `gc.freeze()` keeps TF's and Keras's
  objects from Python's last collection at exit (docs/speed.md)."""
  check_user_flags()
  with _native_start_up_hidden(), _matplotlib_unimportable():
    yield
  gc.freeze()


@contextlib.contextmanager
def library_importing_tensorflow() -> Iterator[None]:
  """Wraps the library's own import of TF (`trainer`'s) as a command's,
  for a notebook that imports `trainer` first: quiet by default, start-up
  lines off stderr; TF already imported is the user's, left alone. An
  import starts no process: the call that trains checks the user's flags."""
  if 'tensorflow' in sys.modules:
    yield
    return
  quiet_by_default()
  with _native_start_up_hidden():
    yield


@contextlib.contextmanager
def _native_start_up_hidden() -> Iterator[None]:
  """Keeps what TF's C++ libraries print as they load off stderr, shown if
  the import fails; nothing hidden when `verbose()`. TF 2.21 prints six lines
  whatever TF_CPP_MIN_LOG_LEVEL says: absl's "All log messages before
  absl::InitializeLog()", the oneDNN notice and the failed CUDA probe."""
  if verbose():
    yield
    return
  with tempfile.TemporaryFile() as log:
    failed = True
    try:
      with streams.quiet_stderr(into=log):
        yield
      failed = False
    finally:
      if failed:
        log.seek(0)
        sys.stderr.write(log.read().decode(errors='replace'))


def autocluster(everywhere: bool = True) -> None:
  """The environment half of `--jit=auto` (see `process.configure_jit`): it
  clusters on the CPU too, where `tf.config.optimizer.set_jit` turns it on
  or, `everywhere`, in every function (not for the benchmark, which
  clusters some functions only)."""
  cpu = '--tf_xla_cpu_global_jit'
  add_flags('TF_XLA_FLAGS', f'--tf_xla_auto_jit=2 {cpu}' if everywhere else cpu)


def cpu_clustering(on: bool) -> None:
  """Turns `autocluster`'s CPU flag on or off once TF has read TF_XLA_FLAGS
  (at its first function), for a process that trains several runs.
  Private API: TF 2.21 has no public setter for it."""
  from tensorflow.python.client import pywrap_tf_session  # noqa: PLC0415

  pywrap_tf_session.TF_SetTfXlaCpuGlobalJit(on)


def cache_compilations(directory: str, read_only: bool = False) -> None:
  """Keeps XLA's compiled programs in `directory` (TF's persistent cache),
  for later runs to load; `read_only`: loads, stores nothing."""
  add_flags('TF_XLA_FLAGS', f'{CACHE_DIRECTORY}={directory}')
  if read_only:
    add_flags('TF_XLA_FLAGS', f'{CACHE_READ_ONLY}=true')


def cache_directory() -> str:
  """The XLA cache this process's TF uses, as `cache_compilations` (or the
  user's TF_XLA_FLAGS) set it; '' for none."""
  found = ''
  for flag in os.environ.get('TF_XLA_FLAGS', '').split():
    name, _, value = flag.partition('=')
    if name == CACHE_DIRECTORY:
      found = value
  return found


def dumping_to(outdir: str) -> bool:
  """Whether `cluster_dumps.request(outdir)` set this process's dumps: the
  same folder, named either way (`cluster_dumps` not loaded: none set)."""
  dumps = sys.modules.get('xla_mnist.runtime.cluster_dumps')
  return dumps is not None and dumps.dumping_to(outdir)


def dumps_requested() -> bool:
  """Whether XLA_FLAGS asks XLA to dump what it compiles (--xla_dump_to):
  then the run skips the cache, whose programs are never compiled."""
  return '--xla_dump_to' in os.environ.get('XLA_FLAGS', '')


def add_flags(variable: str, new: str) -> None:
  """Adds `new` to the flags in environment variable `variable`, once."""
  flags = os.environ.get(variable, '')
  if new not in flags:
    os.environ[variable] = f'{flags} {new}'.strip()


@contextlib.contextmanager
def _matplotlib_unimportable() -> Iterator[None]:
  """Makes `import matplotlib` fail, for a process that never plots: Keras
  imports its pyplot as it loads, if installed, for two plotting helpers."""
  if 'matplotlib' in sys.modules:
    yield
    return
  sys.modules['matplotlib'] = None  # `import` raises ImportError.
  try:
    yield
  finally:
    del sys.modules['matplotlib']


# The variables of flags TF parses, as the user's environment set them when
# this module was first imported: before xla_mnist added any of its own.
FLAG_VARIABLES = ('XLA_FLAGS', 'TF_XLA_FLAGS')
_USER_FLAGS = {name: os.environ.get(name) for name in FLAG_VARIABLES}


def check_user_flags() -> None:
  """Raises UsageError when TF cannot take the user's XLA_FLAGS or
  TF_XLA_FLAGS (`user_flags.check`, in a child process); loads nothing when
  the user set neither."""
  if any(v is not None for v in _USER_FLAGS.values()):
    from xla_mnist.runtime import user_flags  # noqa: PLC0415 - set ones only.

    user_flags.check(_USER_FLAGS)
