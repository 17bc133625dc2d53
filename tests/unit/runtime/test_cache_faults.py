"""`cache_faults`: the reason told is the line that names the fault."""

import pytest

from xla_mnist.runtime import cache_faults

ENTRY = '/c/xla_compile_cache__12__34__cluster_0.pb'


GRAPH_ERROR = """Graph execution error:

Detected at node StatefulPartitionedCall defined at (most recent call last):
  File "train.py", line 1, in <module>
2 root error(s) found.
  (0) INTERNAL:  {0}
\t [[{{{{node StatefulPartitionedCall}}}}]]
\t [[Identity/_4]]
  (1) INTERNAL:  {0}
\t [[{{{{node StatefulPartitionedCall}}}}]]
0 successful operations.
0 derived errors ignored."""


@pytest.mark.parametrize(
  'message, reason',
  [
    (
      f'{ENTRY}; No space left on device [Op:__inference_f_1]',
      'No space left on device',
    ),
    (
      GRAPH_ERROR.format(f'{ENTRY}; Read-only file system'),
      'Read-only file system',
    ),
    (
      GRAPH_ERROR.format('Serialized cache key does not match'),
      'Serialized cache key does not match',
    ),
    ('Graph execution error:\n\t [[{{node f}}]]', 'Graph execution error:'),
    ('', 'InternalError'),
  ],
)
def test_the_reason_is_the_line_that_names_the_fault(message, reason):
  """One line out of TF's message, whatever its shape: never an index
  error, never the count of derived errors."""
  assert cache_faults.reason(InternalError(message)) == reason


class InternalError(Exception):
  pass
