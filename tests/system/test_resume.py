"""Exact resume through the command: runs killed at random steps,
signals, kill -9, refused resumes, damaged checkpoints and full disks, on
the real Fashion-MNIST."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from support.cli import assert_one_line_error, run_train, start_train
from support.disk import fill
from support.events import event_scalars
from support.runs import checkpoint_bytes, cut, final_state, interrupt

# The CLI: real runs on Fashion-MNIST (hence `slow`), interrupted the ways
# users and schedulers interrupt them.

CLI_STEPS = 300


def cli_args(data_dir, workdir, *extra: str) -> list[str]:
  # Calls of 10 fused steps: kills land between and inside calls; a
  # checkpoint every 25 steps is reached inside calls, not at their ends.
  return [
    '--config=fashion_mnist',
    f'--data_dir={data_dir}',
    f'--workdir={workdir}',
    f'--config.num_steps={CLI_STEPS}',
    '--config.steps_per_loop=10',
    '--config.log_every=10',
    '--config.checkpoint_every=25',
    *extra,
  ]


def assert_same_checkpoint(workdir, reference) -> None:
  state, expected = final_state(workdir), final_state(reference)
  assert state.keys() == expected.keys()
  for key, value in expected.items():
    assert np.array_equal(state[key], value), key
  assert int(state['step/.ATTRIBUTES/VARIABLE_VALUE']) == CLI_STEPS


def assert_same_result(workdir, reference) -> None:
  result, expected = (
    json.loads((w / 'result.json').read_text()) for w in (workdir, reference)
  )
  assert result['final_loss'] == expected['final_loss']
  assert result['test_accuracy'] == expected['test_accuracy']


def assert_stops_and_resumes_alike(args, workdir, reference) -> None:
  """`args`' run stopped by SIGTERM, then run again, ends bit for bit as
  `reference`, the same run uninterrupted."""
  proc = interrupt(args, 120, signal.SIGTERM)
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
  proc = run_train(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'resuming at step' in proc.stdout
  assert_same_checkpoint(workdir, reference)
  assert_same_result(workdir, reference)


@pytest.fixture(scope='module')
def straight_run(fashion_data_dir, tmp_path_factory):
  """The uninterrupted run that interrupted ones must match bit for bit."""
  workdir = tmp_path_factory.mktemp('straight')
  proc = run_train(*cli_args(fashion_data_dir, workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


@pytest.mark.slow
def test_runs_killed_at_random_steps_resume_to_identical_weights(
  straight_run, fashion_data_dir, tmp_path
):
  args = cli_args(fashion_data_dir, tmp_path)
  # From step 60 on, a checkpoint (25 or 50) exists when the kill comes.
  kills = sorted(random.sample(range(60, CLI_STEPS - 30, 10), 2))
  for after in kills:
    proc = interrupt(args, after, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, (kills, proc.stdout[-2000:])
  proc = run_train(*args)
  assert proc.returncode == 0, (kills, proc.stderr[-3000:])
  assert 'resuming at step' in proc.stdout
  assert_same_checkpoint(tmp_path, straight_run)
  assert_same_result(tmp_path, straight_run)


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_then_exits_128_plus_its_number_with_one_line(
  signum, straight_run, fashion_data_dir, tmp_path
):
  args = cli_args(fashion_data_dir, tmp_path)
  proc = interrupt(args, 120, signum)
  # Saved, but not finished: a scheduler must not take it for done.
  assert proc.returncode == 128 + signum, proc.stderr[-3000:]
  said = [
    line
    for line in (proc.stdout + proc.stderr).splitlines()
    if signum.name in line
  ]
  assert len(said) == 1, proc.stdout + proc.stderr
  assert 'Traceback' not in proc.stderr
  stopped = int(re.search(r'step (\d+)', said[0]).group(1))
  assert 120 <= stopped < CLI_STEPS
  state = final_state(tmp_path)
  assert int(state['step/.ATTRIBUTES/VARIABLE_VALUE']) == stopped
  assert not (tmp_path / 'result.json').exists()
  proc = run_train(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert_same_checkpoint(tmp_path, straight_run)
  assert_same_result(tmp_path, straight_run)


@pytest.mark.slow
def test_a_streamed_run_stopped_and_resumed_ends_as_the_resident_one(
  straight_run, fashion_data_dir, tmp_path
):
  """Issue 50: read from disk by tf.data, fused calls of 10, a SIGTERM at
  step 120; resumed, it ends bit for bit where the resident run ends."""
  args = cli_args(fashion_data_dir, tmp_path, '--config.input=stream')
  proc = interrupt(args, 120, signal.SIGTERM)
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
  assert 'input: streamed' in proc.stdout
  proc = run_train(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'resuming at step' in proc.stdout
  assert_same_checkpoint(tmp_path, straight_run)
  assert_same_result(tmp_path, straight_run)


@pytest.mark.slow
def test_checkpoint_of_another_config_is_refused_in_one_line(
  straight_run, fashion_data_dir, tmp_path
):
  shutil.copytree(straight_run / 'checkpoints', tmp_path / 'checkpoints')
  proc = run_train(*cli_args(fashion_data_dir, tmp_path, '--config.seed=2'))
  assert_one_line_error(proc, 2, 'with seed 1', 'has 2', '--fresh')


def copy_run(run, workdir) -> list[str]:
  """Copies `run`'s checkpoints and event files; returns the files' names."""
  shutil.copytree(run / 'checkpoints', workdir / 'checkpoints')
  events = [p.name for p in run.glob('events.out.tfevents.*')]
  for name in events:
    shutil.copy(run / name, workdir / name)
  return events


@pytest.mark.slow
def test_fresh_run_that_diverges_names_the_fix_and_keeps_the_old_run(
  straight_run, fashion_data_dir, tmp_path
):
  old_events = copy_run(straight_run, tmp_path)
  # Softmax regression diverges to NaN only when W x overflows float32.
  diverging = cli_args(
    fashion_data_dir, tmp_path, '--config.learning_rate=3e38'
  )
  proc = run_train(*diverging, '--fresh')  # Without it: a config conflict.
  assert_one_line_error(
    proc, 1, 'loss is nan at step', 'lower --config.learning_rate (now 3e+38)'
  )
  # It failed before its first checkpoint: the old run is still there.
  assert_same_checkpoint(tmp_path, straight_run)
  assert all(os.path.exists(tmp_path / name) for name in old_events)


@pytest.mark.slow
def test_fresh_run_replaces_the_old_runs_events_at_its_first_save(
  straight_run, fashion_data_dir, tmp_path
):
  old_events = copy_run(straight_run, tmp_path)
  assert old_events
  other_recipe = cli_args(fashion_data_dir, tmp_path, '--config.seed=2')
  proc = run_train(*other_recipe, '--fresh')
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not any(os.path.exists(tmp_path / name) for name in old_events)
  # TensorBoard's own reader: one loss per logged step, the new run's.
  assert logged_steps(tmp_path) == list(range(10, CLI_STEPS + 1, 10))


def logged_steps(workdir) -> list[int]:
  """The steps of every train/loss point in the workdir, as TensorBoard's
  own reader finds them (repeats included)."""
  return [step for step, _ in event_scalars(str(workdir), 'train/loss')]


@pytest.mark.slow
def test_a_kill_9_loses_no_logged_loss_up_to_the_restored_step(
  straight_run, fashion_data_dir, tmp_path
):
  args = cli_args(fashion_data_dir, tmp_path)
  after = random.choice(range(60, CLI_STEPS - 30, 10))
  proc = interrupt(args, after, signal.SIGKILL)
  assert proc.returncode == -signal.SIGKILL, (after, proc.stdout[-2000:])
  saved = int(final_state(tmp_path)['step/.ATTRIBUTES/VARIABLE_VALUE'])
  # What the checkpoint holds is in the event files already.
  assert set(range(10, saved + 1, 10)) <= set(logged_steps(tmp_path)), after
  proc = run_train(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert set(logged_steps(tmp_path)) == set(range(10, CLI_STEPS + 1, 10))
  assert_same_checkpoint(tmp_path, straight_run)


@pytest.mark.slow
@pytest.mark.parametrize(
  'flag, field, stored, given',
  [
    ('--jit=off', 'jit', "'on'", "'off'"),
    ('--config.cpu_threads=2', 'cpu_threads', '1', '2'),
  ],
)
def test_a_resume_that_changes_the_trajectory_is_refused_in_one_line(
  flag, field, stored, given, straight_run, fashion_data_dir, tmp_path
):
  shutil.copytree(straight_run / 'checkpoints', tmp_path / 'checkpoints')
  before = checkpoint_bytes(tmp_path / 'checkpoints')
  proc = run_train(*cli_args(fashion_data_dir, tmp_path, flag))
  assert_one_line_error(
    proc, 2, f'with {field} {stored}', f'has {given}', '--fresh'
  )
  assert checkpoint_bytes(tmp_path / 'checkpoints') == before


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_resumes_from_the_one_before_exactly(
  straight_run, fashion_data_dir, tmp_path
):
  """Also in calls of another length: the steps do not change with it."""
  folder = tmp_path / 'checkpoints'
  shutil.copytree(straight_run / 'checkpoints', folder)
  cut(folder / 'ckpt-300.data-00000-of-00001')
  damaged = (folder / 'ckpt-300.data-00000-of-00001').read_bytes()
  proc = run_train(
    *cli_args(fashion_data_dir, tmp_path, '--config.steps_per_loop=7')
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  [note] = [line for line in proc.stdout.splitlines() if 'note:' in line]
  assert note.startswith('note: resuming from ckpt-280, the newest complete')
  assert 'ckpt-300 is damaged' in note
  aside = folder / 'damaged-ckpt-300' / 'ckpt-300.data-00000-of-00001'
  assert aside.read_bytes() == damaged
  assert 'resuming at step 280' in proc.stdout
  assert_same_checkpoint(tmp_path, straight_run)
  assert_same_result(tmp_path, straight_run)


@pytest.mark.slow
def test_a_garbled_pointer_and_a_lost_result_give_the_restored_figures(
  straight_run, fashion_data_dir, tmp_path
):
  """A run killed between its last save and its result, pointer spoiled."""
  folder = tmp_path / 'checkpoints'
  shutil.copytree(straight_run / 'checkpoints', folder)
  (folder / 'checkpoint').write_bytes(b'\x00garbage\xff')
  before = checkpoint_bytes(folder)
  proc = run_train(*cli_args(fashion_data_dir, tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'note: resuming from ckpt-300, the newest complete' in proc.stdout
  assert 'holds step 300 of 300 but no result.json' in proc.stdout
  assert checkpoint_bytes(folder) == before
  assert_same_result(tmp_path, straight_run)  # Loss restored, accuracy redone.
  text = (tmp_path / 'result.json').read_text()
  result = json.loads(text, parse_constant=lambda c: pytest.fail(c))
  for name in ('compile_seconds', 'train_seconds', 'steps_per_second'):
    assert result[name] is None, name
  assert 'compile not measured' in proc.stdout
  assert '| speed | not measured |' in (tmp_path / 'report.md').read_text()
  proc = run_train(*cli_args(fashion_data_dir, tmp_path))  # Now finished.
  assert proc.returncode == 0 and 'holds this finished run' in proc.stdout


def fill_up(folder) -> None:
  """`fill`, which also raises ENOSPC as it closes its file on the full
  disk (the file's buffer flushes again): the disk is full either way."""
  with contextlib.suppress(OSError):
    fill(folder)
  assert shutil.disk_usage(folder).free == 0


def named_checkpoints(folder) -> dict[str, bytes]:
  """The files of the checkpoints the pointer names: complete by then."""
  state = tf.train.get_checkpoint_state(str(folder))
  names = {os.path.basename(p) for p in state.all_model_checkpoint_paths}
  return {
    k: v
    for k, v in checkpoint_bytes(folder).items()
    if k.split('.')[0] in names
  }


@pytest.mark.slow
def test_a_disk_that_fills_during_a_save_loses_no_checkpoint(
  straight_run, fashion_data_dir, tmp_path, small_disk
):
  folder = small_disk('checkpoints', 512)  # The workdir's, alone.
  args = cli_args(fashion_data_dir, tmp_path)
  proc = start_train(*args)
  for line in proc.stdout:
    match = re.match(r'step +(\d+)/', line)
    if match and int(match.group(1)) >= 100:
      proc.send_signal(signal.SIGSTOP)  # Wherever it is, a save included.
      break
  named = named_checkpoints(tmp_path / 'checkpoints')
  fill_up(folder)
  proc.send_signal(signal.SIGCONT)
  out, err = proc.communicate(timeout=120)
  proc = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
  assert_one_line_error(
    proc, 1, 'cannot save a checkpoint in', 'No space left', 'free space'
  )
  assert named_checkpoints(tmp_path / 'checkpoints') == named
  # Nothing half-written is left.
  left = set(os.listdir(folder)) - {'filler', 'checkpoint'}
  assert {name.split('.')[0] for name in left} == {
    name.split('.')[0] for name in named
  }
  os.remove(os.path.join(folder, 'filler'))
  proc = run_train(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert_same_checkpoint(tmp_path, straight_run)


@pytest.mark.slow
def test_a_full_disk_for_the_events_is_one_line_and_keeps_the_checkpoints(
  straight_run, fashion_data_dir, tmp_path, small_disk
):
  workdir = small_disk('run', 512)
  shutil.copytree(straight_run / 'checkpoints', f'{workdir}/checkpoints')
  before = checkpoint_bytes(tmp_path / 'run' / 'checkpoints')
  fill_up(workdir)
  # One page free: the workdir's lock writes its process id there first.
  filler = os.path.join(workdir, 'filler')
  os.truncate(filler, os.path.getsize(filler) - 4096)
  proc = run_train(*cli_args(fashion_data_dir, workdir))
  assert_one_line_error(
    proc, 1, 'cannot write the TensorBoard events into', 'No space left'
  )
  assert checkpoint_bytes(tmp_path / 'run' / 'checkpoints') == before


@pytest.mark.slow
def test_a_result_that_cannot_be_written_is_one_line(
  straight_run, fashion_data_dir, tmp_path
):
  shutil.copytree(straight_run / 'checkpoints', tmp_path / 'checkpoints')
  (tmp_path / 'result.json' / 'in the way').mkdir(parents=True)
  proc = run_train(*cli_args(fashion_data_dir, tmp_path))
  assert_one_line_error(proc, 1, 'cannot write the result into', 'directory')


@pytest.mark.slow
def test_a_read_only_workdir_is_one_line(
  straight_run, fashion_data_dir, tmp_path, small_disk
):
  workdir = small_disk('run', 512)
  shutil.copytree(straight_run / 'checkpoints', f'{workdir}/checkpoints')
  before = checkpoint_bytes(tmp_path / 'run' / 'checkpoints')
  subprocess.run(['mount', '-o', 'remount,ro', workdir], check=True)
  proc = run_train(*cli_args(fashion_data_dir, workdir))
  assert_one_line_error(proc, 1, 'cannot be written', 'Read-only')
  assert checkpoint_bytes(tmp_path / 'run' / 'checkpoints') == before


# Issue 51: everything the optimizer holds is the run's state. Adam's slots
# and iteration count, the cosine it reads them through, the moving average
# of the weights (swapped in for the evaluation, after the last save).
ADAM = (
  '--config.optimizer=adam', '--config.learning_rate=0.002',
  '--config.schedule=cosine_decay', '--config.schedule_args.warmup_steps=30',
  '--config.optimizer_args.use_ema',
)  # fmt: skip
# Each mode's flags: `fused` as cli_args has it, 10 steps a call; mirrored
# over two logical CPUs, XLA on each replica.
ADAM_MODES = {
  'off': ('--jit=off', '--config.steps_per_loop=1'),
  'on': ('--jit=on', '--config.steps_per_loop=1'),
  'fused': ('--jit=on', '--config.steps_per_loop=10'),
  'mirrored': (
    '--strategy=mirrored',
    '--config.num_cpu_devices=2',
    '--config.steps_per_loop=1',
  ),
}


def adam_args(data_dir, workdir, mode: str, *extra: str) -> list[str]:
  return cli_args(data_dir, workdir, *ADAM, *ADAM_MODES[mode], *extra)


@pytest.fixture(scope='module')
def adam_runs(fashion_data_dir, tmp_path_factory):
  """Each mode's uninterrupted Adam run, made when a test first asks."""
  made = {}

  def run(mode: str):
    if mode not in made:
      workdir = tmp_path_factory.mktemp(f'adam-{mode}')
      proc = run_train(*adam_args(fashion_data_dir, workdir, mode))
      assert proc.returncode == 0, proc.stderr[-3000:]
      made[mode] = workdir
    return made[mode]

  return run


@pytest.mark.slow
def test_a_mixed_float16_run_resumes_its_loss_scale_bit_for_bit(
  fashion_data_dir, tmp_path
):
  """Under `mixed_float16` the optimizer is Keras's LossScaleOptimizer: its
  scale and its count of good steps are the run's state too, beside Adam's
  slots, the moving average and the iteration count."""
  straight, stopped = tmp_path / 'straight', tmp_path / 'stopped'
  fp16 = ('--config.precision=mixed_float16',)
  proc = run_train(*adam_args(fashion_data_dir, straight, 'fused', *fp16))
  assert proc.returncode == 0, proc.stderr[-3000:]
  state = final_state(straight)
  for held in ('dynamic_scale', 'step_counter', 'inner_optimizer/_variables'):
    assert any(k.startswith(f'optimizer/{held}') for k in state), held
  args = adam_args(fashion_data_dir, stopped, 'fused', *fp16)
  assert_stops_and_resumes_alike(args, stopped, straight)
  assert json.loads((stopped / 'result.json').read_text())['precision'] == (
    'mixed_float16'
  )


@pytest.mark.slow
@pytest.mark.parametrize('mode', ADAM_MODES)
def test_an_adam_run_stopped_and_resumed_ends_bit_for_bit(
  mode, adam_runs, fashion_data_dir, tmp_path
):
  straight = adam_runs(mode)
  state = final_state(straight)
  # Per weight (W, b): Adam's two slots and the moving average.
  held = [k for k in state if k.startswith('optimizer/_variables/')]
  assert len(held) == 2 * 3, held
  assert state['optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE'] == CLI_STEPS
  args = adam_args(fashion_data_dir, tmp_path, mode)
  assert_stops_and_resumes_alike(args, tmp_path, straight)
  rates = dict(event_scalars(str(tmp_path), 'train/learning_rate'))
  assert rates[10] == pytest.approx(0.002 * 9 / 30)  # Warming up.
  assert rates[CLI_STEPS] < rates[40] < 0.002  # Decaying.


@pytest.mark.slow
@pytest.mark.parametrize(
  'flags, field, stored, given',
  [
    (
      ('--config.optimizer=sgd', '--config.learning_rate=0.002'),
      'optimizer', "'adam'", "'sgd'",
    ),
    (ADAM[:-1], 'optimizer_args.use_ema', 'True', 'None'),
    (
      (*ADAM, '--config.schedule_args.alpha=0.1'),
      'schedule_args.alpha', 'None', '0.1',
    ),
  ],
)  # fmt: skip
def test_resuming_an_adam_run_with_another_optimizer_is_one_line(
  flags, field, stored, given, adam_runs, fashion_data_dir, tmp_path
):
  shutil.copytree(adam_runs('fused') / 'checkpoints', tmp_path / 'checkpoints')
  before = checkpoint_bytes(tmp_path / 'checkpoints')
  args = cli_args(fashion_data_dir, tmp_path, *flags)
  proc = run_train(*args)
  assert_one_line_error(
    proc, 2, f'with {field} {stored}', f'has {given}', '--fresh'
  )
  assert checkpoint_bytes(tmp_path / 'checkpoints') == before
