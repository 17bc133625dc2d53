"""Strategies in this process: a broken TF_CONFIG, an uneven batch,
logical CPUs after TF started, workers' agreement on a stop."""

from __future__ import annotations

import signal

import pytest

from xla_mnist import loop, replicated
from xla_mnist.runtime import distribute, signals
from xla_mnist.runtime.errors import UserError


@pytest.mark.parametrize(
  'tf_config, message',
  [
    ('', 'needs TF_CONFIG'),
    ('{"cluster": ', 'is not JSON'),
    ('[]', 'has no "cluster"'),
    ('{"task": {"type": "worker", "index": 0}}', 'has no "cluster"'),
    ('{"cluster": {"worker": "h:1"}}', 'list of "host:port"'),
    ('{"cluster": {"ps": ["h:1"]}}', 'must be "chief" or "worker"'),
    ('{"cluster": {"worker": ["h:1"]}}', '"task" must name a job'),
    (
      '{"cluster": {"worker": ["h:1"]}, "task": {"type": "chief"}}',
      '"task" must name a job',
    ),
    (
      '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker",'
      ' "index": 1}}',
      'set "index" from 0 to 0',
    ),
  ],
)
def test_broken_tf_config_is_one_line(monkeypatch, tf_config, message):
  monkeypatch.setenv('TF_CONFIG', tf_config)
  with pytest.raises(UserError, match=message) as error:
    distribute.make_strategy('multi_worker')
  assert '\n' not in str(error.value)


def test_uneven_batch_is_a_usage_error():
  class TwoReplicas:
    num_replicas_in_sync = 2

  with pytest.raises(UserError, match='multiple of 2'):
    replicated.make_step(TwoReplicas(), None, None, 'on', 65)


def test_logical_cpus_after_tf_started_is_one_line():
  import tensorflow as tf

  tf.constant(0)  # TensorFlow has initialised its devices.
  with pytest.raises(UserError, match='num_cpu_devices=3 cannot apply'):
    distribute.make_strategy('mirrored', num_cpu_devices=3)


def test_workers_agree_every_few_steps_and_stop_on_anothers_signal():
  # `agree` stands for the all-gather: this worker got no signal, another
  # got SIGTERM after step 3.
  answers, asked, saved = iter([0, signal.SIGTERM]), [], []

  def agree(signum: int) -> int:
    asked.append(signum)
    return next(answers)

  program = loop.Program(lambda count: [0.5] * count, 1)
  save = loop.Action(lambda b: saved.append(b.last), every=1000, losses=True)
  stats = loop.Loop(
    program, [save], learning_rate=0.5, agree=agree, agree_every=3
  ).run(0, 7)
  assert asked == [0, 0]  # Asked at 3 and 6 only.
  assert (stats.stopped_by, stats.last_step, saved) == (signal.SIGTERM, 6, [6])
  stopped = signals.stopped(stats.stopped_by, stats.last_step, 0, 'DIR')
  assert stopped.exit_code == 128 + signal.SIGTERM
  assert str(stopped) == (
    'stopped by SIGTERM to another worker after step 6: run the same command'
    ' to resume from the checkpoint in DIR'
  )
