"""The environment TensorFlow reads as it starts, set before it starts.

TF reads its log level, TF_XLA_FLAGS and XLA_FLAGS once, early: set after
TF's import, the auto-clustering flags were ignored (TF 2.21). Everything
here imports no TensorFlow, so the CLI sets it while it reads its flags.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from xla_mnist.runtime import errors, streams
from xla_mnist.runtime.errors import UsageError, UserError

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

  For a notebook or script that imports `trainer` before TF: the user's
  flags checked (`check_user_flags`), TF's C++ log hidden unless the user set
  TF_CPP_MIN_LOG_LEVEL, and its start-up lines kept off stderr (shown if
  the import fails). TF already imported: nothing, it is the user's.
  """
  if 'tensorflow' in sys.modules:
    yield
    return
  quiet_by_default()
  check_user_flags()
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
  that trains several runs (a notebook's). TF's C API setter
  (`TF_SetTfXlaCpuGlobalJit`) is its only way; TF has no public one."""
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
# Compiles one function: TF parses both variables on the way, and a flag it
# cannot take ends it with a fatal (F) line and exit 1, which no Python
# handler can catch (TF 2.21).
_PROBE = (
  'import tensorflow as tf\n'
  'tf.function(lambda x: x + 1, jit_compile=True)(tf.constant(1.0))\n'
)
_CHECKED = False


def check_user_flags() -> None:
  """Raises UsageError when TF cannot take the user's XLA_FLAGS or TF_XLA_FLAGS.

  Checked once per process, and only when the user set one of them: a child
  process imports TF and compiles with the user's values, and its fatal line
  becomes the error. A passing verdict is remembered per TF version and
  values in the user's cache folder (`verdicts_path`), so a user who sets
  them pays the check (about 3 s) once; nobody else pays anything.
  """
  global _CHECKED
  given = {k: v for k, v in _USER_FLAGS.items() if v is not None}
  if _CHECKED or not given:
    return
  key = _verdict_key(given)
  if key in _verdicts():
    _CHECKED = True
    return
  verdict = _probe(given)
  if verdict is not None:
    raise UsageError(verdict)
  _CHECKED = True
  _remember(key)


def verdicts_path() -> str:
  """Where passing verdicts of `check_user_flags` are kept."""
  cache = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
  return os.path.join(cache, 'xla_mnist-flags-checked.json')


def _verdict_key(given: dict[str, str]) -> str:
  try:
    version = importlib.metadata.version('tensorflow')
  except importlib.metadata.PackageNotFoundError:
    version = '?'
  text = json.dumps([version, sys.executable, sorted(given.items())])
  return hashlib.sha256(text.encode()).hexdigest()


def _verdicts() -> list[str]:
  try:
    with open(verdicts_path(), encoding='utf-8') as f:
      verdicts = json.load(f)
  except (OSError, ValueError):
    return []  # None yet, or unreadable: checked again.
  if not isinstance(verdicts, list):
    return []
  return [v for v in verdicts if isinstance(v, str)]


def _remember(key: str) -> None:
  """Adds `key` to the verdicts, atomically; a folder that cannot take it
  only means checking again next time."""
  path = verdicts_path()
  kept = [v for v in _verdicts() if v != key][-63:] + [key]
  with contextlib.suppress(OSError):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.')
    try:
      with os.fdopen(fd, 'w', encoding='utf-8') as f:
        json.dump(kept, f)
      os.replace(temporary, path)
    except OSError:
      os.unlink(temporary)


def _probe(given: dict[str, str]) -> str | None:
  """What is wrong with the user's flags, from a child that compiles with
  them; None when it compiled, or failed for a reason of its own (the
  process's own import then shows it)."""
  child = {k: v for k, v in os.environ.items() if k not in FLAG_VARIABLES}
  child['TF_CPP_MIN_LOG_LEVEL'] = '3'  # Fatal lines only.
  try:
    # The child's dumps go to a scratch folder: the user's is for the run.
    with tempfile.TemporaryDirectory() as scratch:
      child.update(
        (k, _DUMP_TO.sub(lambda m: m.group(1) + scratch, v))
        for k, v in given.items()
      )
      done = subprocess.run(
        [sys.executable, '-c', _PROBE],
        env=child,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors='replace',
        timeout=600,
        check=False,
      )
  except (OSError, subprocess.TimeoutExpired):
    return None
  if done.returncode == 0:
    return None
  return _describe_fatal(done.stderr, given)


_FATAL = re.compile(r'^F\d{4} [^\]]*\] (.*)$')
_DUMP_TO = re.compile(r'(--xla_dump_to=)\S*')


def _describe_fatal(stderr: str, given: dict[str, str]) -> str | None:
  """TF's fatal flag line in `stderr` as the one error line, or None."""
  lines = stderr.splitlines()
  for i, line in enumerate(lines):
    match = _FATAL.match(line)
    if not match or 'parse_flags_from_env' not in line:
      continue
    said = match.group(1)
    unknown = re.match(r'Unknown flag in (\w+): (.*)', said)
    if unknown:
      name, flag = unknown.groups()
      return f'{name}: TF has no flag {flag}: {_fix(name)}'
    if 'Could not open file' in said:
      name = next((n for n in given if f'"{n}"' in said), _names(given))
      value = given.get(name, '')
      return (
        f'{name}={value!r}: not flags (they start with --) nor a file of'
        f' flags TF can read: {_fix(name)}'
      )
    usage = next((s for s in lines[i + 1 :] if s.startswith('usage: ')), '')
    flag = usage.removeprefix('usage: ').strip()
    if flag:
      name = next((n for n in given if flag in given[n]), _names(given))
      return f'{name}: TF cannot parse {flag} (a bad value): {_fix(name)}'
    return f'{_names(given)}: TF refuses them ({said}): {_fix(_names(given))}'
  return None


def _names(given: dict[str, str]) -> str:
  return ' or '.join(given)


def _fix(name: str) -> str:
  return f'fix or unset {name} (TF would stop at its first compile)'
