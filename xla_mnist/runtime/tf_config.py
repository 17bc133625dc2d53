"""TF_CONFIG and the workers' start-up wait, read without TensorFlow: a
`multi_worker` run checks them before TF's import (`process.prepare`), so
that a broken one is one line at once, and again as it starts its cluster
(`cluster.multi_worker`)."""

from __future__ import annotations

import json
import os

from xla_mnist.runtime import errors
from xla_mnist.runtime.errors import UsageError

# How long a worker waits for the others in TF_CONFIG before giving up: TF's
# own wait, in the strategy's constructor, never ends. The environment
# variable sets another wait, in seconds.
STARTUP_TIMEOUT = 300.0
STARTUP_TIMEOUT_VARIABLE = 'XLA_MNIST_WORKER_TIMEOUT'
_EXAMPLE = (
  '{"cluster": {"worker": ["host0:12345", "host1:12345"]},'
  ' "task": {"type": "worker", "index": 0}}'
)


def read() -> tuple[dict[str, list[str]], float]:
  """TF_CONFIG's cluster and the start-up wait in seconds, from the
  environment; UsageError for either that is unusable."""
  return cluster(os.environ.get('TF_CONFIG', '')), startup_timeout()


def cluster(text: str) -> dict[str, list[str]]:
  """Returns TF_CONFIG's cluster; UsageError unless it names this worker.

  TF accepts a TF_CONFIG without a cluster and then trains alone, silently.
  """
  fix = f"export TF_CONFIG='{_EXAMPLE}' with this host's index"
  if not text:
    raise UsageError(
      f'{errors.field("strategy", "multi_worker")} needs TF_CONFIG: {fix}'
    )
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise UsageError(f'TF_CONFIG is not JSON ({e.msg}): {fix}') from None
  jobs = config.get('cluster') if isinstance(config, dict) else None
  if not jobs or not isinstance(jobs, dict):
    raise UsageError(f'TF_CONFIG has no "cluster": {fix}')
  for job, addresses in jobs.items():
    if job not in ('chief', 'worker') or not _addresses(addresses):
      raise UsageError(
        f'TF_CONFIG cluster job {job!r} must be "chief" or "worker" with a'
        f' list of "host:port" addresses: {fix}'
      )
  task = config.get('task')
  if not isinstance(task, dict) or task.get('type') not in jobs:
    raise UsageError(
      f'TF_CONFIG "task" must name a job of the cluster'
      f' ({", ".join(jobs)}): {fix}'
    )
  index, size = task.get('index'), len(jobs[task['type']])
  if not isinstance(index, int) or not 0 <= index < size:
    raise UsageError(
      f'TF_CONFIG task index {index!r} is not one of the {size}'
      f' {task["type"]} addresses: set "index" from 0 to {size - 1}'
    )
  return jobs


def _addresses(value: object) -> bool:
  return (
    isinstance(value, list)
    and bool(value)
    and all(isinstance(a, str) and ':' in a for a in value)
  )


def startup_timeout() -> float:
  """`STARTUP_TIMEOUT_VARIABLE`'s seconds, or `STARTUP_TIMEOUT` unset."""
  text = os.environ.get(STARTUP_TIMEOUT_VARIABLE, '')
  if not text:
    return STARTUP_TIMEOUT
  try:
    seconds = float(text)
  except ValueError:
    seconds = 0.0
  if not 0 < seconds < 1e6:
    raise UsageError(
      f'{STARTUP_TIMEOUT_VARIABLE}={text!r} is not a number of seconds'
      f' above 0: set it to the wait for the other workers, or unset it'
      f' for {STARTUP_TIMEOUT:.0f} s'
    )
  return seconds
