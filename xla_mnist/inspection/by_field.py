"""Does XLA help this model, this optimizer, this learning rate? The
comparison of every jit mode repeated per value of a swept field
(`--sweep=model=...`, `--sweep=optimizer=...`, any field but batch_size's
timed sweep), side by side, and a verdict per value.

`comparison` hands this module each value's timed runs and explained
figures (`why.explain`), one `ValueRuns` a value, in a `Swept` per field; it
returns the text. Every sentence is chosen by the figures: for which values
XLA's gain is host time removed and for which it is faster kernels, which
modes lose, and what memory each writes and holds. The "kind" of a value's
step is measured, not assumed: the share of `off`'s step that is host time.

Imports no TensorFlow: compare starts fast and fails fast on bad flags.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from xla_mnist.inspection import why
from xla_mnist.inspection.why import BASE, TIE, Figures
from xla_mnist.workdir import markdown as md


@dataclasses.dataclass(frozen=True)
class ValueRuns:
  """One value of a swept field compared in every mode: its timed runs and
  their figures."""

  value: why.Value  # Of the field's type: 'cnn', 'adam', 0.05, True...
  results: dict[str, why.Timed]  # Per mode, in `comparison.MODES`' order.
  figures: dict[str, Figures]

  @property
  def label(self) -> str:
    return f'`{self.value}`'


@dataclasses.dataclass(frozen=True)
class Swept:
  """A field's values, each compared in every mode, in the order given."""

  field: str
  runs: list[ValueRuns]


def table(swept: Swept) -> str:
  """Each value's step per mode, speed-up over off, and where the best XLA
  mode's gain is, as a Markdown table."""
  names = list(swept.runs[0].figures)
  rows = []
  for runs in swept.runs:
    modes = runs.figures
    base = modes[BASE]
    best, _, host, kernels = _gain(modes)
    rows.append(
      (
        runs.label,
        *(
          f'{m.step_ms:.3f}'
          if n == BASE
          else f'{m.step_ms:.3f} ({base.step_ms / m.step_ms:.2f}x)'
          for n, m in modes.items()
        ),
        f'{base.host_ms / base.step_ms:.0%}',
        best,
        f'{host:+.3f}',
        f'{kernels:+.3f}',
        _ratio(modes[best].written_bytes, base.written_bytes),
        why.byte_count(modes[best].temp_bytes),
      )
    )
  return md.table(
    (
      swept.field,
      *(f'{n} ms/step' for n in names),
      f'{BASE} host share',
      'best XLA mode',
      'host ms saved',
      'kernel ms saved',
      f'its writes vs {BASE}',
      'its XLA temps B',
    ),
    'l' + 'r' * len(names) + 'rlrrrr',
    rows,
  )


def finding(runs: ValueRuns) -> str:
  """One value's verdict in a sentence group: who wins and by how much,
  whether the gain is host time or kernels, who loses, what memory costs."""
  modes = runs.figures
  base = modes[BASE]
  kind = (
    f"{base.host_ms / base.step_ms:.0%} of {BASE}'s {base.step_ms:.3f} ms step"
    ' is host time'
  )
  best, ratio, host, kernels = _gain(modes)
  if ratio < 1 + TIE:
    text = (
      f'**{runs.label}: XLA does not win** ({kind}): no mode is'
      f' {TIE:.0%} faster a step than {BASE}.'
    )
  else:
    text = (
      f'**{runs.label}: {best} wins, {ratio:.1f}x {BASE}** ({kind}); its'
      f' gain is {_source(host, kernels)}.'
    )
  losers = [
    f'{name} ({x.step_ms / base.step_ms:.2f}x its step)'
    for name, x in modes.items()
    if name != BASE and x.step_ms > (1 + TIE) * base.step_ms
  ]
  if losers:
    text += f' Slower than {BASE}: {", ".join(losers)}.'
  return text + f' {_memory(best, modes[best], base)}'


def markdown(
  swept: Swept, main_value: why.Value, time_budget: float = 0.0
) -> str:
  """The "By <field>" section: the table, a verdict per value, then each
  other value's figures as the main runs' "Why" gives them, and what the
  `time_budget` cut of its timed runs; `main_value` is the main runs'."""
  text = [
    f'## By {swept.field}',
    '',
    'Every value trained as the main runs did (the same data, steps, batch'
    f' and steps per call; only `config.{swept.field}` changed), each mode'
    f" timed and profiled the same way. Saved: {BASE}'s time less the best"
    " XLA mode's, in the shares its profile measured (negative: it costs"
    ' more).',
    '',
    table(swept),
    '',
    *(f'- {finding(runs)}' for runs in swept.runs),
    '',
    summary(swept.runs),
  ]
  for runs in swept.runs:
    if runs.value == main_value:
      continue  # Its figures are the main runs' "Why" above.
    text += [
      '',
      f'### {runs.label}',
      '',
      why.outcomes(
        {name: t.run for name, t in runs.results.items()},
        why.cut_modes(runs.results),
      ),
      '',
      why.table(runs.figures),
      *(
        ['', note]
        if (note := why.budget_note(runs.results, time_budget))
        else []
      ),
      '',
      *why.top_kernels(runs.figures),
      '',
      '\n\n'.join(why.verdict(runs.figures)),
    ]
  return '\n'.join(text) + '\n'


def summary(values: list[ValueRuns]) -> str:
  """Which values' gains are host time and which are kernels, in a line."""
  groups: dict[str, list[str]] = {}
  for runs in values:
    _, ratio, host, kernels = _gain(runs.figures)
    if ratio < 1 + TIE:
      key = 'no gain from XLA'
    else:
      key = (
        'gains mostly host time removed'
        if host >= kernels
        else 'gains mostly from faster kernels'
      )
    groups.setdefault(key, []).append(runs.label)
  said = '; '.join(
    f'{why.listed(names)}: {key}' for key, names in groups.items()
  )
  return f'In short, on this machine: {said}.'


def _gain(modes: Mapping[str, Figures]) -> tuple[str, float, float, float]:
  """The XLA mode (any but off) of the shortest step, its speed-up over off,
  and the host and kernel ms a step it saves against off."""
  best = min((n for n in modes if n != BASE), key=lambda n: modes[n].step_ms)
  m, base = modes[best], modes[BASE]
  host, kernels = base.host_ms - m.host_ms, base.kernel_ms - m.kernel_ms
  return best, base.step_ms / m.step_ms, host, kernels


def _source(host: float, kernels: float) -> str:
  if host >= 0 and kernels >= 0:
    gain = host + kernels
    lead = 'host time removed' if host >= kernels else 'faster kernels'
    return (
      f'mostly {lead} ({host:.3f} ms host, {host / gain:.0%}; {kernels:.3f} ms'
      f' kernels, {kernels / gain:.0%})'
    )
  if host >= 0:
    return (
      f'host time removed ({host:.3f} ms), though its kernels take'
      f' {-kernels:.3f} ms more'
    )
  return (
    f'faster kernels ({kernels:.3f} ms), though its host time grows by'
    f' {-host:.3f} ms'
  )


def _memory(name: str, m: Figures, base: Figures) -> str:
  """What the best XLA mode writes and holds against off."""
  parts = []
  if m.written_bytes is not None and base.written_bytes:
    change = m.written_bytes / base.written_bytes - 1
    if abs(change) < TIE:
      parts.append(f"its kernels write as many bytes a step as {BASE}'s")
    else:
      parts.append(
        f'its kernels write {abs(change):.0%}'
        f' {"fewer" if change < 0 else "more"} bytes a step'
        f' ({base.written_bytes:,} to {m.written_bytes:,})'
      )
  if m.temp_bytes:
    parts.append(f'XLA holds {m.temp_bytes:,} bytes of temporaries')
  if m.peak_host_mib is not None and base.peak_host_mib is not None:
    parts.append(
      f'peak host memory {m.peak_host_mib:,.0f} MiB against'
      f' {base.peak_host_mib:,.0f}'
    )
  if not parts:
    return ''
  return f'Memory, {name} against {BASE}: {"; ".join(parts)}.'


def _ratio(ours: int | None, theirs: int | None) -> str:
  if ours is None or not theirs:
    return '?'
  return f'{ours / theirs:.2f}x'
