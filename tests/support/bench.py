"""A benchmark report, the smallest the results page is made of."""


def report_with(**parts) -> dict:
  """The smallest report the page is made of, with `parts` added; its
  variant is a copy of `FUSED`, for a test to change."""
  return {
    'date': '2000-01-01T00:00:00+00:00',
    'machine': {
      'cpu': 'CPU',
      'cores': 2,
      'avx512': False,
      'onednn': False,
      'python': '3',
      'tensorflow': '2',
      'numpy': '2',
      'jax': '',
    },
    'load_average': [0.0, 0.0],
    'dataset': 'fashion_mnist',
    'steps': 100,
    'repeats': 1,
    'batch_size': 100,
    'variants': [dict(FUSED)],
    **parts,
  }


FUSED = {
  'variant': 'fused K=100',
  'steps_per_loop': 100,
  'compile_seconds': 1.0,
  'train_seconds': 1.0,
  'timed_steps': 100,
  'round_train_seconds': [1.0],
  'steps_per_second': 100.0,
  'vs_fused': 1.0,
  'test_accuracy': 0.8,
  'cluster_compiles': 0,
  'threads': 'TF cpu_threads=1',
}
