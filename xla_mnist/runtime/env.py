"""The environment TensorFlow reads as it starts, set before it starts.

TF reads its log level, TF_XLA_FLAGS and XLA_FLAGS once, early: set after
TF's import, the auto-clustering flags were ignored (TF 2.21). Everything
here imports no TensorFlow, so the CLI sets it while it reads its flags.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator

from xla_mnist.runtime import errors, streams
from xla_mnist.runtime.errors import UserError

# Lets auto-clustering cluster on the CPU, where TF's `set_jit` turns it on.
CPU_CLUSTERING = '--tf_xla_cpu_global_jit'
# Turns it on for every function of the process.
EVERYWHERE = '--tf_xla_auto_jit=2'
# Where `dump_clusters` sends TF's marked graphs and XLA's cluster modules.
GRAPH_DIR = 'graphs'
XLA_DIR = 'xla'
# TF's persistent compilation cache, and its mode that stores nothing.
CACHE_DIRECTORY = '--tf_xla_persistent_cache_directory'
CACHE_READ_ONLY = '--tf_xla_persistent_cache_read_only'


def quiet_by_default() -> None:
  """Hides TF's C++ log unless the user set TF_CPP_MIN_LOG_LEVEL.

  On a CPU machine it reports a failed CUDA probe, and on an XLA cache hit an
  error from TF reading the binary entry as text first: nothing to act on.
  """
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


def verbose() -> bool:
  """Whether the user asked to see TF's own log (TF_CPP_MIN_LOG_LEVEL < 3)."""
  return os.environ.get('TF_CPP_MIN_LOG_LEVEL', '0') not in ('3', '4')


@contextlib.contextmanager
def importing_tensorflow() -> Iterator[None]:
  """Wraps a CLI's import of TF: checked, quiet, without matplotlib.

  First `check_user_flags`: a flag TF cannot take would end the process
  inside the import, past any Python handler.

  After the import, `gc.freeze()` puts the objects of TF and Keras beyond
  the garbage collector: Python's last collection at exit walked them all,
  most of a second of every run (docs/speed.md), and the run's own
  collections skip them too. They live as long as the process anyway; what
  the import left as garbage stays too, once.
  """
  check_user_flags()
  with _native_start_up_hidden(), _matplotlib_unimportable():
    yield
  gc.freeze()


@contextlib.contextmanager
def library_importing_tensorflow() -> Iterator[None]:
  """Wraps the library's own import of TF (`trainer`'s) as a command's.

  For a notebook or script that imports `trainer` before TF: TF's C++ log
  hidden unless the user set TF_CPP_MIN_LOG_LEVEL, and its start-up lines
  kept off stderr (shown if the import fails). TF already imported:
  nothing, it is the user's. The user's flags are checked by the call that
  trains (`trainer.train_and_evaluate`), before anything compiles: an
  import starts no process.
  """
  if 'tensorflow' in sys.modules:
    yield
    return
  quiet_by_default()
  with _native_start_up_hidden():
    yield


@contextlib.contextmanager
def _native_start_up_hidden() -> Iterator[None]:
  """Keeps what TF's C++ libraries print while they load off stderr.

  TF 2.21 prints six lines as its libraries load, whatever
  TF_CPP_MIN_LOG_LEVEL says: absl's "All log messages before
  absl::InitializeLog()", the oneDNN notice and the failed CUDA probe, once
  per library. They go to a temporary file, shown again if the import fails
  or `verbose()`.
  """
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
  """The environment half of `--jit=auto` (see `step.configure_jit`).

  Not `everywhere`: only where `tf.config.optimizer.set_jit` turns it on, for
  a process that clusters some functions only (the benchmark).
  """
  _add(
    'TF_XLA_FLAGS',
    f'{EVERYWHERE} {CPU_CLUSTERING}' if everywhere else CPU_CLUSTERING,
  )


def cpu_clustering(on: bool) -> None:
  """Turns the CPU half of auto-clustering (`CPU_CLUSTERING`) on or off in a
  process whose TF has started, which reads TF_XLA_FLAGS once: for a process
  that trains several runs (a notebook's).

  TF has no public setter for it at run time: this is its C API's.
  """
  from tensorflow.python.client import pywrap_tf_session  # noqa: PLC0415

  pywrap_tf_session.TF_SetTfXlaCpuGlobalJit(on)


def cache_compilations(directory: str, read_only: bool = False) -> None:
  """Keeps XLA's compiled programs in `directory` for later processes.

  TF's persistent compilation cache: a later run of the same program loads
  it instead of compiling it. `read_only`: loads, stores nothing. TF reads
  both once per process, at its first compile: nothing changes them later.
  """
  _add('TF_XLA_FLAGS', f'{CACHE_DIRECTORY}={directory}')
  if read_only:
    _add('TF_XLA_FLAGS', f'{CACHE_READ_ONLY}=true')


def cache_directory() -> str:
  """The XLA cache this process's TF uses, as `cache_compilations` (or the
  user's TF_XLA_FLAGS) set it; '' for none."""
  found = ''
  for flag in os.environ.get('TF_XLA_FLAGS', '').split():
    name, _, value = flag.partition('=')
    if name == CACHE_DIRECTORY:
      found = value
  return found


def dump_clusters(outdir: str) -> None:
  """Makes a `--jit=auto` run dump the clusters it compiles into `outdir`.

  TF graphs with each node's cluster go to `outdir/graphs`, XLA's HLO of each
  cluster (and its LLVM IR) to `outdir/xla`: first into a folder of this
  process's own, which `publish_dumps` puts in their place once the run has
  trained (cluster names restart at 0 in each process: the sets must not
  mix). A run that does not train (refused, found finished, stopped) leaves
  the earlier dumps as they were; its own go at exit. Kept absolute: TF
  reads the flags relative to the directory it compiles in, and `dumping_to`
  takes the workdir as the caller names it, relative or not.
  """
  global _DUMPS
  outdir = os.path.abspath(outdir)
  staging = os.path.join(outdir, f'{_STAGING}{os.getpid()}')
  _DUMPS = (outdir, staging)
  atexit.register(shutil.rmtree, staging, ignore_errors=True)
  _add('TF_XLA_FLAGS', '--tf_xla_clustering_debug')
  os.environ['TF_DUMP_GRAPH_PREFIX'] = os.path.join(staging, GRAPH_DIR)
  xla_dir = os.path.join(staging, XLA_DIR)
  _add('XLA_FLAGS', f'--xla_dump_to={xla_dir} --xla_dump_hlo_as_text')


_STAGING = '.dumping-'  # + the process id: a run's dumps until it has trained.
_DUMPS: tuple[str, str] | None = None  # (outdir, staging) of `dump_clusters`.


def publish_dumps() -> None:
  """Replaces the earlier run's cluster dumps with this run's, whole, and
  removes what killed runs left staged; nothing without `dump_clusters`."""
  if _DUMPS is None:
    return
  outdir, staging = _DUMPS
  for folder in (GRAPH_DIR, XLA_DIR):
    shutil.rmtree(os.path.join(outdir, folder), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
      os.rename(os.path.join(staging, folder), os.path.join(outdir, folder))
  for name in os.listdir(outdir):
    pid = name.removeprefix(_STAGING)
    if name.startswith(_STAGING) and pid.isdecimal() and not _alive(int(pid)):
      shutil.rmtree(os.path.join(outdir, name), ignore_errors=True)
  shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:  # Another user's: alive.
    return True
  return True


def dumping_to(outdir: str) -> bool:
  """Whether this process's environment dumps clusters into `outdir`, as
  `dump_clusters(outdir)` sets it: the same folder, named either way."""
  return _DUMPS is not None and _DUMPS[0] == os.path.abspath(outdir)


def dumps_requested() -> bool:
  """Whether XLA_FLAGS asks XLA to dump what it compiles (--xla_dump_to).

  A program loaded from the persistent cache is never compiled, so it dumps
  nothing: such a run must skip the cache.
  """
  return '--xla_dump_to' in os.environ.get('XLA_FLAGS', '')


def check_port_free(port: int) -> None:
  """Raises UserError when TF's profiler server could not listen on `port`.

  TF's server only logs a failed bind (TF 2.21) and the run would go on
  without it; 0 is no server.
  """
  if not port:
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


def _add(variable: str, new: str) -> None:
  flags = os.environ.get(variable, '')
  if new not in flags:
    os.environ[variable] = f'{flags} {new}'.strip()


@contextlib.contextmanager
def _matplotlib_unimportable() -> Iterator[None]:
  """Makes `import matplotlib` fail, for a process that never plots.

  Keras imports matplotlib's pyplot as it loads, if it is installed, for two
  plotting helpers: a large import that training does not use.
  """
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
