"""`python -m xla_mnist.train` as users run it: real data, real flags."""

import json
import os
import socket
import time
import urllib.parse

import pytest
from support.cli import FASHION, REPO, assert_one_line_error, run_train


@pytest.mark.slow
@pytest.mark.parametrize('jit', ['off', 'on', 'auto'])
def test_trains_fashion_mnist_to_the_tf1_accuracy(
  jit, fashion_data_dir, tmp_path
):
  workdir = tmp_path / 'run'
  proc = run_train(
    FASHION,
    f'--jit={jit}',
    f'--data_dir={fashion_data_dir}',
    f'--workdir={workdir}',
    TF_CPP_MIN_LOG_LEVEL='0',  # Shows XLA's "Compiled cluster" line.
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  # The data was prepared by the fixture: this run only reads it.
  assert 'using fashion_mnist IDX files' in proc.stdout
  result = json.loads((workdir / 'result.json').read_text())
  assert result['test_accuracy'] >= 0.82, proc.stdout
  assert f'test accuracy {result["test_accuracy"]:.4f}' in proc.stdout
  assert result['jit'] == jit and result['steps'] == 1000
  assert result['traces'] == 1
  assert (
    sum(f'step {i:>6}/1000' in proc.stdout for i in range(100, 1001, 100)) == 10
  )
  compiled = 'Compiled cluster using XLA' in proc.stderr
  assert compiled == (jit != 'off'), 'XLA must run exactly for on and auto'
  assert any(
    name.startswith('events.out.tfevents') for name in os.listdir(workdir)
  )


@pytest.mark.slow
def test_default_workdir_is_named_after_config_and_jit_and_kept_when_done(
  fashion_data_dir, tmp_path
):
  args = (
    f'--config={REPO}/configs/fashion_mnist.py',
    '--jit=off',
    '--config.num_steps=5',
    f'--data_dir={fashion_data_dir}',
  )
  proc = run_train(*args, cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'outputs in logs/fashion_mnist-off' in proc.stdout
  result = tmp_path / 'logs' / 'fashion_mnist-off' / 'result.json'
  first = result.read_text()
  assert json.loads(first)['steps'] == 5
  # The same command again: the run is finished, so it says so and keeps it.
  again = run_train(*args, cwd=str(tmp_path))
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'holds this finished run (5 steps)' in again.stdout
  accuracy = json.loads(first)['test_accuracy']
  assert f'test accuracy {accuracy:.4f}' in again.stdout
  assert result.read_text() == first


@pytest.mark.slow
@pytest.mark.parametrize(
  'args, code, fragments',
  [
    (['--jit=fast'], 2, ['--jit=fast', 'off|on|auto']),
    (['--device=npu'], 2, ['--device=npu']),
    (['--config=configs/nope.py'], 2, ['config file', 'nope.py', 'does not']),
    (['--config=nope'], 2, ["no packaged config 'nope'", 'fashion_mnist']),
    (['--config.num_steps=0'], 2, ['num_steps is 0']),
    (['--config.batch_size=-5'], 2, ['batch_size is -5']),
    (['--config.learning_rate=inf'], 2, ['learning_rate is inf']),
    (['--config.dataset=cifar'], 2, ["dataset 'cifar'", 'TFDS registers']),
    (['--config.dataset=CIFAR 10'], 2, ["dataset 'CIFAR 10'", 'a TFDS name']),
    (['--config.nosuch=1'], 2, ['no field', 'nosuch']),
    (['--config.num_steps=many'], 2, ['--config.num_steps=many']),
    (['stray'], 2, ['unexpected arguments stray']),
    # After TF's import, whose start-up lines differ with oneDNN on and off.
    pytest.param(
      ['--device=gpu'],
      1,
      ['no GPU', 'CPU:0', 'TF_CPP_MIN_LOG_LEVEL=0'],
      marks=pytest.mark.kernels,
    ),
    pytest.param(
      ['--config.idx_dir=/nonexistent'],
      1,
      ['/nonexistent does not exist'],
      marks=pytest.mark.kernels,
    ),
  ],
)
def test_bad_input_is_one_line_and_an_exit_code(
  args, code, fragments, tmp_path
):
  # A data dir of the test's: a case refused once the data are loaded
  # would otherwise prepare them in the repository's ./data.
  proc = run_train(
    FASHION, f'--workdir={tmp_path / "run"}', f'--data_dir={tmp_path / "data"}',
    *args,
  )  # fmt: skip
  assert_one_line_error(proc, code, *fragments)
  workdir = tmp_path / 'run'
  usage = code == 2  # Rejected before anything starts.
  assert not workdir.exists() if usage else not any(workdir.rglob('*'))


def test_bad_user_config_syntax_is_named(tmp_path):
  bad = tmp_path / 'broken.py'
  bad.write_text('def get_config(:\n')
  proc = run_train(f'--config={bad}', f'--workdir={tmp_path / "run"}')
  assert_one_line_error(proc, 2, 'broken.py line 1')


@pytest.mark.slow
def test_workdir_that_is_a_file_is_refused(tmp_path):
  target = tmp_path / 'file'
  target.write_text('keep me')
  proc = run_train(FASHION, f'--workdir={target}')
  assert_one_line_error(proc, 1, 'is a file')
  assert target.read_text() == 'keep me'


@pytest.mark.slow
def test_mnist_offline_says_how_to_train_offline(tmp_path):
  from tensorflow_datasets.image_classification import mnist

  host = urllib.parse.urlparse(mnist.MNIST.URL).hostname
  try:
    socket.create_connection((host, 443), timeout=3).close()
    pytest.skip(f'{host} is reachable: MNIST would download, not fail')
  except OSError:
    pass
  proc = run_train(f'--data_dir={tmp_path}', f'--workdir={tmp_path / "run"}')
  assert_one_line_error(
    proc,
    1,
    'cannot be downloaded',
    '--config.idx_dir',
    'the fashion_mnist config',
  )


@pytest.mark.slow
def test_a_repeat_run_loads_its_programs_from_the_xla_cache(
  fashion_data_dir, tmp_path
):
  cache = tmp_path / 'xla'
  args = (
    FASHION,
    '--config.num_steps=30',
    f'--data_dir={fashion_data_dir}',
    f'--workdir={tmp_path / "run"}',
    f'--xla_cache_dir={cache}',
    '--fresh',
  )
  result = tmp_path / 'run' / 'result.json'
  first = run_train(*args)
  assert first.returncode == 0, first.stderr[-3000:]
  first_result = json.loads(result.read_text())
  assert f'XLA cache {cache}: 2 compiled now, stored' in first.stdout
  entries = sorted(p.name for p in cache.iterdir())
  assert len(entries) == 2 and all(e.endswith('.pb') for e in entries)
  again = run_train(*args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f'XLA cache {cache}: all loaded from it' in again.stdout
  assert sorted(p.name for p in cache.iterdir()) == entries
  # The loaded programs compute what the compiled ones did.
  again_result = json.loads(result.read_text())
  for figure in ('final_loss', 'test_accuracy'):
    assert again_result[figure] == first_result[figure]


# What a default run must not load: each loads only when a run asks for it
# (a user's model, a strategy, a checkpoint to resume or a damaged folder, a
# cache fault, dumps, a profiler port, data not yet prepared, an optimizer
# beyond plain SGD) or is a tool's.
LAZY = (
  'xla_mnist.zoo.factory',
  'xla_mnist.replicated',
  'xla_mnist.runtime.strategies',
  'xla_mnist.workdir.resuming',
  'xla_mnist.workdir.checkpoint_repair',
  'xla_mnist.inspection.profiler_server',
  'xla_mnist.inspection.hlo',
  'xla_mnist.inspection.model_notes',
  'xla_mnist.runtime.cache_faults',
  'xla_mnist.runtime.cluster',
  'xla_mnist.runtime.tf_config',
  'xla_mnist.runtime.cluster_dumps',
  'xla_mnist.runtime.user_flags',
  'xla_mnist.datasets.idx_builder',
  'xla_mnist.datasets.prepare',
  'xla_mnist.datasets.fields',
  'xla_mnist.datasets.registered',
  'xla_mnist.datasets.folder',
  'xla_mnist.input_pipeline',
  'xla_mnist.optimizers',
  'xla_mnist.user_config',
  'xla_mnist.compare',
  'xla_mnist.inspection.comparison',
  'xla_mnist.inspection.why',
  'xla_mnist.export.trained',
  'xla_mnist.workdir.recorded',
)
# The project's own lines one default run may import (issues 40 and 50): a
# core a reader can hold, with the machinery it needs; what a dataset, a
# resume, a strategy or a fault needs loads when a run asks for it.
MOST_LINES = 5000
COUNTING = """
import atexit, json, runpy, sys
def report():
  own = {n: m.__file__ for n, m in list(sys.modules.items())
         if n.startswith('xla_mnist') and getattr(m, '__file__', None)}
  lines = sum(sum(1 for _ in open(f)) for f in set(own.values()))
  print('OWN ' + json.dumps({'modules': sorted(own), 'lines': lines}))
atexit.register(report)
sys.argv[0] = 'xla_mnist.train'
runpy.run_module('xla_mnist.train', run_name='__main__', alter_sys=True)
"""


@pytest.mark.slow
def test_a_default_run_imports_only_what_it_uses(fashion_data_dir, tmp_path):
  """Counted as the run ends, from `sys.modules` (the entry, run as
  `__main__`, included): what is lazy stays unloaded, and the total stays
  within what a reader can hold."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  from xla_mnist.datasets import prepare  # noqa: PLC0415

  (tmp_path / 'cache').mkdir(mode=0o700)  # As an earlier run leaves it.
  # A run stamps the data's files once they have settled; later runs only
  # read them (datasets/prepared.py): this test counts such a run.
  time.sleep(prepare.SETTLED_NS / 1e9)
  stamp = 'import sys; from xla_mnist import data; data.load(*sys.argv[1:])'
  # As a user's shell starts it: no XLA flags (an in-process test of this
  # worker may have set some in its environment).
  env = {k: v for k, v in os.environ.items() if 'XLA_FLAGS' not in k}
  subprocess.run(
    [sys.executable, '-c', stamp, 'fashion_mnist', '', fashion_data_dir],
    cwd=REPO, check=True, capture_output=True, timeout=300, env=env,
  )  # fmt: skip
  proc = subprocess.run(
    [
      sys.executable, '-c', COUNTING, FASHION, '--config.num_steps=200',
      f'--data_dir={fashion_data_dir}', f'--workdir={tmp_path / "run"}',
      f'--xla_cache_dir={tmp_path / "cache"}',
    ],
    cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(x for x in proc.stdout.splitlines() if x.startswith('OWN '))
  own = json.loads(line[4:])
  loaded = [m for m in LAZY if m in own['modules']]
  assert not loaded, f'a default run loaded {loaded}'
  assert 'xla_mnist.trainer' in own['modules']  # It counted the run.
  entry = os.path.join(REPO, 'xla_mnist', 'train.py')
  with open(entry) as f:
    lines = own['lines'] + sum(1 for _ in f)
  assert lines <= MOST_LINES, f'{lines} lines of our own code in one run'
