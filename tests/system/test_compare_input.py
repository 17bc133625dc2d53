"""compare, --dump_hlo's dumps and the benchmarks: input checked before the
first run, nothing deleted that the command did not write, figures kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support.bench import report_with
from support.cli import REPO, run_compare, run_module, run_train
from support.idx import make_idx_folder

from xla_mnist.inspection import why


def one_line(proc: subprocess.CompletedProcess, code: int) -> str:
  assert proc.returncode == code, proc.stderr[-2000:]
  [line] = proc.stderr.strip().splitlines()  # One line, no traceback.
  assert line.startswith('error: ')
  return line


def listing(folder) -> dict[str, float]:
  """Every file under `folder` and its mtime: what a command left alone."""
  found = {}
  for root, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(root, name)
      found[path] = os.stat(path).st_mtime_ns
  return found


def training_run(folder) -> dict[str, float]:
  """A folder that looks like a training run's workdir."""
  os.makedirs(folder / 'checkpoints')
  (folder / 'result.json').write_text('{}')
  (folder / 'events.out.tfevents.1.host').write_bytes(b'events')
  (folder / 'checkpoints' / 'checkpoint').write_text('x')
  return listing(folder)


def test_compare_refuses_a_training_runs_workdir_and_deletes_nothing(tmp_path):
  run = tmp_path / 'fashion_mnist-on'
  before = training_run(run)
  line = one_line(run_compare(f'--workdir={run}'), 1)
  assert 'compare did not write' in line and '--workdir=DIR' in line
  assert listing(run) == before


@pytest.mark.parametrize(
  'names',
  [
    ['notes.txt'],  # Anything of the user's.
    ['events.out.tfevents.1.host'],  # Events, with nothing of compare's.
    ['off', 'report.md'],  # compare's folder, with another's file in it.
  ],
)
def test_compare_refuses_a_folder_holding_what_it_did_not_write(
  tmp_path, names
):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  for name in names:
    if name in ('off',):
      (workdir / name).mkdir()
    else:
      (workdir / name).write_text('mine')
  before = listing(workdir)
  line = one_line(run_compare(f'--workdir={workdir}'), 1)
  assert 'compare did not write' in line
  assert listing(workdir) == before


def test_compare_waits_for_no_one_a_locked_workdir_is_refused(tmp_path):
  from xla_mnist.workdir import files

  workdir = tmp_path / 'w'
  workdir.mkdir()
  with files.workdir_lock(str(workdir)):
    line = one_line(run_compare(f'--workdir={workdir}'), 1)
  assert 'in use by another run' in line


@pytest.mark.parametrize(
  ('flags', 'code', 'named'),
  [
    (['--config.num_steps=1'], 2, 'nothing left to time'),
    (['--config.num_steps=100'], 2, '--config.steps_per_loop below 100'),
    (
      ['--config.steps_per_loop=10', '--config.num_steps=5'],
      2,
      'nothing left to time',
    ),
    (  # Debian's Fashion-MNIST: its IDX header says 60,000.
      ['--config=fashion_mnist', '--sweep=batch_size=10,100000'],
      2,
      'pass --sweep with sizes from 1 to 60000',
    ),
    (
      ['--config=fashion_mnist', '--config.batch_size=70000'],
      2,
      'pass --config.batch_size with',
    ),
    (['--config.learning_rat=0.1'], 2, 'no field'),
    (
      ['--strategy=mirrored', '--config.steps_per_loop=10'],
      2,
      'the fused run would fail',
    ),
    (['--config.profile_steps=-1'], 2, 'compare profiles every mode'),
  ],
)
def test_compare_checks_every_run_before_the_first(
  tmp_path, flags, code, named
):
  workdir = tmp_path / 'w'
  line = one_line(run_compare(*flags, f'--workdir={workdir}'), code)
  assert named in line
  assert not workdir.exists()  # No run started, nothing written.


def test_a_sweep_on_a_small_idx_folder_is_checked_against_its_size(tmp_path):
  idx = tmp_path / 'idx'
  make_idx_folder(str(idx), train=300)
  proc = run_compare(
    f'--config.idx_dir={idx}',
    '--sweep=batch_size=10,500',
    f'--workdir={tmp_path / "w"}',
  )
  assert 'training split of 300 examples' in one_line(proc, 2)


def test_compare_refuses_a_page_it_cannot_write_before_any_run(tmp_path):
  (tmp_path / 'folder.md').mkdir()
  (tmp_path / 'chart').mkdir()
  (tmp_path / 'chart' / 'why.png').mkdir()
  (tmp_path / 'README.md').write_text('# mine\n')
  (tmp_path / 'file').write_text('x')
  cases = [
    (tmp_path / 'folder.md', 'is a folder'),
    (tmp_path / 'chart' / 'why.md', "page's chart"),
    (tmp_path / 'README.md', 'not a page compare generated'),
    (tmp_path / 'file' / 'why.md', 'cannot be written'),
  ]
  for page, named in cases:
    workdir = tmp_path / 'w'
    line = one_line(run_compare(f'--page={page}', f'--workdir={workdir}'), 1)
    assert named in line and '--page' in line
    assert not workdir.exists()
  assert (tmp_path / 'README.md').read_text() == '# mine\n'


def test_compare_refuses_a_workdir_that_is_a_file(tmp_path):
  target = tmp_path / 'file'
  target.write_text('x')
  assert 'is a file' in one_line(run_compare(f'--workdir={target}'), 1)
  workdir = tmp_path / 'w'
  (workdir / 'compare.md').mkdir(parents=True)
  assert 'is a folder' in one_line(run_compare(f'--workdir={workdir}'), 1)


def test_sweep_runs_hold_two_calls_so_that_they_are_timed():
  assert why.sweep_steps(60000, 1000, 100, 100) == 200
  assert why.sweep_steps(60000, 150, 100, 100) == 150  # The main run's.


# --dump_hlo --jit=auto: clusters/ kept by every run that does not train.


def auto_run(workdir, idx, *flags):
  return run_train(
    '--jit=auto',
    '--dump_hlo',
    '--config.num_steps=4',
    '--config.batch_size=10',
    '--config.checkpoint_every=2',
    f'--config.idx_dir={idx}',
    f'--data_dir={idx.parent / "tfds"}',
    f'--workdir={workdir}',
    *flags,
  )


@pytest.mark.slow
def test_cluster_dumps_survive_runs_that_do_not_train(tmp_path):
  idx = tmp_path / 'idx'
  make_idx_folder(str(idx))
  workdir = tmp_path / 'w'
  proc = auto_run(workdir, idx)
  assert proc.returncode == 0, proc.stderr[-2000:]
  dumps = listing(workdir / 'clusters')
  assert dumps, 'the run dumped no clusters'
  assert not any('.dumping-' in path for path in dumps)
  again = auto_run(workdir, idx)  # Finished: left as it is.
  assert again.returncode == 0 and 'finished run' in again.stdout
  assert listing(workdir / 'clusters') == dumps
  refused = auto_run(workdir, idx, '--config.learning_rate=0.1')
  assert refused.returncode == 2, refused.stderr[-2000:]
  assert listing(workdir / 'clusters') == dumps
  # A fresh run trains: its dumps replace the earlier ones, a whole set.
  started = time.time_ns()
  fresh = auto_run(workdir, idx, '--fresh')
  assert fresh.returncode == 0, fresh.stderr[-2000:]
  now = listing(workdir / 'clusters')
  assert now and not any('.dumping-' in path for path in now)
  assert all(mtime >= started for mtime in now.values())  # None earlier.
  assert 'auto-clustering: ' in fresh.stdout


def test_compare_does_not_import_tensorflow_before_its_runs():
  code = (
    'import sys; from xla_mnist import compare, train;'
    "assert 'tensorflow' not in sys.modules; print(json.dumps(1))"
  )
  proc = subprocess.run(
    [sys.executable, '-c', 'import json;' + code],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout) == 1


# The benchmarks: output paths checked before measuring, any report held.


def variant(**changed) -> dict:
  report = report_with()
  report['variants'][0].update(changed)
  return report


BAD_REPORTS = {
  'empty file': b'',
  'not UTF-8': b'{"date": "\xff\xfe"}',
  'not JSON': b'{"date": ',
  'a list': b'[1, 2]',
  'a string': b'"report"',
  'null': b'null',
  'a number too long': b'{"steps": ' + b'9' * 5000 + b'}',
  'nested too deep': b'[' * 100000 + b']' * 100000,
  'a list for the machine': json.dumps({**report_with(), 'machine': []}),
  'a dict for the variants': json.dumps({**report_with(), 'variants': {}}),
  'a string for a number': json.dumps(variant(compile_seconds='1.0')),
  'a null rate': json.dumps(variant(steps_per_second=None)),
  'a zero rate': json.dumps(variant(steps_per_second=0)),
  'a rate too small': json.dumps(variant(steps_per_second=1e-320)),
  'a huge number': json.dumps(variant(train_seconds=10**400)),
  'a number for a name': json.dumps(variant(variant=5, steps_per_second=[])),
  'variants of numbers': json.dumps({**report_with(), 'variants': [1]}),
  'a null load': json.dumps({**report_with(), 'load_average': None}),
  'processes of strings': json.dumps({**report_with(), 'processes': ['x']}),
  'a kernels list': json.dumps({**report_with(), 'kernels': [1]}),
  'an infinite time': json.dumps(variant(train_seconds=float('inf'))),
  'a NaN accuracy': json.dumps(variant(test_accuracy=float('nan'))),
  'a bool for a rate': json.dumps(variant(steps_per_second=True)),
  'no rounds (an older report)': json.dumps(variant(round_train_seconds=None)),
  'rounds of unequal counts': json.dumps(
    {
      **report_with(),
      'variants': [
        report_with()['variants'][0],
        {
          **report_with()['variants'][0],
          'variant': 'jax lax.scan',
          'round_train_seconds': [1.0, 2.0],
        },
      ],
    }
  ),
}


@pytest.mark.parametrize('content', BAD_REPORTS.values(), ids=BAD_REPORTS)
def test_results_holds_on_any_report_in_one_line(tmp_path, content):
  report = tmp_path / 'bench.json'
  report.write_bytes(content.encode() if isinstance(content, str) else content)
  page = tmp_path / 'results.md'
  proc = run_module('benchmarks.results', str(report), str(page))
  assert 'run make bench' in one_line(proc, 1)
  assert not page.exists()


def test_results_holds_on_a_folder_or_a_missing_report(tmp_path):
  page = tmp_path / 'results.md'
  for report in (tmp_path, tmp_path / 'missing.json'):
    proc = run_module('benchmarks.results', str(report), str(page))
    assert 'cannot be read' in one_line(proc, 1)
  assert not page.exists()


def test_results_renders_the_good_report(tmp_path):
  report = tmp_path / 'bench.json'
  report.write_text(json.dumps(report_with()))
  proc = run_module('benchmarks.results', str(report), str(tmp_path / 'r.md'))
  assert proc.returncode == 0, proc.stderr
  assert (tmp_path / 'r.md').read_text().startswith('# Benchmark results')


@pytest.mark.parametrize('which', ['out', 'page'])
@pytest.mark.parametrize('where', ['a folder', 'in a file'])
def test_bench_checks_its_outputs_before_measuring(tmp_path, which, where):
  (tmp_path / 'file').write_text('x')
  bad = str(tmp_path if where == 'a folder' else tmp_path / 'file' / 'x.json')
  paths = {'out': str(tmp_path / 'bench.json'), 'page': ''}
  paths[which] = bad
  proc = run_module(
    'benchmarks.bench',
    f'--out={paths["out"]}',
    f'--page={paths["page"]}',
    '--noinference',
    timeout=60,  # Before TF's import: at once, not after minutes.
  )
  line = one_line(proc, 1)
  assert 'cannot be written' in line and f'--{which}=FILE' in line
  assert sorted(os.listdir(tmp_path)) == ['file']


def test_bench_keeps_a_report_that_its_out_cannot_take(tmp_path):
  from benchmarks import bench

  where = bench._kept('{"figures": 1}\n')
  path = where.removeprefix('kept in ')
  try:
    with open(path) as f:
      assert json.load(f) == {'figures': 1}
  finally:
    os.remove(path)


@pytest.mark.slow
def test_train_refuses_a_compares_workdir_and_deletes_nothing(tmp_path):
  workdir = tmp_path / 'compare'
  workdir.mkdir()
  (workdir / 'compare.json').write_text('{}')
  (workdir / 'events.out.tfevents.1.host').write_bytes(b'the Text tab')
  before = listing(workdir)
  idx = tmp_path / 'idx'
  make_idx_folder(str(idx))
  proc = run_train(
    '--fresh',
    '--config.num_steps=2',
    f'--config.idx_dir={idx}',
    f'--data_dir={tmp_path / "tfds"}',
    f'--workdir={workdir}',
  )
  assert 'holds a comparison' in one_line(proc, 1)
  assert listing(workdir) == before
