"""The C++ side of `classifier`: the toolchain, XLA's runtime, the link.

TF's wheel ships tfcompile's Python binding and the sources of the small
runtime that AOT-compiled functions call into (`xla_aot_runtime_src`), but
not a built runtime: it is built here with cmake, once per TF version, into
a cache folder that later exports reuse. Nothing here imports TensorFlow at
module level, so that the CLI checks its flags first.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from xla_mnist.runtime import env, errors, layout
from xla_mnist.runtime.errors import UsageError, UserError

LOGGER = logging.getLogger(__name__)

RUNTIME_LIB = 'libtf_xla_runtime.a'
RUNTIME_ENV = 'XLA_MNIST_AOT_RUNTIME'
# TF's compile flags for code against its headers (tf.sysconfig's, written
# out to need no TF import); the C++11 ABI flag must match the wheel's.
CXX_FLAGS = (
  '-std=c++17',
  '-D_GLIBCXX_USE_CXX11_ABI=1',
  '-DEIGEN_MAX_ALIGN_BYTES=64',
)
CLASSIFY_SOURCE = os.path.join(os.path.dirname(__file__), 'classify.cc')
# (signature key, C++ class, output file prefix): the fixed batch and batch 1,
# whose headers classify.cc includes by these names.
SIGNATURES = (
  ('serving_default', 'ClassifierBatch', 'classifier_batch'),
  ('batch_one', 'ClassifierOne', 'classifier_one'),
)
# x86-64 psABI levels, which LLVM knows as CPU names; a name LLVM does not
# know aborts tfcompile (the process), so the export takes these only.
TARGET_CPUS = ('x86-64', 'x86-64-v2', 'x86-64-v3', 'x86-64-v4')
INSTALL_HINT = (
  "run 'make toolchain' (as root it runs apt-get install g++ cmake"
  ' zlib1g-dev), or install them yourself'
)
# tfcompile's words for an op without an XLA kernel (a user's model's).
UNSUPPORTED_OP = re.compile(r"No registered '(\w+)' OpKernel for XLA_")


def tf_dir() -> str:
  """The installed `tensorflow` package's folder, found without importing."""
  spec = importlib.util.find_spec('tensorflow')
  if spec is None or not spec.submodule_search_locations:
    raise UserError('TensorFlow is not installed: run make setup')
  return spec.submodule_search_locations[0]


def default_runtime_dir() -> str:
  """$XLA_MNIST_AOT_RUNTIME, else the user's cache, one folder per TF."""
  if os.environ.get(RUNTIME_ENV):
    return os.environ[RUNTIME_ENV]
  version = importlib.metadata.version('tensorflow')
  return layout.user_cache('xla_mnist', 'aot-runtime', version)


def check_toolchain() -> None:
  """Fails in one line when g++, cmake or zlib's header is missing."""
  missing = [tool for tool in ('g++', 'cmake') if not shutil.which(tool)]
  if missing:
    raise UserError(f'{" and ".join(missing)} not found: {INSTALL_HINT}')
  probe = subprocess.run(
    ['g++', '-E', '-x', 'c++', '-'],
    input='#include <zlib.h>\n',
    capture_output=True,
    text=True,
  )
  if probe.returncode:
    raise UserError(f"zlib's header (zlib.h) not found: {INSTALL_HINT}")


def _run(command: list[str], log_path: str, what: str) -> None:
  """Runs a build command, its output into `log_path`; fails in one line."""
  with open(log_path, 'a') as log:
    log.write(f'$ {" ".join(command)}\n')
    log.flush()
    done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
  if done.returncode:
    with open(log_path) as log:
      errors = [line.strip() for line in log if 'error' in line]
    first = errors[0] if errors else f'exit code {done.returncode}'
    raise UserError(f'{what} failed ({first}): see {log_path}')


def temp_dir_beside(path: str, prefix: str, arg: str) -> str:
  """A new temporary folder beside `path`, to be renamed into its place.

  On the same filesystem, so the rename is atomic; UserError naming the
  argument `arg` when the parent cannot be written.
  """
  parent = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=parent)
  except OSError as e:
    raise UserError(
      f'{parent} cannot be written ({e.strerror}): pass a writable'
      f' {errors.arg(arg)}'
    ) from None


def ensure_runtime(runtime_dir: str) -> str:
  """Returns the runtime archive in `runtime_dir`, building it if absent.

  The build happens in a sibling temporary folder renamed into place when
  complete, so a concurrent export either waits for nothing or builds its own
  copy and keeps the one that got there first.
  """
  archive = os.path.join(runtime_dir, RUNTIME_LIB)
  if os.path.isfile(archive):
    LOGGER.info(f'runtime: reusing {archive}')
    return archive
  work = temp_dir_beside(runtime_dir, '.building-', 'runtime_dir')
  LOGGER.info(
    f"runtime: building XLA's AOT runtime once into {runtime_dir}"
    ' (minutes on 2 cores; later exports reuse it)'
  )
  start = time.perf_counter()
  result = _build_runtime(work)
  minutes = (time.perf_counter() - start) / 60
  with open(os.path.join(result, 'build.json'), 'w') as f:
    info = {
      'tensorflow': importlib.metadata.version('tensorflow'),
      'cxx_flags': CXX_FLAGS,
      'minutes': round(minutes, 1),
    }
    json.dump(info, f, indent=2)
  try:
    os.rename(result, runtime_dir)
  except OSError:
    if not os.path.isfile(archive):  # Not a concurrent build's: a real error.
      raise
  shutil.rmtree(work, ignore_errors=True)
  LOGGER.info(f'runtime: built in {minutes:.1f} min')
  return archive


def _build_runtime(work: str) -> str:
  """Builds the runtime from TF's sources in `work`; returns its folder."""
  log = os.path.join(work, 'build.log')
  build = os.path.join(work, 'build')
  configure = [
    'cmake',
    '-S',
    os.path.join(tf_dir(), 'xla_aot_runtime_src'),
    '-B',
    build,
    '-DCMAKE_BUILD_TYPE=Release',
    f'-DCMAKE_CXX_FLAGS={" ".join(CXX_FLAGS)}',
  ]
  _run(configure, log, 'configuring the runtime with cmake')
  _run(['cmake', '--build', build, '-j2'], log, 'building the runtime')
  result = os.path.join(work, 'runtime')
  os.makedirs(result)
  shutil.move(os.path.join(build, RUNTIME_LIB), result)
  return result


# `aot_compile`'s child: the parent's xla_mnist (its folder is argv[1]), then
# tfcompile.
_CHILD = (
  'import sys\n'
  'sys.path.insert(0, sys.argv[1])\n'
  'from xla_mnist.export import build\n'
  'build.tfcompile_here(*sys.argv[2:])\n'
)


def aot_compile(saved_model: str, out_dir: str, target_cpu: str) -> None:
  """tfcompile on both serving signatures, in a child process.

  tfcompile needs an XLA fusion off, which TF's API asks for by adding to
  XLA_FLAGS; XLA reads them once per process, at its first compile, so a
  process that has compiled already (a notebook that trained with jit on)
  would keep the fusion and tfcompile fail ("Unsupported thunk type:
  ynn-fusion"). A fresh interpreter reads them in time, whatever this
  process did, and this process's XLA_FLAGS stay as they were. The child
  reports what failed (`tfcompile_here`); the message is worded here, where
  `errors.arg` knows whether a command line called.

  Raises:
    UsageError: the model holds ops XLA cannot compile.
    UserError: tfcompile failed, or its process ended without saying why.
    OSError: a file TF could not read or write (the caller names the folder).
  """
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  child = [sys.executable, '-c', _CHILD, os.path.abspath(root)]
  done = subprocess.run(
    [*child, saved_model, out_dir, target_cpu],
    stdin=subprocess.DEVNULL,
    stdout=subprocess.PIPE,
    # TF's own log passes through when the user asked for it (`env.verbose`).
    stderr=None if env.verbose() else subprocess.PIPE,
    text=True,
    errors='replace',
    check=False,
  )
  if done.returncode == 0:
    return
  try:
    failure = json.loads(done.stdout.strip().rpartition('\n')[2])
  except ValueError:
    failure = None
  match failure:
    case ['ops', named]:
      raise UsageError(
        f'the model holds ops XLA cannot compile ({named}): classify is all'
        ' XLA, so this model cannot be exported; build it from ops XLA'
        f' compiles (training it with {errors.field("jit", "off")} or'
        ' auto is unaffected)'
      )
    case ['tfcompile', key, said]:
      raise UserError(
        f'tfcompile failed on the {key} signature ({said}): if that is a full'
        ' disk, free space there or pass another'
        f' {errors.arg("out_dir", "DIR")}'
      )
    case ['io', said]:
      raise OSError(said)
  # Killed, or aborted past Python (LLVM on a CPU it does not know).
  said = (done.stderr or '').strip().rpartition('\n')[2]
  raise UserError(
    f'tfcompile ended with exit code {done.returncode}'
    + (f' ({said})' if said else '')
    + ': run the export again with TF_CPP_MIN_LOG_LEVEL=0 to see its log'
  )


def tfcompile_here(saved_model: str, out_dir: str, target_cpu: str) -> None:
  """`aot_compile`'s child: tfcompile, through TF's Python API, on both
  serving signatures in this fresh interpreter.

  A failure it can name ends it with exit code 1 and, as stdout's last
  line, JSON for the parent to word: `["ops", names]` for ops XLA has no
  kernel for (a user's model's), `["tfcompile", key, message]` for
  tfcompile's C++ errors (a full disk's "No space left on device" among
  them), `["io", message]` for a file TF's Python side failed to read or write.
  """
  import tensorflow as tf
  from tensorflow.python.tools import saved_model_aot_compile, saved_model_utils

  for key, cpp_class, prefix in SIGNATURES:
    try:
      saved_model_aot_compile.aot_compile_cpu_meta_graph_def(
        checkpoint_path=os.path.join(saved_model, 'variables', 'variables'),
        meta_graph_def=saved_model_utils.get_meta_graph_def(
          saved_model, 'serve'
        ),
        output_prefix=os.path.join(out_dir, prefix),
        signature_def_key=key,
        cpp_class=cpp_class,
        target_triple='x86_64-pc-linux',
        target_cpu=target_cpu,
      )
      continue
    except ValueError as e:
      ops = UNSUPPORTED_OP.findall(str(e))
      if not ops:
        raise
      failure = ['ops', ', '.join(dict.fromkeys(ops))]
    except RuntimeError as e:
      failure = ['tfcompile', key, str(e)]
    except (OSError, tf.errors.OpError) as e:
      failure = ['io', errors.first_line(e)]
    sys.stdout.write(json.dumps(failure) + '\n')  # To the parent, not a user.
    sys.exit(1)


def link(out_dir: str, archive: str, image_shape: tuple[int, ...]) -> str:
  """Compiles classify.cc against the generated headers for images of
  `image_shape` (H, W, C: classify reads IDX files of that shape, its class
  count is the compiled logits'); returns its path."""
  height, width, channels = image_shape
  tf = tf_dir()
  objects = [
    os.path.join(out_dir, f'{prefix}{suffix}.o')
    for _, _, prefix in SIGNATURES
    for suffix in ('', '_metadata', '_constants')
  ]
  binary = os.path.join(out_dir, 'classify')
  command = [
    'g++',
    *CXX_FLAGS,
    '-O2',
    f'-DCLASSIFY_HEIGHT={height}',
    f'-DCLASSIFY_WIDTH={width}',
    f'-DCLASSIFY_CHANNELS={channels}',
    '-isystem',
    os.path.join(tf, 'include'),
    '-I',
    out_dir,
    CLASSIFY_SOURCE,
    *objects,
    archive,
    # Before TF's library, which exports a zlib of its own.
    '-lz',
    # The runtime's abseil symbols (Mutex, logging, hash tables).
    f'-L{tf}',
    '-l:libtensorflow_framework.so.2',
    f'-Wl,-rpath,{tf}',
    '-lpthread',
    '-o',
    binary + '.tmp',
  ]
  _run(command, os.path.join(out_dir, 'link.log'), 'linking classify')
  os.rename(binary + '.tmp', binary)
  return binary
