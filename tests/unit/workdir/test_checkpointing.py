"""Checkpoints, exact resumption and damaged checkpoints, on real TF in
this process."""

from __future__ import annotations

import json
import os

import ml_collections
import numpy as np
import pytest
import tensorflow as tf
from support import mnist, steps
from support.runs import checkpoint_bytes, cut

from xla_mnist import input_pipeline, model
from xla_mnist.export import trained
from xla_mnist.runtime.errors import UsageError, UserError
from xla_mnist.workdir import checkpointing


def make_config(**overrides) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(
    {
      'dataset': 'mnist',
      'model': 'softmax',
      'batch_size': 32,
      'seed': 1,
      'learning_rate': 0.5,
      'checkpoint_every': 0,
      'keep_checkpoints': 3,
      'jit': 'on',
      'cpu_threads': 1,
      'optimizer': 'sgd',
      'schedule': 'constant',
      'optimizer_args': {'momentum': None},
      'schedule_args': {'warmup_steps': None},
    }
  )
  config.update(overrides)
  return config


DEVICE = 'CPU:0'


RUN_DATA = checkpointing.data_facts(
  'digest of the data source', (28, 28, 1), 10
)


def new_run(workdir, config, **kwargs) -> Run:
  """A run that found no checkpoint, ready to save (a save needs a restore
  first: it replaces what the restore found)."""
  run = Run(workdir, config, **kwargs)
  assert run.checkpointer.restore(fresh=False) == 0
  return run


class Run:
  """A model, its optimizer, its step and its checkpointer, as the loop has."""

  def __init__(
    self,
    workdir,
    config,
    net=None,
    resume_from='',
    device=DEVICE,
    data=RUN_DATA,
  ):
    self.config = config
    self.net = net or model.create_model(**mnist.FACTS)
    self.optimizer = tf.keras.optimizers.SGD(config.learning_rate)
    self.optimizer.build(self.net.trainable_variables)
    self.step = steps.train_step(
      self.net, self.optimizer, config.jit, config.batch_size
    )
    self.checkpointer = checkpointing.Checkpointer(
      workdir,
      resume_from or workdir,
      self.net,
      self.optimizer,
      config,
      device,
      data,
    )

  def train(self, split, start, stop):
    batches = input_pipeline.train_batches(
      split, self.config.batch_size, self.config.seed, start
    )
    for images, labels in batches.take(stop - start):
      self.step(images, labels)

  def state(self) -> list[np.ndarray]:
    return [v.numpy() for v in self.net.weights] + [
      self.optimizer.iterations.numpy()
    ]


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b, strict=True):
    assert np.array_equal(x, y)  # Bit for bit, not approximately.


def test_round_trip_restores_every_value_bit_for_bit(split, tmp_path):
  run = Run(tmp_path, make_config())
  assert run.checkpointer.restore(fresh=False) == 0  # Nothing saved yet.
  run.train(split, 0, 5)
  path = run.checkpointer.save(5, loss=0.25)
  assert os.path.basename(path) == 'ckpt-5'
  assert os.path.dirname(path) == str(tmp_path / 'checkpoints')
  again = Run(tmp_path, make_config())
  assert again.checkpointer.restore(fresh=False) == 5
  assert_same(again.state(), run.state())
  assert again.checkpointer.restored_loss == 0.25


@pytest.mark.parametrize('jit', ['off', 'on'])
@pytest.mark.kernels  # Bit-exact under either kernel family.
def test_resumed_run_ends_with_the_uninterrupted_weights(jit, split, tmp_path):
  straight = Run(tmp_path / 'straight', make_config(jit=jit))
  straight.train(split, 0, 10)
  first = new_run(tmp_path / 'resumed', make_config(jit=jit))
  first.train(split, 0, 6)
  first.checkpointer.save(6)
  second = Run(tmp_path / 'resumed', make_config(jit=jit))
  start = second.checkpointer.restore(fresh=False)
  second.train(split, start, 10)
  assert start == 6
  assert_same(second.state(), straight.state())


def test_resumes_from_another_workdir_and_saves_in_its_own(split, tmp_path):
  # A non-chief worker: the chief's checkpoints in, its own folder out.
  chief = new_run(tmp_path / 'chief', make_config())
  chief.train(split, 0, 4)
  chief.checkpointer.save(4)
  worker = Run(
    tmp_path / 'worker', make_config(), resume_from=tmp_path / 'chief'
  )
  assert worker.checkpointer.restore(fresh=False) == 4
  assert_same(worker.state(), chief.state())
  worker.checkpointer.save(5)
  assert sorted(os.listdir(tmp_path / 'chief' / 'checkpoints')) == sorted(
    [
      *(f'ckpt-4{ext}' for ext in ('.index', '.data-00000-of-00001')),
      'checkpoint',
    ]
  )
  assert 'ckpt-5.index' in os.listdir(tmp_path / 'worker' / 'checkpoints')

  other = Run(
    tmp_path / 'worker', make_config(seed=2), resume_from=tmp_path / 'chief'
  )
  with pytest.raises(
    UsageError, match='chief/checkpoints holds a run with seed'
  ):
    other.checkpointer.restore(fresh=False)


@pytest.mark.parametrize(
  'field, value',
  [
    ('dataset', 'fashion_mnist'),
    ('batch_size', 16),
    ('seed', 2),
    ('learning_rate', 0.1),
    ('jit', 'off'),
    ('cpu_threads', 2),
    ('device', '2 replicas (mirrored)'),
    ('data', 'digest of other files'),  # Other files under the same name.
  ],
)
def test_checkpoint_of_another_config_is_a_usage_error(
  field, value, split, tmp_path
):
  new_run(tmp_path, make_config()).checkpointer.save(3)
  if field == 'device':  # What the run found, not config fields.
    other = Run(tmp_path, make_config(), device=value)
  elif field == 'data':
    other = Run(tmp_path, make_config(), data={**RUN_DATA, 'data': value})
  else:
    other = Run(tmp_path, make_config(**{field: value}))
  with pytest.raises(UsageError, match=f'with {field} .* fresh=True') as e:
    other.checkpointer.restore(fresh=False)
  assert repr(value) in str(e.value)
  assert e.value.exit_code == 2


def test_checkpoint_of_another_model_shape_is_a_usage_error(tmp_path):
  new_run(tmp_path, make_config()).checkpointer.save(3)
  wider = tf.keras.Sequential(
    [tf.keras.Input((mnist.FLAT[0],)), tf.keras.layers.Dense(12)]
  )
  other = Run(tmp_path, make_config(), net=wider)
  with pytest.raises(UsageError, match='with model .*10x784.*784x12'):
    other.checkpointer.restore(fresh=False)


def test_fresh_replaces_old_checkpoints_only_at_its_first_save(split, tmp_path):
  old = new_run(tmp_path, make_config())
  for i in (4, 8):
    old.checkpointer.save(i)
  fresh = Run(tmp_path, make_config(seed=2))  # Another run may start here.
  assert fresh.checkpointer.restore(fresh=True) == 0
  # A fresh run that fails before its first save leaves the old run intact.
  assert Run(tmp_path, make_config()).checkpointer.restore(fresh=False) == 8
  fresh.train(split, 0, 2)
  fresh.checkpointer.save(2)
  files = sorted(os.listdir(tmp_path / 'checkpoints'))
  assert files == ['checkpoint', 'ckpt-2.data-00000-of-00001', 'ckpt-2.index']
  resumed = Run(tmp_path, make_config(seed=2))
  assert resumed.checkpointer.restore(fresh=False) == 2
  assert_same(resumed.state(), fresh.state())


def test_keeps_the_latest_checkpoints_only(tmp_path):
  checkpointer = new_run(tmp_path, make_config(keep_checkpoints=2)).checkpointer
  for i in (5, 10, 15):
    checkpointer.save(i)
  files = {name.split('.')[0] for name in os.listdir(tmp_path / 'checkpoints')}
  assert files == {'checkpoint', 'ckpt-10', 'ckpt-15'}


def test_saving_the_same_step_again_leaves_the_latest_untouched(tmp_path):
  checkpointer = new_run(tmp_path, make_config()).checkpointer
  path = checkpointer.save(7)
  index = tmp_path / 'checkpoints' / 'ckpt-7.index'
  before = index.stat()
  assert checkpointer.save(7) == path
  after = index.stat()
  assert (after.st_ino, after.st_mtime_ns) == (
    before.st_ino,
    before.st_mtime_ns,
  )


def prefixes(folder) -> set[str]:
  return {n.split('.')[0] for n in os.listdir(folder) if n != 'checkpoint'}


def test_files_of_a_killed_write_are_swept_without_a_word(
  split, tmp_path, capsys
):
  """What a save killed before its checkpoint was whole leaves behind: TF's
  temp folder, and the temp files of a state-file update (TF's and ours)."""
  run = new_run(tmp_path, make_config())
  run.train(split, 0, 6)
  run.checkpointer.save(6)
  folder = tmp_path / 'checkpoints'
  garbage = b'\x00partial write\xff' * 10
  (folder / 'ckpt-8_temp').mkdir()
  for name in (
    'ckpt-8_temp/part-00000-of-00001.index',
    'ckpt-8_temp/part-00000-of-00001.data-00000-of-00001',
    'checkpoint.tmp0123456789abcdef0123456789abcdef',
    'tmp1a2b3c4d.tmp',
  ):
    (folder / name).write_bytes(garbage)
  capsys.readouterr()
  resumed = Run(tmp_path, make_config())
  assert resumed.checkpointer.restore(fresh=False) == 6
  assert capsys.readouterr().out == ''  # Nothing is wrong: nothing to say.
  assert_same(resumed.state(), run.state())
  resumed.train(split, 6, 8)
  resumed.checkpointer.save(8)
  assert sorted(os.listdir(folder)) == [
    'checkpoint',
    'ckpt-6.data-00000-of-00001',
    'ckpt-6.index',
    'ckpt-8.data-00000-of-00001',
    'ckpt-8.index',
  ]
  last = Run(tmp_path, make_config())
  assert last.checkpointer.restore(fresh=False) == 8
  assert_same(last.state(), resumed.state())


# What the pointer (the `checkpoint` state file) may hold when it is wrong.
POINTER_FAULTS = {
  'missing': None,
  'empty': b'',
  'garbage': b'\x00\xff\xfenot a checkpoint state\n',
  'truncated': b'model_checkpoint_path: "ckp',
  'a missing prefix': b'model_checkpoint_path: "ckpt-40"\n',
  # A save killed after its checkpoint was whole, before it was named.
  'an older prefix': b'model_checkpoint_path: "ckpt-4"\n',
}


@pytest.mark.parametrize('fault', POINTER_FAULTS)
def test_a_wrong_pointer_resumes_from_the_newest_complete_checkpoint(
  fault, split, tmp_path, capsys
):
  run = new_run(tmp_path, make_config())
  for start, stop in ((0, 4), (4, 8)):
    run.train(split, start, stop)
    run.checkpointer.save(stop, loss=float(stop))
  folder = tmp_path / 'checkpoints'
  pointer = folder / 'checkpoint'
  if POINTER_FAULTS[fault] is None:
    pointer.unlink()
  else:
    pointer.write_bytes(POINTER_FAULTS[fault])
  before = checkpoint_bytes(folder)
  capsys.readouterr()

  resumed = Run(tmp_path, make_config())
  assert resumed.checkpointer.restore(fresh=False) == 8
  assert resumed.checkpointer.restored_loss == 8.0
  assert_same(resumed.state(), run.state())
  [note] = capsys.readouterr().out.splitlines()
  assert note.startswith('note: resuming from ckpt-8, the newest complete')
  assert f'{pointer}' in note and 'now names ckpt-8' in note
  # Repaired, atomically (no temp file left), and TF reads it again.
  assert tf.train.latest_checkpoint(str(folder)) == str(folder / 'ckpt-8')
  assert checkpoint_bytes(folder) == before
  resumed.train(split, 8, 10)
  resumed.checkpointer.save(10)
  assert prefixes(folder) == {'ckpt-4', 'ckpt-8', 'ckpt-10'}  # Keeps 3.


def flip(path) -> None:
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))


DATA, INDEX = 'ckpt-8.data-00000-of-00001', 'ckpt-8.index'


DAMAGES = {
  'data cut': (DATA, cut),
  'data missing': (DATA, os.remove),
  'data bit flipped': (DATA, flip),
  'index cut': (INDEX, cut),
  'index missing': (INDEX, os.remove),
}


@pytest.mark.parametrize('damage', DAMAGES)
def test_a_damaged_newest_checkpoint_is_moved_aside_never_deleted(
  damage, split, tmp_path, capsys
):
  run = new_run(tmp_path, make_config(keep_checkpoints=2))
  run.train(split, 0, 4)
  run.checkpointer.save(4)
  at_4 = run.state()
  run.train(split, 4, 8)
  run.checkpointer.save(8)
  folder = tmp_path / 'checkpoints'
  name, spoil = DAMAGES[damage]
  spoil(folder / name)
  damaged = {k: v for k, v in checkpoint_bytes(folder).items() if '8' in k}
  capsys.readouterr()

  resumed = Run(tmp_path, make_config(keep_checkpoints=2))
  assert resumed.checkpointer.restore(fresh=False) == 4
  assert_same(resumed.state(), at_4)
  [note] = capsys.readouterr().out.splitlines()
  aside = folder / 'damaged-ckpt-8'
  assert note.startswith('note: resuming from ckpt-4, the newest complete')
  assert 'ckpt-8 is damaged (' in note and f'moved to {aside}' in note
  assert 'names ckpt-8, which is damaged: it now names ckpt-4' in note
  # Saves and their sweeps, past the damaged step, never touch it.
  for stop in (6, 8, 9, 12):
    resumed.checkpointer.save(stop)
  assert prefixes(folder) == {'ckpt-9', 'ckpt-12', 'damaged-ckpt-8'}
  kept = {f'damaged-ckpt-8/{k}': v for k, v in damaged.items()}
  assert {k: v for k, v in checkpoint_bytes(folder).items() if '8/' in k} == (
    kept
  )


def test_a_damaged_only_checkpoint_is_named_and_left_as_it_is(tmp_path):
  new_run(tmp_path, make_config()).checkpointer.save(3)
  folder = tmp_path / 'checkpoints'
  cut(folder / 'ckpt-3.data-00000-of-00001')
  before = {**checkpoint_bytes(folder), 'checkpoint': b''}
  before['checkpoint'] = (folder / 'checkpoint').read_bytes()
  with pytest.raises(
    UserError, match='ckpt-3 cannot be restored .* no older one .*fresh=True'
  ):
    Run(tmp_path, make_config()).checkpointer.restore(fresh=False)
  after = {**checkpoint_bytes(folder)}
  after['checkpoint'] = (folder / 'checkpoint').read_bytes()
  assert after == before


def test_a_checkpoint_from_before_the_jit_check_is_refused(tmp_path):
  """As this project wrote them before: TF's CheckpointManager, no loss, a
  fingerprint without jit, device and cpu_threads."""
  config = make_config()
  net = model.create_model(**mnist.FACTS)
  optimizer = tf.keras.optimizers.SGD(config.learning_rate)
  optimizer.build(net.trainable_variables)
  old_fields = ('dataset', 'model', 'batch_size', 'seed', 'learning_rate')
  current = checkpointing.fingerprint(net, config, DEVICE, RUN_DATA)
  old = tf.train.Checkpoint(
    model=net,
    optimizer=optimizer,
    step=tf.Variable(3, dtype=tf.int64),
    fingerprint=tf.Variable(json.dumps({k: current[k] for k in old_fields})),
  )
  folder = str(tmp_path / 'checkpoints')
  tf.train.CheckpointManager(old, folder, 3, checkpoint_name='ckpt').save(3)
  with pytest.raises(
    UsageError, match='written before .* recorded model_name'
  ) as e:
    Run(tmp_path, config).checkpointer.restore(fresh=False)
  assert 'fresh=True' in str(e.value)


def test_failed_save_is_named(tmp_path):
  checkpointer = new_run(tmp_path, make_config()).checkpointer
  (tmp_path / 'checkpoints').write_text('not a folder')
  with pytest.raises(UserError, match='checkpoints .*Not a directory.*DIR'):
    Run(tmp_path, make_config()).checkpointer.restore(fresh=False)
  with pytest.raises(
    UserError, match='cannot save a checkpoint in .*workdir=DIR'
  ):
    checkpointer.save(3)


def test_restore_model_reads_the_newest_whole_checkpoint_of_its_recipe(
  split, tmp_path
):
  run = new_run(tmp_path, make_config())
  run.train(split, 0, 3)
  run.checkpointer.save(3)
  (tmp_path / 'checkpoints' / 'checkpoint').write_text('garbage')
  net = model.create_model(**mnist.FACTS)
  path = trained.restore_model(net, str(tmp_path), make_config())
  assert path.endswith('ckpt-3')
  assert_same([v.numpy() for v in net.weights], run.state()[:-1])
  # It only reads: the damaged pointer is left for a resume to repair.
  assert (tmp_path / 'checkpoints' / 'checkpoint').read_text() == 'garbage'


def test_restore_model_refuses_a_checkpoint_of_another_recipe(tmp_path):
  new_run(tmp_path, make_config()).checkpointer.save(3)
  with pytest.raises(UsageError, match='with batch_size 32, .* has 16') as e:
    trained.restore_model(
      model.create_model(**mnist.FACTS),
      str(tmp_path),
      make_config(batch_size=16),
    )
  assert e.value.exit_code == 2
  with pytest.raises(UserError, match='holds no complete checkpoint'):
    trained.restore_model(
      model.create_model(**mnist.FACTS), str(tmp_path / 'elsewhere')
    )
