"""A `--jit=auto` run's cluster dumps and their folders, loaded only for a
run that asks for them (`request`).

TF's graphs with each node's cluster go to `outdir/graphs`, XLA's HLO of
each cluster (and its LLVM IR) to `outdir/xla`: first into a folder of this
process's own (`stage`), which `publish` puts in their place once the run
has trained (cluster names restart at 0 in each process: the sets must not
mix). A run that does not train (refused, found finished, stopped) leaves
the earlier dumps as they were; its own go at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil

from xla_mnist.runtime import env

GRAPH_DIR = 'graphs'
XLA_DIR = 'xla'
_STAGING = '.dumping-'  # + the process id: a run's dumps until it has trained.
_DUMPS: tuple[str, str] | None = None  # (outdir, staging) of `stage`.


def request(outdir: str) -> None:
  """Makes a `--jit=auto` run dump the clusters it compiles into `outdir`:
  TF's graphs, marked, and XLA's HLO of each cluster, staged until the run
  has trained."""
  staging = stage(outdir)
  env.add_flags('TF_XLA_FLAGS', '--tf_xla_clustering_debug')
  os.environ['TF_DUMP_GRAPH_PREFIX'] = os.path.join(staging, GRAPH_DIR)
  xla_dir = os.path.join(staging, XLA_DIR)
  env.add_flags('XLA_FLAGS', f'--xla_dump_to={xla_dir} --xla_dump_hlo_as_text')


def stage(outdir: str) -> str:
  """The folder of this process's own that holds the dumps for `outdir`
  until `publish`, removed at exit. Absolute, as `outdir` is kept: TF reads
  its flags relative to the directory it compiles in."""
  global _DUMPS
  outdir = os.path.abspath(outdir)
  staging = os.path.join(outdir, f'{_STAGING}{os.getpid()}')
  _DUMPS = (outdir, staging)
  atexit.register(shutil.rmtree, staging, ignore_errors=True)
  return staging


def dumping_to(outdir: str) -> bool:
  """Whether this process's dumps go to `outdir`, as `stage(outdir)` set
  them: the same folder, named either way."""
  return _DUMPS is not None and _DUMPS[0] == os.path.abspath(outdir)


def publish() -> None:
  """Replaces the earlier run's cluster dumps with this run's, whole, and
  removes what killed runs left staged; nothing without `stage`."""
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
