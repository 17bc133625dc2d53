"""`python -m xla_mnist.compare`: four modes timed and profiled, one table,
why one is faster (in figures and words), a sweep, a chart."""

import dataclasses
import json
import math
import pathlib

import pytest
from support.cli import run_compare
from support.compare import (
  COMPARE_LOOP,
  COMPARE_REPEATS,
  COMPARE_STEPS,
  COMPARE_SWEEP,
)
from support.idx import make_idx_folder
from support.xplane import tf_kernels_in_xplane

from xla_mnist import parse
from xla_mnist.inspection import breakdown, by_field, comparison, why
from xla_mnist.runtime.errors import UsageError
from xla_mnist.workdir import outputs

MODES = ['off', 'on', 'auto', 'fused']


def read(workdir: str) -> dict:
  return json.loads((pathlib.Path(workdir) / 'compare.json').read_text())


@pytest.mark.slow
def test_compare_writes_a_row_per_mode(compare_workdir):
  workdir = pathlib.Path(compare_workdir)
  results = read(compare_workdir)['results']
  assert list(results) == MODES
  assert [r['jit'] for r in results.values()] == ['off', 'on', 'auto', 'on']
  steps = [r['steps_per_loop'] for r in results.values()]
  assert steps == [1, 1, 1, COMPARE_LOOP]
  assert {r['steps'] for r in results.values()} == {COMPARE_STEPS}
  lines = (workdir / 'compare.md').read_text().splitlines()
  start = lines.index(next(x for x in lines if x.startswith('| mode | jit')))
  rows = lines[start + 2 : start + 2 + len(MODES)]
  assert [row.split(' | ')[0] for row in rows] == [f'| {m}' for m in results]
  assert (workdir / 'compare.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  for mode in results:
    assert (workdir / mode / 'result.json').is_file()


@pytest.mark.slow
def test_timed_figures_are_the_run_of_median_speed(compare_workdir):
  text = (pathlib.Path(compare_workdir) / 'compare.md').read_text()
  assert f'the median of {COMPARE_REPEATS} timed runs per mode' in text
  for mode, r in read(compare_workdir)['results'].items():
    runs = r['repeats']
    assert all(
      len(runs[key]) == COMPARE_REPEATS and all(x > 0 for x in runs[key])
      for key in runs
    )
    # One run's figures, the run of median speed (the slower of two).
    ranked = sorted(
      range(COMPARE_REPEATS), key=runs['steps_per_second'].__getitem__
    )
    median = ranked[(COMPARE_REPEATS - 1) // 2]
    for key, values in runs.items():
      assert r[key] == values[median], (mode, key)
    rates = r['repeats']['steps_per_second']
    spread = f'{max(rates) / min(rates) - 1:.0%}'
    row = next(x for x in text.splitlines() if x.startswith(f'| {mode} |'))
    assert row.split(' | ')[5] == spread, row


@pytest.mark.slow
@pytest.mark.parametrize('mode', MODES)
def test_the_step_splits_into_kernel_and_host_time(compare_workdir, mode):
  result = read(compare_workdir)['results'][mode]
  b = result['breakdown']
  # The step is the timed run's, not the profiled one's.
  assert b['step_ms'] == pytest.approx(1e3 / result['steps_per_second'])
  assert b['kernel_ms'] > 0 and b['host_ms'] > 0
  assert (
    abs(b['kernel_ms'] + b['host_ms'] - b['step_ms']) <= 0.15 * b['step_ms']
  )
  # The shares come from the profiled window, whose parts add up too.
  p = b['profiled']
  assert p['steps'] == 2 * COMPARE_LOOP
  assert (
    abs(p['kernel_ms'] + p['host_ms'] - p['step_ms']) <= 0.15 * p['step_ms']
  )
  assert b['launches_per_step'] > 0 and b['written_bytes'] > 0
  assert b['peak_host_mib'] == result['peak_host_mib']
  assert b['compile_seconds'] == result['compile_seconds']
  assert b['kernels'] and all('tf_ops' in k for k in b['kernels'])


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['on', 'fused'])
def test_every_xla_kernel_names_the_tf_ops_it_came_from(compare_workdir, mode):
  b = read(compare_workdir)['results'][mode]['breakdown']
  assert all(k['kind'] == 'xla' for k in b['kernels'])
  assert all(k['tf_ops'] for k in b['kernels']), b['kernels']
  assert b['temp_bytes'] > 0


@pytest.mark.slow
def test_off_launches_are_the_tf_kernels_the_trace_shows(compare_workdir):
  b = read(compare_workdir)['results']['off']['breakdown']
  p = b['profiled']
  assert b['launches_per_step'] == pytest.approx(
    tf_kernels_in_xplane(p['capture']) / p['steps']
  )
  assert b['temp_bytes'] == 0


@pytest.mark.slow
def test_break_even_is_against_off(compare_workdir):
  modes = comparison.Comparison.load(compare_workdir).figures
  assert modes['off'].break_even_steps is None
  for name in MODES[1:]:
    expected = why.break_even(modes[name], modes['off'])
    assert modes[name].break_even_steps == expected


@pytest.mark.slow
def test_compare_json_reads_back_into_the_comparison(compare_workdir):
  text = (pathlib.Path(compare_workdir) / 'compare.json').read_text()
  done = comparison.Comparison.from_json(text)
  assert done.to_json() == text
  assert isinstance(done.figures['fused'].kernels[0], why.MadeOf)
  assert [p.batch_size for p in done.sweep.points] == list(COMPARE_SWEEP)
  assert (
    done.text() in (pathlib.Path(compare_workdir) / 'compare.md').read_text()
  )


@pytest.mark.slow
def test_the_why_and_the_sweep_are_in_the_table_and_json(compare_workdir):
  report = read(compare_workdir)
  text = (pathlib.Path(compare_workdir) / 'compare.md').read_text()
  assert '## Why' in text and 'TensorFlow' in report['measured']
  assert 'wins on this machine' in text or 'does not win' in text
  points = report['sweep']['points']
  assert [p['batch_size'] for p in points] == list(COMPARE_SWEEP)
  for p in points:
    assert list(p['modes']) == MODES
    assert p['modes']['off']['speedup'] == 1
    row = f'| {p["batch_size"]:,} | {p["steps"]:,} | '
    assert any(line.startswith(row) for line in text.splitlines()), row
  assert '## Sweep of batch_size' in text
  small = pathlib.Path(compare_workdir, 'sweep', 'batch_size-10', 'fused')
  assert json.loads((small / 'result.json').read_text())['batch_size'] == 10


def test_a_failing_run_ends_compare_with_its_error(tmp_path):
  proc = run_compare('--config.batch_size=0', f'--workdir={tmp_path}')
  assert proc.returncode == 2
  [line] = proc.stderr.strip().splitlines()  # One line, no traceback.
  # Checked before any run starts, as the off run would check it.
  assert line.startswith('error: the off run would fail: ')
  assert '--config.batch_size' in line


def test_compare_refuses_jit(tmp_path):
  proc = run_compare('--jit=on', f'--workdir={tmp_path}')
  assert proc.returncode == 2
  assert proc.stderr.strip().endswith(
    'error: compare runs every jit mode: drop --jit'
  )


@pytest.mark.parametrize(
  ('flag', 'named'),
  [
    ('--sweep=jit=on,off', 'jit cannot be swept: pass --sweep=FIELD=V,V'),
    ('--sweep=learning_rate=0.1,x,inf', "'x', 'inf' are no learning_rate"),
    ('--sweep=optimizer_args.nesterov=yes', 'V,V,... (true or false)'),
    ('--sweep=model=softmax,,mlp', '--sweep=model=NAME,NAME'),
    # Every bad value named in the one line, each run checked before any.
    (
      '--sweep=optimizer=adam,adm,nope',
      "the off (optimizer adm) run would fail: optimizer 'adm' is not",
    ),
    ('--sweep=optimizer=adm,nope', '; the off (optimizer nope) run would'),
    ('--sweep=learning_rate=0.1,-1', '(learning_rate -1.0) run would fail'),
    ('--sweep=model=resnet', "model 'resnet' is neither a packaged model"),
    ('--sweep=model=no_such_module_here:f', 'no module no_such_module_here'),
    ('--sweep=model=__main__:my_model', 'each a process of its own'),
    ('--config.model=__main__:my_model', 'module:my_model'),
    ('--sweep=batch_size=10 --sweep=batch_size=20', 'given twice'),
    ('--sweep=batch_size=10,x', '--sweep=batch_size=N,N'),
    ('--sweep=batch_size=0,10', '--sweep=batch_size=N,N'),
    ('--config.profile_steps=0', 'compare profiles every mode'),
    ('--repeats=0', '--repeats=0'),
    ('--time_budget=-1', '--time_budget=-1'),
    ('--time_budget=nan', '--time_budget=nan'),
    ('--time_budget=soon', '--time_budget'),
  ],
)
def test_bad_compare_flags_fail_in_one_line_before_any_run(
  tmp_path, flag, named
):
  proc = run_compare(*flag.split(), f'--workdir={tmp_path}')
  assert proc.returncode == 2
  [line] = proc.stderr.strip().splitlines()
  assert line.startswith('error: ') and named in line
  assert not list(tmp_path.iterdir())  # No run started.


def test_default_workdir_is_named_after_the_config():
  def name(argv: list[str]) -> str:
    return parse.config_name(parse.resolve_argv(argv)[1])

  assert name(['--config=fashion_mnist']) == 'fashion_mnist'
  assert name(['--config', 'a/b.py', '--config.seed=2']) == 'b'
  assert name([]) == 'default'
  resolved, path = parse.resolve_argv(['--config', 'fashion_mnist', '--jit=on'])
  assert resolved == ['--jit=on']
  assert path == parse.config_path('fashion_mnist')


def mode(
  step, kernel, launches=20, calls=1.0, written=1000, compile_s=0.1, spread=0.0
) -> why.Figures:
  """A mode's figures as `why.explain` gives them, made up."""
  return why.Figures(
    step_ms=step,
    kernel_ms=kernel,
    host_ms=step - kernel,
    launches_per_step=launches,
    calls_per_step=calls,
    written_bytes=written,
    temp_bytes=0,
    peak_host_mib=800.0,
    compile_seconds=compile_s,
    spread=spread,
    break_even_steps=None,
    profiled=why.Profiled(
      steps=10,
      step_ms=step,
      kernel_ms=kernel,
      host_ms=step - kernel,
      peak_host_mib=800.0,
      breakdown_path='breakdown.json',
      capture='host.xplane.pb',
    ),
    kernels=[],
  )


def verdict(**modes: why.Figures) -> str:
  return '\n'.join(why.verdict(why.with_break_even(modes)))


def test_a_gain_of_host_time_names_what_the_host_does_less():
  text = verdict(
    off=mode(1.0, 0.3),
    fused=mode(0.2, 0.15, launches=18, calls=0.01, compile_s=1.1),
  )
  assert '**fused wins on this machine**: 5.0x faster' in text
  assert (
    'fused saves 0.800 ms a step (5.0x), mostly host time saved'
    ' (fewer calls and launches)'
  ) in text
  assert '0.650 ms (81%) is host time saved' in text
  assert (
    'kernel launches fall from 20 to 18 a step (one call a step to one call'
    ' every 100 steps)'
  ) in text
  assert '0.150 ms (19%) is faster kernels' in text
  assert 'is repaid after 1,250 steps' in text


def test_a_host_gain_with_more_launches_is_not_said_to_remove_launches():
  text = verdict(
    off=mode(1.0, 0.3), fused=mode(0.2, 0.15, launches=30, calls=0.01)
  )
  assert 'mostly host time saved (fewer calls):' in text
  assert (
    'is host time saved, though kernel launches rise from 20 to 30 a step'
  ) in text


def test_a_gain_despite_more_host_time_gives_no_share_over_100_percent():
  modes = why.with_break_even({'off': mode(1.0, 0.6), 'on': mode(0.7, 0.2)})
  [line] = [s for s in why.verdict(modes) if s.startswith('on saves')]
  assert line.startswith('on saves 0.300 ms a step (1.4x), mostly faster')
  assert 'its host time grows by 0.100 ms, 20 kernel launches a step in' in line
  assert 'faster kernels save 0.400 ms' in line
  assert '%' not in line  # 133% of the gain would be faster kernels.


def test_a_part_of_the_gain_that_rounds_to_nothing_is_said_unchanged():
  text = verdict(off=mode(1.0, 0.6), on=mode(0.6, 0.2))
  assert (
    'faster kernels: host time unchanged, 20 kernel launches a step in both'
    in text
  )
  assert '0.400 ms (100%) is faster kernels' in text


def test_a_difference_within_the_runs_spread_is_said_unsettled():
  text = verdict(off=mode(1.0, 0.3, spread=0.3), on=mode(0.8, 0.2))
  assert 'on saves 0.200 ms a step (1.2x)' in text
  assert 'spread by up to 30%, more than they differ' in text
  steady = verdict(off=mode(1.0, 0.3, spread=0.1), on=mode(0.8, 0.2))
  assert 'spread by' not in steady


def fed(m: why.Figures, wait: float, busy: float) -> why.Figures:
  """`m` with its step's wait for tf.data and its pipeline's busy time."""
  return dataclasses.replace(m, input_ms=wait, input_busy_ms=busy)


def test_a_step_bound_by_its_input_is_said_so_with_its_figures():
  paragraphs = why.verdict(
    why.with_break_even(
      {
        'off': fed(mode(1.0, 0.3), 0.1, 0.95),  # Its pipeline: 95% busy.
        'on': fed(mode(0.8, 0.2), 0.32, 0.4),  # 40% of its step waiting.
        'fused': fed(mode(0.5, 0.2), 0.1, 0.4),  # Neither.
      }
    )
  )
  assert paragraphs[0].endswith(
    "The input pipeline, not XLA, bounds off's step: it waits 0.100 ms of"
    ' its 1.000 ms (10%) for its batches, and tf.data works 0.950 ms of it'
    ' (95%).'
  )
  [on] = [p for p in paragraphs if p.startswith('on ')]
  assert on.endswith(
    "bounds on's step: it waits 0.320 ms of its 0.800 ms (40%) for its"
    ' batches, and tf.data works 0.400 ms of it (50%).'
  )
  assert 'input pipeline' not in paragraphs[-1]  # fused's.
  assert 'input' not in verdict(off=mode(1.0, 0.3), on=mode(0.8, 0.2))


def test_host_time_grown_by_waiting_for_input_is_not_blamed_on_dispatch():
  text = verdict(
    off=fed(mode(1.0, 0.3), 0.1, 0.2),
    on=fed(mode(1.5, 0.3, launches=12), 0.5, 0.6),
  )
  assert 'its host time grows by 0.500 ms' in text
  assert '0.400 ms more of it waiting for its batches' in text
  assert 'dispatching its XLA program' not in text


def test_the_breakdowns_input_figures_reach_the_verdict():
  stored = breakdown.Breakdown(
    steps=10,
    step_ms=2.0,
    kernel_ms=0.5,
    host_ms=0.5,
    launches_per_step=5.0,
    temp_bytes=0,
    written_bytes=0,
    kernels=[],
    input_ms=1.0,
    input_busy_ms=1.8,
  )
  profiled = result(profile={'breakdown_path': 'b', 'xplane_path': 'x'})
  m = why.explain(timed(1000.0), profiled, stored)  # Timed: 1 ms a step.
  assert m.input_ms == pytest.approx(0.5)
  assert m.input_busy_ms == pytest.approx(0.9)
  assert m.kernel_ms == pytest.approx(0.25)
  assert m.host_ms == pytest.approx(0.75)  # The wait is host time too.
  assert m.profiled.host_ms == pytest.approx(1.5)
  assert "bounds on's step" in verdict(off=mode(2.0, 0.5), on=m)
  older = dataclasses.asdict(m)  # compare.json from before these figures.
  del older['input_ms'], older['input_busy_ms']
  assert why.Figures.from_dict(older).input_ms is None


def result(
  loss: float = 0.5, accuracy: float = 0.8, **changed
) -> outputs.Result:
  """A timed run's result, made up."""
  return outputs.Result(
    **{
      'dataset': 'fashion_mnist',
      'class_names': list('0123456789'),
      'jit': 'off',
      'device': 'cpu',
      'steps': 100,
      'batch_size': 100,
      'steps_per_loop': 1,
      'final_loss': loss,
      'test_accuracy': accuracy,
      'compile_seconds': 0.1,
      'train_seconds': 1.0,
      'paused_seconds': 0.0,
      'steps_per_second': 100.0,
      'traces': 1,
      'hlo_fusions': None,
      'profile': None,
      'workdir': 'w',
      **changed,
    }
  )


def test_modes_that_end_apart_are_said_to_round_apart_not_to_differ():
  text = why.outcomes(
    {
      'off': result(0.49119, 0.8313),
      'on': result(0.61787, 0.8272),
      'auto': result(0.49119, 0.8313),
      'fused': result(0.61787, 0.8272),
    }
  )
  assert text.startswith('**Same training, other rounding.**')
  assert 'off and auto at 0.4912; on and fused at 0.6179 (final loss)' in text
  assert 'test accuracy 0.8272 to 0.8313' in text


def test_modes_that_end_together_are_said_to_compute_the_same():
  text = why.outcomes(
    {
      'off': result(0.61787, 0.8272),
      'on': result(0.617871, 0.8272),
      'fused': result(0.61787, 0.8272),
    }
  )
  assert text.startswith('Every mode ends at the same loss, 0.6179')
  assert '(test accuracy 0.8272)' in text


def test_modes_that_learned_nothing_are_named_not_read_as_rounding():
  # The CNN at the softmax's rate, as `make compare`'s model sweep ran it:
  # off learned, the XLA modes stayed at a uniform guess (or died at 0.10).
  text = why.outcomes(
    {
      'off': result(0.8106, 0.5452),
      'on': result(2.3066, 0.1000),
      'auto': result(1.9, 0.1400),
      'fused': result(2.2990, 0.3),
    }
  )
  assert '**on, auto and fused did not learn**' in text
  assert '`--config.learning_rate`' in text
  learned = {'off': result(0.8106, 0.5452), 'on': result(2.2, 0.16)}
  assert 'did not learn' not in why.outcomes(learned)
  together = why.outcomes(
    {'off': result(2.3026, 0.1), 'on': result(2.3026, 0.1)}
  )
  assert together.startswith('Every mode ends at the same loss')
  assert '**off and on did not learn**' in together


def test_a_gain_of_kernel_time_is_said_to_be_faster_kernels():
  text = verdict(off=mode(1.0, 0.8), on=mode(0.5, 0.35, written=400))
  assert '**on wins on this machine**: 2.0x' in text
  assert 'on saves 0.500 ms a step (2.0x), mostly faster kernels' in text
  assert '60% fewer bytes a step (1,000 to 400): less memory traffic' in text


def test_a_slower_xla_mode_is_said_to_lose_and_why():
  text = verdict(
    off=mode(1.0, 0.3),
    auto=mode(1.5, 0.4, launches=12),
    on=mode(1.02, 0.3),
  )
  assert '**XLA does not win on this machine**' in text
  assert 'auto loses to off: 1.50x its step time' in text
  assert 'its host time grows by 0.400 ms' in text
  assert 'though it launches no more kernels' in text
  assert 'its kernels take 0.100 ms more' in text
  assert 'on ties with off' in text
  assert 'repaid' not in text


def test_break_even_repays_the_extra_compile_with_the_saved_time():
  off = mode(1.0, 0.5, compile_s=0.5)
  assert why.break_even(mode(0.5, 0.2, compile_s=1.5), off) == 2000
  assert why.break_even(mode(0.5, 0.2, compile_s=0.2), off) == 0
  assert why.break_even(mode(1.5, 0.2, compile_s=0.2), off) is None


def timed(rate: float, *others: float) -> why.Timed:
  """A mode's timed runs as compare keeps them: the median run's result,
  every run's rate."""
  rates = [rate, *others]
  return why.Timed(
    result(steps_per_second=rate),
    why.Repeats([0.1] * len(rates), [1.0] * len(rates), rates),
  )


def test_the_sweep_finds_where_one_mode_overtakes_another():
  points = [
    why.sweep_point(size, 100, {'off': timed(off), 'fused': timed(fused)})
    for size, off, fused in ((10, 1000, 500), (1000, 100, 200))
  ]
  assert why.crossovers(points) == [
    'fused overtakes off between batch_size 10 and 1,000 (about 100)'
  ]
  assert '| 1,000 | 100 | 10.000 | 5.000 (2.00x) |' in why.sweep_table(points)


def test_a_lead_within_the_tie_band_crosses_nothing():
  def point(size: int, off: float, on: float) -> dict:
    return why.sweep_point(size, 100, {'off': timed(off), 'on': timed(on)})

  # on leads by 20%, ties (within 5%) at 100 and 1,000, then trails by 20%.
  points = [
    point(10, 100, 120),
    point(100, 100, 101),
    point(1000, 100, 99),
    point(10000, 120, 100),
  ]
  [crossing] = why.crossovers(points)
  assert crossing.startswith(
    'off overtakes on between batch_size 10 and 10,000'
  )
  assert why.crossovers(points[1:3]) == []  # A tie's noise, both ways.


def test_a_lead_within_the_runs_spread_crosses_nothing():
  """A 20% lead each way, at sizes where one mode's runs spread by 30%."""

  def point(size: int, off: float, on: float, noise: float) -> dict:
    runs = {'off': timed(off, off * (1 + noise)), 'on': timed(on)}
    return why.sweep_point(size, 100, runs)

  steady = [point(10, 100, 120, 0.0), point(1000, 120, 100, 0.0)]
  assert len(why.crossovers(steady)) == 1
  noisy = [point(10, 100, 120, 0.3), point(1000, 120, 100, 0.0)]
  assert why.crossovers(noisy) == []
  assert noisy[0].modes['off'].spread == pytest.approx(0.3)


def test_sweep_steps_train_as_many_examples_in_whole_calls():
  assert why.sweep_steps(10, 1000, 100, 100) == 1000  # No more steps.
  assert why.sweep_steps(1000, 1000, 100, 100) == 200
  assert why.sweep_steps(10000, 1000, 100, 100) == 200  # Two calls at least.
  assert why.sweep_steps(300, 1000, 100, 100) == 300


def test_parse_sweep_names_the_fix():
  from xla_mnist import compare as compare_entry  # Its signal handlers: here.

  fields = compare_entry.sweepable()
  assert why.parse_sweep('batch_size=100,10,100', fields) == (
    'batch_size',
    [10, 100],
  )
  assert why.parse_sweep('model=cnn, softmax,cnn,a.b:f', fields) == (
    'model',
    ['cnn', 'softmax', 'a.b:f'],  # In the order given, once each.
  )
  # Any field that changes the step, each value of the field's type.
  assert why.parse_sweep('optimizer=sgd,adam,sgd', fields) == (
    'optimizer',
    ['sgd', 'adam'],
  )
  assert why.parse_sweep('learning_rate=0.5,1e-3,1', fields) == (
    'learning_rate',
    [0.5, 0.001, 1.0],
  )
  assert why.parse_sweep('seed=2, 1', fields) == ('seed', [2, 1])
  assert why.parse_sweep('optimizer_args.nesterov=True,false', fields) == (
    'optimizer_args.nesterov',
    [True, False],
  )
  assert why.parse_sweep('schedule_args.warmup_steps=0,5', fields)[1] == [0, 5]
  for what in ('dataset', 'precision', 'optimizer_args.momentum'):
    assert what in fields
  # compare's own fields, and those that change no step, are not swept.
  for own in ('jit', 'num_steps', 'steps_per_loop', 'profile_steps', 'seedx'):
    with pytest.raises(UsageError, match=f'{own} cannot be swept'):
      why.parse_sweep(f'{own}=1,2', fields)
  with pytest.raises(UsageError, match='NAME,NAME'):
    why.parse_sweep('model=', fields)
  with pytest.raises(UsageError, match="'1.5' is no seed: .*whole numbers"):
    why.parse_sweep('seed=1,1.5', fields)


def test_a_comparison_round_trips_through_its_json():
  kernel = why.MadeOf(
    name='fusion.3',
    kind='xla',
    opcode='fusion',
    ms_per_step=0.01,
    runs_per_step=1.0,
    ops=('MatMul', 'add'),
    op_types=('MatMul', 'AddV2'),
    tf_ops=('MatMul', 'AddV2'),
  )
  figures = {
    'off': mode(1.0, 0.3),
    'fused': dataclasses.replace(mode(0.2, 0.1), kernels=[kernel]),
  }
  results = {'off': timed(1000.0, 900.0), 'fused': timed(5000.0, 5100.0)}
  points = [why.sweep_point(100, 100, results)]
  done = comparison.Comparison(
    title='t',
    measured='m',
    flags=['--config=fashion_mnist'],
    profiled_steps=20,
    results=results,
    figures=why.with_break_even(figures),
    sweep=comparison.Sweep(points, why.crossovers(points)),
  )
  text = done.to_json()
  assert comparison.Comparison.from_json(text) == done
  by = [
    by_field.Swept('model', [by_field.ValueRuns('cnn', results, done.figures)]),
    by_field.Swept(
      'learning_rate',
      [by_field.ValueRuns(0.05, results, done.figures)],
    ),
  ]
  with_by = dataclasses.replace(done, by=by)
  assert comparison.Comparison.from_json(with_by.to_json()) == with_by
  assert json.loads(text)['by'] is None
  swept = json.loads(with_by.to_json())['by']
  assert [s['field'] for s in swept] == ['model', 'learning_rate']
  [value] = swept[1]['values']
  assert value['value'] == 0.05  # Of the field's type.
  assert value['verdict'].startswith('**`0.05`: fused wins, 5.0x off**')
  # A compare.json of before other fields were swept reads back.
  older = json.loads(with_by.to_json())
  older['models'] = [{'model': 'cnn', **swept[0]['values'][0]}]
  del older['by']
  assert comparison.Comparison.from_json(json.dumps(older)).by == by[:1]
  stored = json.loads(text)['results']['fused']
  assert stored['steps_per_second'] == 5000.0  # result.json's own keys.
  assert stored['repeats']['steps_per_second'] == [5000.0, 5100.0]
  assert stored['breakdown']['kernels'][0]['tf_ops'] == ['MatMul', 'AddV2']
  assert json.loads(text)['sweep']['points'][0]['batch_size'] == 100
  unswept = dataclasses.replace(done, sweep=None)
  assert json.loads(unswept.to_json())['sweep'] is None
  assert comparison.Comparison.from_json(unswept.to_json()) == unswept


def test_the_timed_figures_are_the_run_of_median_speed():
  runs = [
    result(steps_per_second=r, train_seconds=10 / r) for r in (3, 1, 2, 4)
  ]
  t = why.Timed.of(runs)
  assert t.run is runs[2]  # The slower middle one of an even count.
  assert t.repeats.steps_per_second == [3, 1, 2, 4]
  assert t.spread == pytest.approx(3.0)


def small_run(tmp_path) -> list[str]:
  """Train flags of runs of 20 steps of 10 on a small IDX folder."""
  idx = tmp_path / 'idx'
  make_idx_folder(str(idx), train=300)
  return [
    f'--config.idx_dir={idx}',
    '--config.dataset=fashion_mnist',
    '--config.num_steps=20',
    '--config.steps_per_loop=5',
    '--config.batch_size=10',
    f'--data_dir={tmp_path / "tfds"}',
  ]


def by_models(**models: dict[str, why.Figures]) -> str:
  """The "By model" section of made-up figures, softmax the main model."""
  runs = []
  for name, modes in models.items():
    results = {
      m: timed(1e3 / f.step_ms, 1e3 / f.step_ms) for m, f in modes.items()
    }
    runs.append(by_field.ValueRuns(name, results, why.with_break_even(modes)))
  return by_field.markdown(by_field.Swept('model', runs), 'softmax')


def test_the_verdict_by_model_tells_host_gains_from_kernel_gains():
  text = by_models(
    softmax={
      'off': mode(1.0, 0.1),
      'on': mode(1.2, 0.1),
      'fused': mode(0.2, 0.1),
    },
    cnn={
      'off': mode(10.0, 9.0, written=4000),
      'on': mode(7.0, 6.1, written=2000),
      'fused': mode(40.0, 39.9),
    },
    mlp={
      'off': mode(2.0, 1.0),
      'on': mode(1.99, 1.0),
      'fused': mode(2.02, 1.0),
    },
  )
  assert (
    "**`softmax`: fused wins, 5.0x off** (90% of off's 1.000 ms step is host"
    ' time); its gain is mostly host time removed (0.800 ms host, 100%'
  ) in text
  assert 'Slower than off: on (1.20x its step)' in text
  assert '**`cnn`: on wins, 1.4x off** (10% of' in text
  assert (
    'mostly faster kernels (0.100 ms host, 3%; 2.900 ms kernels, 97%)' in text
  )
  assert 'Slower than off: fused (4.00x its step)' in text
  assert 'its kernels write 50% fewer bytes a step (4,000 to 2,000)' in text
  assert '**`mlp`: XLA does not win** (50% of' in text
  assert (
    'In short, on this machine: `softmax`: gains mostly host time removed;'
    ' `cnn`: gains mostly from faster kernels; `mlp`: no gain from XLA.'
  ) in text
  # The main model's figures are the main "Why"; every other model's here.
  assert '### `cnn`' in text and '### `mlp`' in text
  assert '### `softmax`' not in text
  assert (
    '| `cnn` | 10.000 | 7.000 (1.43x) | 40.000 (0.25x) | 10% | on |' in text
  )


TINY_FACTORY = """
import keras


def build(input_shape, num_classes):
  layers = keras.layers
  return keras.Sequential(
    [keras.Input(input_shape), layers.Flatten(), layers.Dense(num_classes)]
  )
"""


@pytest.mark.slow
def test_the_model_sweep_compares_every_mode_per_model_cut_by_the_budget(
  tmp_path, monkeypatch
):
  """compare is a function a notebook calls, no flags parsed here, each run
  still a whole process: softmax (the main runs', reused) and a user's
  factory, every mode timed and profiled per model, in compare.json and
  compare.md. At a budget no step fits, each timed run holds two calls:
  per-step modes one compiling step and one timed, fused two calls of two
  steps; each says what its config asked, in compare.json and on the page.
  (The shared compare run keeps every step of its budget.)"""
  from xla_mnist import compare as compare_entry

  (tmp_path / 'mods').mkdir()
  (tmp_path / 'mods' / 'tiny_models.py').write_text(TINY_FACTORY)
  monkeypatch.setenv('PYTHONPATH', str(tmp_path / 'mods'))
  workdir = tmp_path / 'w'
  lines = []
  done = comparison.compare(
    small_run(tmp_path),  # 20 steps, 5 a fused call.
    str(workdir),
    check=compare_entry.checked,
    repeats=1,
    by={
      'model': ['softmax', 'tiny_models:build', 'softmax'],
      'optimizer': ['sgd', 'adam'],
    },
    say=lines.append,
    time_budget=1e-6,
  )
  assert list(done.results) == MODES
  assert done.sweep is None
  assert lines[0] == f'timing a fused call in {workdir} ...'
  assert f'training off in {workdir} (1/1) ...' in lines
  with pytest.raises(UsageError, match='the off run would fail'):
    comparison.compare(
      ['--config.batch_size=0'],
      str(tmp_path / 'x'),
      check=compare_entry.checked,
    )
  assert not (tmp_path / 'x').exists()
  # The budget's cut: two calls a timed run, of two steps when fused.
  for name, t in done.results.items():
    per_call = 2 if name == 'fused' else 1
    assert (t.run.steps, t.run.steps_per_loop) == (2 * per_call, per_call)
    asked = 5 if name == 'fused' else 1
    assert t.cut_from == why.Asked(20, asked), name
  assert done.figures['fused'].profiled.steps == 4  # Two calls of two.
  assert done.profiled_steps == 4
  # Each model: the main runs reused, the factory's every mode, cut too.
  models, optimizers = done.by
  assert models.field == 'model'
  assert [m.value for m in models.runs] == ['softmax', 'tiny_models:build']
  main, factory = models.runs
  assert main.results == done.results  # The main runs, not run again.
  assert list(factory.figures) == MODES
  for name, t in factory.results.items():
    assert t.run.config['model'] == 'tiny_models:build'
    per_call = 2 if name == 'fused' else 1
    assert (t.run.steps, t.run.steps_per_loop) == (2 * per_call, per_call)
    assert factory.figures[name].profiled.steps == 4
  stored = read(str(workdir))
  assert stored['time_budget'] == 1e-6
  assert stored['results']['fused']['cut_from'] == {
    'steps': 20,
    'steps_per_loop': 5,
  }
  stored_models, stored_optimizers = stored['by']
  assert [m['value'] for m in stored_models['values']] == [
    'softmax',
    'tiny_models:build',
  ]
  values = stored_models['values']
  assert values[1]['verdict'].startswith('**`tiny_models:build`: ')
  kernels = values[1]['results']['fused']['breakdown']['kernels']
  assert kernels and all('tf_ops' in k for k in kernels)
  page = (workdir / 'compare.md').read_text()
  assert 'fused (4 of 20 steps, 2 a call, not 5)' in page
  assert 'off (2 of 20 steps)' in page
  assert '## By model' in page and '### `tiny_models:build`' in page
  assert (
    '**`tiny_models:build`: ' in page and 'In short, on this machine' in page
  )
  assert (
    workdir / 'model' / 'tiny_models:build' / 'profiled' / 'fused'
  ).is_dir()
  # A verdict per optimizer, the main runs' (sgd) reused, on the page and
  # in compare.json.
  assert optimizers.field == 'optimizer'
  assert [v.value for v in optimizers.runs] == ['sgd', 'adam']
  assert optimizers.runs[0].results == done.results
  adam = optimizers.runs[1]
  assert {t.run.config['optimizer'] for t in adam.results.values()} == {'adam'}
  assert [v['value'] for v in stored_optimizers['values']] == ['sgd', 'adam']
  for value in stored_optimizers['values']:
    assert value['verdict'].startswith(f'**`{value["value"]}`: ')
  assert '## By optimizer' in page and '### `adam`' in page
  assert (workdir / 'optimizer' / 'adam' / 'profiled' / 'fused').is_dir()
  # Keras's fit at the loop's settings, cut by the budget alike.
  assert list(done.fit.results) == ['off', 'on', 'fused']
  for name, t in done.fit.results.items():
    per_call = 2 if name == 'fused' else 1
    assert (t.run.steps, t.run.steps_per_loop) == (2 * per_call, per_call)
    assert t.run.jit == ('off' if name == 'off' else 'on')
    assert 0.0 <= t.run.test_accuracy <= 1.0
    assert math.isfinite(t.run.final_loss)
    assert done.fit.figures[name].kernel_ms > 0
  auto = done.fit.auto
  assert auto.picks == bool(auto.accelerators and auto.supports_jit)
  assert auto.said() in page and 'picks `' in page
  assert "## Keras's fit" in page and '`jit_compile=True, steps_per_' in page
  assert stored['fit']['auto'] == dataclasses.asdict(auto)
  assert stored['fit']['verdict'].startswith(('**Set ', "**Keep fit's"))
  assert (workdir / 'fit' / 'profiled' / 'fused' / 'breakdown.json').is_file()
  assert comparison.Comparison.load(str(workdir)) == done


# The time budget: each timed run holds what fits it, or the config's steps.


def test_a_timed_run_holds_the_whole_calls_that_fit_its_budget():
  within = comparison.steps_within
  assert within(2.0, 0.0005, 1, 1000) == 1000  # The softmax: all its steps.
  assert within(2.0, 0.05, 1, 200) == 40  # 40 steps of 50 ms.
  assert within(2.0, 0.015, 10, 200) == 130  # 133 fit: 13 calls of 10.
  assert within(2.0, 1.0, 2, 200) == 4  # Two calls at least, of 2 steps.
  assert within(2.0, 1.0, 1, 200) == 2  # One compiling, one timed.
  assert within(0.0, 1.0, 100, 200) == 200  # No budget: the config's.
  per_call = comparison.per_call_within
  assert per_call(2.0, 0.0005, 100) == 100  # The config's K.
  assert per_call(2.0, 0.02, 100) == 50  # Two calls of 50 fit 2 s.
  assert per_call(2.0, 1.0, 100) == 2  # Never 1: that is no XLA loop.
  assert per_call(0.0, 1.0, 100) == 100


def test_a_mode_the_budget_cut_keeps_what_its_config_asked():
  asked = why.Asked(steps=200, steps_per_loop=100)
  runs = [result(steps=4, steps_per_loop=2, steps_per_second=r) for r in (1, 2)]
  assert why.Timed.of(runs, asked).cut_from == asked
  whole = [result(steps=200, steps_per_loop=100)]
  assert why.Timed.of(whole, asked).cut_from is None
  assert why.Timed.of(runs).cut_from is None  # No budget: nothing asked.


def test_the_page_says_which_modes_ran_fewer_steps_than_asked():
  off = timed(25.0)
  fused = why.Timed(
    result(steps=4, steps_per_loop=2, steps_per_second=1.0),
    why.Repeats([0.1], [4.0], [1.0]),
    why.Asked(200, 100),
  )
  cut = {'off': off, 'fused': fused}
  note = why.budget_note(cut, 2.0)
  assert 'stops after about 2 s of steps' in note
  assert 'measured over fewer steps: fused (4 of 200 steps, 2 a call,' in note
  assert 'off (' not in note
  assert 'every mode ran' in why.budget_note({'off': off}, 2.0)
  assert why.budget_note(cut, 0.0) == ''  # No budget, nothing to say.
  assert note in comparison.table(cut, 2.0)
  point = why.sweep_point(1000, 200, cut)
  assert point.modes['fused'].steps == 4
  assert point.modes['off'].steps is None  # It ran the point's steps.
  swept = why.sweep_table([point])
  assert '| 1,000 | 200 | 40.000 | 1000.000 (0.04x), 4 steps |' in swept
  figures = {'off': mode(40.0, 39.0), 'fused': mode(1000.0, 999.0)}
  runs = {n: t.run for n, t in cut.items()}
  text = why.markdown(runs, why.with_break_even(figures), [point])
  assert "the time budget cut that mode's runs" in text


def test_a_cut_and_its_budget_round_trip_through_compare_json():
  results = {
    'off': timed(100.0),
    'fused': why.Timed(
      result(steps=4, steps_per_loop=2),
      why.Repeats([0.1], [1.0], [100.0]),
      why.Asked(200, 100),
    ),
  }
  figures = {'off': mode(10.0, 9.0), 'fused': mode(10.0, 9.0)}
  done = comparison.Comparison(
    title='t',
    measured='m',
    flags=[],
    profiled_steps=4,
    results=results,
    figures=figures,
    sweep=None,
    time_budget=2.0,
  )
  stored = json.loads(done.to_json())
  assert stored['time_budget'] == 2.0
  assert stored['results']['fused']['cut_from'] == {
    'steps': 200,
    'steps_per_loop': 100,
  }
  assert stored['results']['off']['cut_from'] is None
  assert comparison.Comparison.from_json(done.to_json()) == done
  for key in ('time_budget',):  # A compare.json from before budgets.
    del stored[key]
  for r in stored['results'].values():
    del r['cut_from']
  old = comparison.Comparison.from_json(json.dumps(stored))
  assert old.time_budget == 0.0 and old.results['fused'].cut_from is None


def test_compare_refuses_a_budget_it_cannot_keep_before_any_run(tmp_path):
  from xla_mnist import compare as compare_entry

  for budget in (-1.0, float('inf'), '2'):
    with pytest.raises(UsageError, match='time_budget='):
      comparison.compare(
        [],
        str(tmp_path / 'w'),
        check=compare_entry.checked,
        time_budget=budget,
      )
  assert not (tmp_path / 'w').exists()


def test_chance_is_the_datas_own_class_count():
  """ln 100 and 1 / 100 + 0.05 for CIFAR-100: a loss of ln 10 has learned;
  two classes: 0.55 at most, not 1.5 times a guess's 0.5."""
  hundred = {'class_names': [str(i) for i in range(100)]}
  at_ten = {m: result(2.31, 0.1, **hundred) for m in ('off', 'on')}
  assert 'did not learn' not in why.outcomes(at_ten)
  at_chance = {m: result(4.6, 0.01, **hundred) for m in ('off', 'on')}
  said = why.outcomes(at_chance)
  assert 'over 100 classes (4.6052)' in said and 'at most 0.06' in said
  two = {'class_names': ['cat', 'dog']}
  assert 'did not learn' not in why.outcomes(
    {m: result(0.5, 0.74, **two) for m in ('off', 'on')}
  )
  assert 'did not learn' in why.outcomes(
    {m: result(0.69, 0.52, **two) for m in ('off', 'on')}
  )
  mixed = {'off': result(4.6, 0.01, **hundred), 'on': result(2.31, 0.1)}
  assert 'did not learn' not in why.outcomes(mixed)  # No one chance.


def test_a_mode_stopped_earlier_is_not_said_to_round_apart():
  full = {'off': result(0.5), 'on': result(0.5)}
  text = why.outcomes({**full, 'fused': result(2.3, 0.1, steps=4)})
  assert text.startswith('Every mode ends at the same loss, 0.5000')
  assert 'fused ran fewer steps than off and on (the time budget)' in text
  assert 'did not learn' not in text  # Four steps say nothing of it.
  alone = why.outcomes({'off': result(2.2, steps=29), 'on': result(steps=19)})
  assert alone.startswith('on ran fewer steps than off (the time budget)')


def test_a_cut_mode_at_chance_is_said_to_have_run_too_few_steps():
  runs = {'off': result(2.31, 0.1, steps=30), 'on': result(2.31, steps=30)}
  said = why.outcomes(runs, cut={'off', 'on'})
  assert '**off and on did not learn**' in said
  assert 'too few to tell whether this learning rate trains' in said
  assert 'did not train the model' not in said
  assert 'did not train the model' in why.outcomes(runs)  # Not cut.
