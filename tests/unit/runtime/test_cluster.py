"""`cluster.collective_failure`: a failed collective is told by its cause."""

from __future__ import annotations

import pytest

from xla_mnist.runtime import cluster

# A failed all-reduce as TF 2.21 reported it here, when the other worker
# died; and the same frame around the text of TF's collective timeout.
ABORTED = '\n'.join(
  [
    'Graph execution error:',
    '',
    'Detected at node CollectiveReduceV2 defined at (most recent call last):',
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    '',
    '  File "/x/xla_mnist/runtime/distribute.py", line 230, in train_step',
    '',
    'Collective ops is aborted by: Socket closed',
    'Additional GRPC error information from remote target'
    ' /job:worker/replica:0/task:1 while calling'
    ' /tensorflow.WorkerService/RecvBuf:',
    ':UNKNOWN:Error received from peer  {grpc_status:14,'
    ' grpc_message:"Socket closed"}',
    'The error could be from a previous operation. Restart your program to'
    ' reset.',
    '\t [[{{node CollectiveReduceV2}}]] [Op:__inference_train_step_351]',
  ]
)


TIMED_OUT = '\n'.join(
  [
    'Graph execution error:',
    '',
    'Detected at node CollectiveGatherV2 defined at (most recent call last):',
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    '',
    'Collective has timed out during execution.',
    '\t [[{{node CollectiveGatherV2}}]] [Op:__inference_gather_12]',
  ]
)


@pytest.mark.parametrize(
  'message, reason',
  [
    (ABORTED, 'Socket closed'),
    (TIMED_OUT, 'Collective has timed out during execution.'),
    ('', '?'),
  ],
)
def test_a_failed_collective_is_told_by_its_cause(message, reason):
  assert cluster.collective_failure(message) == reason
