"""Where things are: the names and numbers several modules share.

Imports nothing of the project's, so that the command lines, the tests and
the Makefile read the same facts before TensorFlow starts.
"""

import os

# Debian's `dataset-fashion-mnist` installs the four IDX files here.
DEBIAN_FASHION_MNIST = '/usr/share/datasets/fashion-mnist'
# A dataset's IDX folder when `config.idx_dir` is empty.
DEBIAN_DIRS = {'fashion_mnist': DEBIAN_FASHION_MNIST}

# The IDX format of MNIST and Fashion-MNIST: unsigned bytes, 3 or 1 dims.
IMAGE_MAGIC = 2051
LABEL_MAGIC = 2049
# Split name -> (images file, labels file), the names both datasets use.
# Each may also be present without the `.gz` suffix.
IDX_FILES = {
  'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
  'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}

# The datasets whose IDX files `idx_dir` reads, and their class names as
# TFDS's builders name them (a run records them).
IDX_CLASSES = {
  'mnist': tuple('0123456789'),
  'fashion_mnist': (
    'T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
    'Sneaker', 'Bag', 'Ankle boot',
  ),
}  # fmt: skip


def user_cache(*parts: str) -> str:
  """A path in the user's cache folder: $XDG_CACHE_HOME, else ~/.cache."""
  home = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
  return os.path.join(home, *parts)


# A run's workdir.
CHECKPOINT_DIR = 'checkpoints'
RESULT_FILE = 'result.json'
REPORT_FILE = 'report.md'
LOCK_FILE = '.lock'  # Held by the run that writes there.
COMPARE_FILE = 'compare.json'  # compare's workdir: no run's.
TRACE_FILE = 'trace.json.gz'  # The profiled window as a Chrome trace.
BREAKDOWN_FILE = 'breakdown.json'  # Why its step takes its time.
HLO_DIR = 'hlo'  # `dump_hlo` with jit 'on': the step's HLO.
CLUSTER_DIR = 'clusters'  # `dump_hlo` with jit 'auto': the clusters.
EVENTS_PREFIX = 'events.out.tfevents.'  # TensorBoard's event files.
# Where TF's profiler puts each capture of a logdir (TensorBoard reads it).
CAPTURE_PATTERN = 'plugins/profile/*/*.xplane.pb'
