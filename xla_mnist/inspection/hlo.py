"""What XLA made of the step: HLO dumps and fusion counts.

With `--jit=on` the step is one XLA computation, and TF hands out its HLO
before and after XLA's optimizations. With `--jit=auto` TF picks the clusters
itself at run time; only process-wide dump flags, set before TF runs any
function, show which ops went into which cluster and what XLA made of each.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
from collections.abc import Callable

import ml_collections
from google.protobuf import text_format

from xla_mnist.runtime import cluster_dumps, errors, layout
from xla_mnist.runtime.errors import UserError
from xla_mnist.workdir import files

# `fn.experimental_get_compiler_ir` stage -> file written by `dump`.
STAGES = {
  'hlo': 'step.hlo.txt',
  'optimized_hlo': 'step.optimized_hlo.txt',
  'optimized_hlo_dot': 'step.optimized_hlo.dot',
}
HLO_DIR, CLUSTER_DIR = layout.HLO_DIR, layout.CLUSTER_DIR

# `%name (params) -> shape {` or `ENTRY %name ...`: a computation's header.
_COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$')
# `%name = shape fusion(operands), kind=kLoop, calls=%fused_computation`.
_FUSION = re.compile(
  r'^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=.*?\sfusion\(.*calls=%?([\w.\-]+)'
)
# `module_0003.cluster_1__XlaCompiledKernel_true__...6.before_optimizations.txt`
_CLUSTER_HLO = re.compile(
  r'^module_\d+\.(cluster_\d+)_.*'
  r'\.(before_optimizations|\w+_after_optimizations)\.txt$'
)


@dataclasses.dataclass(frozen=True)
class HloReport:
  fusions: int  # Fusion instructions in the optimized module.
  files: list[str]

  def lines(self) -> list[str]:
    return [
      f'XLA HLO: {self.fusions} fusions in the optimized step,'
      f' {", ".join(self.files)}'
    ]


@dataclasses.dataclass(frozen=True)
class Cluster:
  """One XLA cluster that auto-clustering cut out of a TF graph."""

  name: str  # `cluster_<n>`, as in the HLO module and the trace's `_XlaRun`.
  op_types: dict[str, int]  # TF op type -> nodes of that type in the cluster.
  hlo_files: list[str]  # XLA's module before and after its optimizations.
  fusions: int  # Fusion instructions in the optimized module.

  @property
  def ops(self) -> int:
    return sum(self.op_types.values())


@dataclasses.dataclass(frozen=True)
class ClusterReport:
  clusters: list[Cluster]

  def lines(self) -> list[str]:
    lines = [f'auto-clustering: {len(self.clusters)} XLA clusters']
    for c in self.clusters:
      types = ', '.join(
        f'{n} {t}' for t, n in sorted(c.op_types.items(), key=lambda i: -i[1])
      )
      lines.append(f'  {c.name}: {c.ops} TF ops ({types}), {c.fusions} fusions')
      lines.extend(f'    {path}' for path in c.hlo_files)
    return lines


def dump(fn: Callable, args: tuple, outdir: str) -> HloReport:
  """Writes the HLO of `fn(*args)`, a `tf.function(jit_compile=True)`.

  TF builds the module for these argument shapes without running it: the
  step's variables and trace count are left as they were.
  """
  try:
    compiler_ir = fn.experimental_get_compiler_ir(*args)
  except ValueError as e:
    if 'jit_compile' not in str(e):
      raise
    raise UserError(
      'the HLO dump needs the step compiled whole by XLA: use'
      f' {errors.field("jit", "on")} (with {errors.field("jit", "auto")}, XLA'
      ' dumps each cluster instead)'
    ) from None
  texts = {name: compiler_ir(stage=stage) for stage, name in STAGES.items()}
  paths = [os.path.join(outdir, name) for name in texts]
  try:
    os.makedirs(outdir, exist_ok=True)
    for path, text in zip(paths, texts.values(), strict=True):
      files.write_atomically(path, text)
  except OSError as e:
    raise UserError(
      f'cannot write the HLO dump to {outdir} ({e.strerror}): pass a'
      f' writable {errors.arg("workdir", "DIR")}'
    ) from None
  optimized = texts[STAGES['optimized_hlo']]
  return HloReport(fusions=count_fusions(optimized), files=paths)


def count_fusions(optimized_hlo: str) -> int:
  """Fusion instructions that execute: those not nested in a fused body.

  Those in the entry computation and in loop bodies count, so a module whose
  while loop runs K steps counts the loop body's fusions once.
  """
  fusions: list[tuple[str, str]] = []  # (computation, computation it calls)
  computation = None
  for line in optimized_hlo.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      computation = header.group(1)
    elif line.startswith('}'):
      computation = None
    elif computation and (fusion := _FUSION.match(line)):
      fusions.append((computation, fusion.group(1)))
  fused = {called for _, called in fusions}
  return sum(inside not in fused for inside, _ in fusions)


def summarize_clusters(outdir: str) -> ClusterReport | None:
  """Reads the dumps `cluster_dumps.request` asked for; None without."""
  # Imported here: the CLI imports this module before TensorFlow (see
  # train.py), and TF's protos come with TF.
  from tensorflow.core.framework import graph_pb2  # noqa: PLC0415

  op_types = collections.defaultdict(collections.Counter)
  pattern = os.path.join(
    glob.escape(outdir), cluster_dumps.GRAPH_DIR, 'mark_for_compilation*.pbtxt'
  )
  for path in glob.glob(pattern):
    if 'annotated' in os.path.basename(path):  # The same graph, renamed.
      continue
    with open(path) as f:
      graph = text_format.Parse(f.read(), graph_pb2.GraphDef())
    for node in graph.node:
      if '_XlaCluster' in node.attr:
        op_types[node.attr['_XlaCluster'].s.decode()][node.op] += 1
  if not op_types:
    return None
  hlo_files = collections.defaultdict(list)
  xla_dir = os.path.join(outdir, cluster_dumps.XLA_DIR)
  for name in sorted(os.listdir(xla_dir) if os.path.isdir(xla_dir) else []):
    if match := _CLUSTER_HLO.match(name):
      hlo_files[match.group(1)].append(os.path.join(xla_dir, name))
  clusters = []
  for name in sorted(op_types, key=lambda n: (len(n), n)):  # cluster_2 < _10
    optimized = [p for p in hlo_files[name] if '_after_optimizations' in p]
    fusions = 0
    if optimized:
      with open(optimized[-1]) as f:
        fusions = count_fusions(f.read())
    clusters.append(
      Cluster(name, dict(op_types[name]), hlo_files[name], fusions)
    )
  return ClusterReport(clusters)


def dump_if_asked(
  config: ml_collections.ConfigDict,
  fn: Callable,
  args: tuple,
  workdir: str,
) -> HloReport | None:
  """`config.dump_hlo` with jit 'on': the step's HLO (`fn` at `args`) into
  `workdir/hlo`."""
  if not (config.dump_hlo and config.jit == 'on'):
    return None
  return dump(fn, args, os.path.join(workdir, HLO_DIR))


def clusters_if_asked(
  config: ml_collections.ConfigDict, workdir: str
) -> list[str]:
  """`config.dump_hlo` with jit 'auto': what auto-clustering compiled, from
  the dumps the process wrote into `workdir/clusters`. Called once the run
  has trained: its dumps replace the earlier run's (`cluster_dumps.publish`)."""
  if not (config.dump_hlo and config.jit == 'auto'):
    return []
  cluster_dumps.publish()
  clusters = summarize_clusters(os.path.join(workdir, CLUSTER_DIR))
  return clusters.lines() if clusters else ['auto-clustering: none']
