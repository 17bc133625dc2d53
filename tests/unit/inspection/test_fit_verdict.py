"""The Keras user's answer from made-up figures: which `fit` setting to use
against what `jit_compile="auto"` picks, and the loop against fit at each
matching setting (`why.fit_verdict`, `why.fit_markdown`, `AutoPick`)."""

from __future__ import annotations

import pytest

from xla_mnist.inspection import keras_fit, why
from xla_mnist.workdir import outputs


def figures(step: float, kernel: float, calls: float = 1.0) -> why.Figures:
  return why.Figures(
    step_ms=step,
    kernel_ms=kernel,
    host_ms=step - kernel,
    launches_per_step=10,
    calls_per_step=calls,
    written_bytes=None,
    temp_bytes=None,
    peak_host_mib=None,
    compile_seconds=0.5,
    spread=0.0,
    break_even_steps=None,
    profiled=why.Profiled(10, step, kernel, step - kernel, None, 'b', 'x'),
    kernels=[],
  )


def timed(accuracy: float) -> why.Timed:
  run = outputs.Result(
    dataset='d', jit='on', device='CPU:0', steps=20, batch_size=10,
    steps_per_loop=1, final_loss=0.5, test_accuracy=accuracy,
    compile_seconds=0.5, train_seconds=1.0, paused_seconds=0.0,
    steps_per_second=20.0, traces=1, hlo_fusions=None, profile=None,
    workdir='w',
  )  # fmt: skip
  return why.Timed(run, why.Repeats([0.5], [1.0], [20.0]))


LOOP = {
  'off': figures(1.0, 0.2),
  'on': figures(0.8, 0.2),
  'fused': figures(0.25, 0.2, 0.1),
}


# fit's settings, each faster than the last.
FASTER = {
  'off': figures(2.0, 0.3),
  'on': figures(1.0, 0.2),
  'fused': figures(0.5, 0.2, 0.1),
}


def test_a_faster_setting_is_named_against_the_default_auto_picks():
  fit = FASTER
  said = why.fit_verdict(fit, LOOP, picks=False)
  assert said.startswith(
    '**Set `jit_compile=True, steps_per_execution=10` here**: 4.0x faster a'
    ' step than fit\'s default, `jit_compile="auto"`, which picks'
    ' `jit_compile=False` (0.500 ms against 2.000 ms).'
  )
  assert (
    "At `jit_compile=False`, fit takes 2.00x the loop's off step (2.000 ms"
    ' against 1.000: host +0.900 ms, kernels +0.100 ms).'
  ) in said
  # Where auto picks XLA (a GPU), the default is jit_compile=True.
  assert 'than fit\'s default, `jit_compile="auto"`, which picks' in (
    why.fit_verdict(fit, LOOP, picks=True)
  )
  assert '2.0x faster' in why.fit_verdict(fit, LOOP, picks=True)


def test_no_faster_setting_keeps_the_default():
  fit = {
    'off': figures(1.0, 0.2),
    'on': figures(0.98, 0.2),
    'fused': figures(1.2, 0.2, 0.1),
  }
  said = why.fit_verdict(fit, LOOP, picks=False)
  assert said.startswith(
    "**Keep fit's default here**: no setting is 5% faster a step than"
    ' `jit_compile="auto"`, which picks `jit_compile=False` (1.000 ms).'
  )


def test_the_fit_section_has_a_row_per_setting_beside_its_loop_mode():
  fit = FASTER
  results = {name: timed(0.8) for name in fit}
  auto = keras_fit.AutoPick(picks=False, accelerators=[], supports_jit=True)
  text = why.fit_markdown(results, fit, LOOP, auto.picks, auto.said())
  assert text.startswith("## Keras's fit\n")
  assert '`jit_compile="auto"` picks `False`: TensorFlow sees no GPU' in text
  assert (
    '| `jit_compile=True, steps_per_execution=10` | 0.500 | 0.200 | 0.300 |'
    ' 10 | 0.50 | 0.8000 | fused | 0.250 | 2.00x |'
  ) in text


@pytest.mark.parametrize(
  ('auto', 'why_'),
  [
    (keras_fit.AutoPick(False, [], True), 'CPU-only machine'),
    (keras_fit.AutoPick(False, ['GPU'], False), 'does not support XLA'),
    (keras_fit.AutoPick(False, ['GPU'], True), 'tf.distribute'),
    (keras_fit.AutoPick(True, ['GPU'], True), 'every layer supports XLA'),
  ],
)
def test_what_auto_picks_says_why(auto, why_):
  assert why_ in auto.said()
