"""The benchmark's kernel comparison: how it reads a difference."""

import pytest

from benchmarks import kernels
from xla_mnist.runtime.errors import DataError


def _comparison(tf_us: float, jax_us: float, tf_hlo: list, jax_hlo: list):
  """Two programs that differ in the forward dot only."""
  rows = [
    {
      'category': c,
      'tf_us': tf_us if c == kernels.FORWARD_DOT else 5.0,
      'jax_us': jax_us if c == kernels.FORWARD_DOT else 5.0,
      'tf_kernels': [{'name': 'a', 'us': 1.0, 'hlo': tf_hlo}],
      'jax_kernels': [{'name': 'b', 'us': 1.0, 'hlo': jax_hlo}],
    }
    for c in kernels.CATEGORIES
  ]
  side = {'step_us': 100.0, 'kernel_us': 90.0, 'host_us': 10.0, 'steps': 200}
  return {'tf': dict(side), 'jax': dict(side), 'categories': rows}


@pytest.mark.parametrize(
  'tf_us, jax_hlo, reads',
  [
    (36.0, ['dot'], "forward dot costs 1.8x JAX's in TF's XLA (36.0 vs 20.0"),
    (36.0, ['fusion'], 'different HLO'),
    (10.0, ['dot'], "forward dot costs 2.0x TF's in JAX's XLA"),
    (21.0, ['dot'], None),  # Within the noise: no line.
  ],
)
def test_reading_calls_a_difference_codegen_only_on_the_same_hlo(
  tf_us, jax_hlo, reads
):
  lines = kernels.reading(_comparison(tf_us, 20.0, ['dot'], jax_hlo))
  dot = [line for line in lines if line.startswith('- forward dot')]
  if reads is None:
    assert dot == []
    return
  assert len(dot) == 1 and reads in dot[0], lines
  codegen = 'a codegen difference, not the program' in dot[0]
  assert codegen == (jax_hlo == ['dot'])
  newer_xla = next(line for line in lines if 'only a newer XLA' in line)
  assert ('16.0 µs/step' in newer_xla) == (codegen and tf_us > 20)


def test_a_workdir_without_a_capture_is_a_data_error(tmp_path):
  with pytest.raises(DataError, match='profile_steps'):
    kernels.find_capture(str(tmp_path))
