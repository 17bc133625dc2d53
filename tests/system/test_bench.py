"""The benchmark run whole: its training variants, whole processes, an
export's inference and the kernel comparison; its flags checked first."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from support.aot import RUNTIME_DIR, building_lock
from support.bench import report_with
from support.cli import REPO, assert_one_line_error, run_module

from benchmarks import (
  baselines,
  bench,
  inference,
  kernels,
  process,
  results,
  threads,
)
from xla_mnist import data
from xla_mnist.configs import fashion_mnist
from xla_mnist.export import build
from xla_mnist.runtime.errors import UserError


@pytest.mark.slow
def test_benchmark_measures_every_variant(fashion_data_dir, tmp_path):
  data_dir = fashion_data_dir
  out, page = tmp_path / 'bench.json', tmp_path / 'results.md'
  args = [
    '--steps=100',
    '--repeats=1',
    '--process_runs=1',
    '--scaling',
    '--noinference',  # test_inference_times_each_way_to_classify.
    '--model_steps=20',
    '--fit_steps=0',  # test_the_loop_runs_beside_fit_at_each_matching_setting.
    f'--out={out}',
    f'--page={page}',
  ]
  proc = subprocess.run(
    [sys.executable, '-m', 'benchmarks.bench', *args, f'--data_dir={data_dir}'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  report = json.loads(out.read_text())
  variants = {v['variant']: v for v in report['variants']}
  if report['jax_skipped'] and os.environ.get('CI'):  # `make test` has JAX.
    pytest.fail(f'JAX skipped under CI: {report["jax_skipped"]}')
  jax = [] if report['jax_skipped'] else list(JAX_ROWS)
  assert list(variants) == [
    'numpy',
    'TF1 session',
    'TF1 session, XLA ON_1',
    'Keras fit, XLA, 100 steps/execution',
    'eager',
    'tf.function',
    'trainer --jit=off',
    'jit per step',
    'auto-clustering',
    'fused K=10',
    'fused K=100',
    'fused K=100, Dense',
    'fused K=all',
    *jax,
  ]
  clustered = ('auto-clustering', 'TF1 session, XLA ON_1')
  for v in variants.values():
    assert v['train_seconds'] > 0 and v['compile_seconds'] >= 0, v
    assert v['steps_per_second'] > 0 and 0 <= v['test_accuracy'] <= 1, v
    # Auto-clustering and TF1's ON_1 compiled XLA clusters, no other did.
    assert (v['cluster_compiles'] > 0) == (v['variant'] in clustered), v
    if v['variant'].startswith('Keras'):  # Reports no per-step losses.
      assert v['head_losses'] == [] and v['final_loss'] is None, v
      continue
    # The same batches in the same order: the first losses agree to rounding
    # (different batches differ by percents), exactly among the XLA ones.
    np.testing.assert_allclose(
      v['head_losses'], variants['tf.function']['head_losses'], rtol=1e-3
    )
    same_program = not v['variant'].endswith('Dense')  # Dots of a layout.
    if v['variant'].startswith(('auto', 'fused')) and same_program:
      np.testing.assert_allclose(
        v['head_losses'], variants['jit per step']['head_losses'], rtol=1e-5
      )
  assert variants['fused K=100']['vs_fused'] == 1.0
  # Each ran at the setting its row names: TF at the config's threads, JAX
  # at its defaults (XLA's pool a thread per CPU) and at one thread.
  own = fashion_mnist.get_config().cpu_threads
  assert variants['fused K=100']['threads'] == threads.tf(own)
  cpus = len(os.sched_getaffinity(0))
  for name, ran_at in JAX_ROWS.items():
    if not report['jax_skipped']:
      assert variants[name]['threads'] == ran_at.format(cpus=cpus), name
  calls = [variants[f'fused K={k}']['steps_per_loop'] for k in (10, 'all')]
  assert calls == [10, 100]
  assert '| fused K=all | 100 |' in proc.stdout
  programs = {p['program']: p['threads'] for p in report['processes']}
  jax_program = (
    {}
    if report['jax_skipped']
    else {
      'JAX lax.scan program': "JAX's defaults",
      'JAX lax.scan program, 1 thread': 'PJRT_NPROC=1',
    }
  )
  # The trainer at 1, 0 and 2 threads, plain at the config's own.
  trainers = {process.trainer_name(n): threads.tf(n) for n in (1, 0, 2)}
  assert 'python -m xla_mnist.train' in trainers
  assert programs == {
    **trainers,
    **jax_program,
    'TF1 program, XLA ON_1': 'TF1 ConfigProto, 1 thread a pool',
  }
  for p in report['processes']:
    assert p['wall_seconds'] > 0 and p['peak_mib'] > 0, p
    assert [r['wall_seconds'] for r in p['rounds']] == [p['wall_seconds']]
  sizes = [(s['batch_size'], s['steps']) for s in report['scaling']]
  assert sizes == [(100, 100), (1000, 100), (10000, 100)] + [
    (100, 1000),
    (100, 10000),
  ]
  text = page.read_text()
  assert report['machine']['cpu'] in text and report['date'] in text
  assert '## Goals' in text and '| fused K=100 | 100 |' in text
  assert "## The trainer's thread count" in text
  # Each packaged model's own default program against off: the CNN's
  # config runs one step per call, the others fuse all 20 steps.
  by_model = report['by_model']
  assert by_model['steps'] == 20
  assert list(by_model['models']) == ['softmax', 'mlp', 'cnn']
  for name, measured in by_model['models'].items():
    runs = {m['variant']: m for m in measured}
    assert list(runs) == ['fused', 'off'], name
    assert runs['fused']['steps_per_loop'] == (1 if name == 'cnn' else 20)
    assert runs['off']['steps_per_loop'] == 1
    for m in measured:
      assert m['train_seconds'] > 0 and m['timed_steps'] > 0, m
      assert 0 <= m['test_accuracy'] <= 1, m
    # The speed-up is measured: off's time per step over fused's.
    fused, off = (
      runs['fused']['steps_per_second'],
      runs['off']['steps_per_second'],
    )
    assert runs['off']['vs_fused'] == pytest.approx(fused / off)
    # Same batches, same model: the first losses agree to rounding.
    np.testing.assert_allclose(
      runs['fused']['head_losses'], runs['off']['head_losses'], rtol=1e-3
    )
  assert '## By model' in text and '| cnn | 1 |' in text
  assert 'versus_fit' not in report and results.FIT_HEADING not in text


def test_the_table_against_fit_trains_each_packaged_model_with_sgd_and_adam():
  """Each packaged model, its own rate for SGD and Keras's default for Adam;
  the CNN for fewer steps."""
  configs = bench.fit_configs(40, 6)
  assert [
    (c.model, c.optimizer, c.learning_rate, c.num_steps) for c in configs
  ] == [
    ('softmax', 'sgd', 0.5, 40),
    ('softmax', 'adam', 1e-3, 40),
    ('mlp', 'sgd', 0.1, 40),
    ('mlp', 'adam', 1e-3, 40),
    ('cnn', 'sgd', 0.1, 6),
    ('cnn', 'adam', 1e-3, 6),
  ]


@pytest.mark.slow
def test_the_loop_runs_beside_fit_at_each_matching_setting(fashion_data_dir):
  """A small real run of the table against fit, the softmax's (the other
  models' run alike, the CNN's compiles for seconds a run): each mode's
  loop and fit at the same K, on the same batches from the same weights
  with the same optimizer, and the page's section made from it."""
  from benchmarks import training  # noqa: PLC0415 - TF is imported above.

  configs = [c for c in bench.fit_configs(20, 4) if c.model == 'softmax']
  versus = training.versus_fit(configs, fashion_data_dir, 1, 10, lambda _: 0)
  versus = json.loads(json.dumps(versus))  # As the report holds it.
  sides = ('loop', 'fit')
  assert versus['k'] == 10
  assert [(r['model'], r['optimizer']) for r in versus['runs']] == [
    ('softmax', 'sgd'),
    ('softmax', 'adam'),
  ]
  for run in versus['runs']:
    measured = {m['variant']: m for m in run['measurements']}
    assert list(measured) == [
      f'{side} {mode}' for mode in results.FIT_SETTINGS for side in sides
    ]
    calls = {v: m['steps_per_loop'] for v, m in measured.items()}
    assert calls == {v: 10 if v.endswith('fused') else 1 for v in measured}
    # Timed: the steps after the first call (the fused loop's warm-up runs
    # one step and undoes it) or fit's first execution.
    timed = {v: m['timed_steps'] for v, m in measured.items()}
    assert timed == {
      **{f'{side} {mode}': 19 for mode in ('off', 'on') for side in sides},
      'loop fused': 20,
      'fit fused': 10,
    }
    assert all(m['train_seconds'] > 0 for m in measured.values())
    # From the same weights on the same batches with the same Adam: the
    # runs end alike (SGD at 0.5 drifts apart with the summation order).
    if run['optimizer'] == 'adam':
      accuracies = [m['test_accuracy'] for m in measured.values()]
      assert max(accuracies) - min(accuracies) < 0.01, measured
  page = results.page(report_with(versus_fit=versus))
  section = page.split(results.FIT_HEADING)[1]
  rows = [line for line in section.splitlines() if line.startswith('| ')]
  assert len(rows) == 2 + 2 * 3
  assert 'not decidable from 1 round' in rows[2]
  assert '| softmax | adam 0.001 | 20 | fused (10) | jit_compile=True,' in (
    section
  )
  assert "- training, the loop <= 1.0x Keras's fit" in page


# JAX's rows and the threads each says it ran with: XLA:CPU's pool, as the
# worker found it, a thread per CPU at JAX's defaults.
JAX_ROWS = {
  'jax jit step': "JAX's defaults, XLA pool of {cpus}",
  'jax lax.scan': "JAX's defaults, XLA pool of {cpus}",
  'jax jit step, 1 thread': 'PJRT_NPROC=1, XLA pool of 1',
  'jax lax.scan, 1 thread': 'PJRT_NPROC=1, XLA pool of 1',
}


INFERENCE_VARIANTS = ['classify', 'jit', 'saved_model']


@pytest.fixture(scope='module')
def exported_run(tmp_path_factory, fashion_data_dir):
  """A 100-step run exported by xla_mnist.aot, as `make bench` makes one.

  Needs the C++ toolchain for `classify`, and xla_mnist.aot makes the
  SavedModel only with it: without, the inference test skips, except under
  CI where that fails.
  """
  try:
    build.check_toolchain()
  except UserError as e:
    if os.environ.get('CI'):
      pytest.fail(str(e))
    pytest.skip(f'no export without the toolchain: {e}')
  with pytest.MonkeyPatch.context() as patch, building_lock():
    # The first export on a machine builds the runtime: minutes.
    patch.setenv(build.RUNTIME_ENV, RUNTIME_DIR)
    return inference.export_run(
      str(tmp_path_factory.mktemp('export')), fashion_data_dir, 100
    )


@pytest.mark.slow
def test_inference_times_each_way_to_classify(exported_run, tmp_path):
  out = tmp_path / 'inference.json'
  proc = run_module(
    'benchmarks.inference',
    f'--workdir={exported_run}',
    '--repeats=1',
    f'--out={out}',
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  report = json.loads(out.read_text())
  assert list(report['results']) == INFERENCE_VARIANTS
  for name, figures in report['results'].items():
    assert figures['us_per_image_batch_1'] > 0, (name, figures)
    assert figures['us_per_image_batch_fixed'] > 0, (name, figures)
    assert figures['startup_seconds'] > 0 and figures['peak_mib'] > 0
    assert f'| {name} |' in proc.stdout
  assert report['results']['jit']['batch'] == 100  # The export's batch.
  assert report['machine']['cpu'] and report['repeats'] == 1
  page = results.page(report_with(inference=report))
  assert '## Inference' in page and '| saved_model |' in page


def test_inference_without_an_export_is_a_one_line_error(tmp_path):
  proc = run_module('benchmarks.inference', f'--workdir={tmp_path}')
  assert_one_line_error(proc, 1, f'no export in {tmp_path}', 'xla_mnist.aot')
  assert not (tmp_path / 'aot').exists()


@pytest.mark.parametrize(
  'arg, code, fragment',
  [
    ('--steps=0', 2, '--steps=0'),
    ('--inference_workdir=/nonexistent', 1, 'no export in /nonexistent'),
    ('stray', 2, 'unexpected arguments stray'),
    ('--fit_cnn_steps=1', 2, '--fit_steps=500 --fit_cnn_steps=1'),
  ],
)
def test_benchmark_refuses_bad_flags_before_measuring(
  arg, code, fragment, tmp_path
):
  """At once: before TF's import, not after minutes of measuring."""
  out = tmp_path / 'bench.json'
  proc = run_module('benchmarks.bench', arg, f'--out={out}', '--page=')
  assert_one_line_error(proc, code, fragment)
  assert not out.exists()


@pytest.fixture(scope='module')
def profiled_sides(fashion_data_dir, tmp_path_factory):
  """TF's fused loop and JAX's lax.scan, 200 steps each, profiled as the
  benchmark profiles them. JAX from $XLA_MNIST_JAX_PYTHON (`make test` sets
  it to .venv-jax's) or this Python: without it the tests skip, except
  under CI where that fails."""
  config = fashion_mnist.get_config()
  # The threads this process runs: an earlier test may have started TF,
  # whose threads never change (another count is refused).
  threads = tf.config.threading.get_intra_op_parallelism_threads()
  config.update(num_steps=200, profile_steps=0, cpu_threads=threads)
  folder = tmp_path_factory.mktemp('kernels')
  python = os.environ.get('XLA_MNIST_JAX_PYTHON') or sys.executable
  train = data.load(config.dataset, config.idx_dir, fashion_data_dir).train
  jax = baselines.JaxVariants(python, train, config)
  try:
    if jax.skipped:
      (pytest.fail if os.environ.get('CI') else pytest.skip)(jax.skipped)
    with pytest.MonkeyPatch.context() as patch:
      patch.setenv(kernels.PROFILE_DIR_ENV, str(folder))
      jax.run()
  finally:
    jax.close()
  tf_side = kernels.profile_tf(config, fashion_data_dir, str(folder / 'tf'))
  return tf_side, kernels.read_jax(str(folder))


@pytest.mark.slow
def test_kernel_comparison_puts_every_kernel_of_both_programs_in_a_category(
  profiled_sides,
):
  tf_side, jax_side = profiled_sides
  assert tf_side is not None and jax_side is not None
  assert tf_side.step.steps == jax_side.step.steps == 200
  comparison = json.loads(json.dumps(kernels.compare(tf_side, jax_side)))
  rows = comparison['categories']
  assert [r['category'] for r in rows] == list(kernels.CATEGORIES)
  for key, side in (('tf', tf_side), ('jax', jax_side)):
    listed = sorted(k['name'] for r in rows for k in r[f'{key}_kernels'])
    assert listed == sorted(k.name for k in side.step.kernels), key
    assert sum(r[f'{key}_us'] for r in rows) == pytest.approx(
      comparison[key]['kernel_us']
    )
    # The step's maths found in each program, whatever each XLA named it.
    by_category = {r['category']: r[f'{key}_us'] for r in rows}
    for category in kernels.GATHER, kernels.FORWARD_DOT, kernels.GRADIENT_DOT:
      assert by_category[category] > 0, (key, category, by_category)
  assert comparison['tf']['versions']['tensorflow'] == tf.__version__
  assert comparison['jax']['versions']['jaxlib']
  page = results.page(report_with(kernels=comparison))
  section = page.split(results.KERNELS_HEADING)[1]
  assert '| forward dot |' in section and '| all kernels |' in section
  assert comparison['jax']['versions']['jaxlib_git'][:10] in section
  assert '- All kernels:' in section
