"""The one writer of the generated pages' Markdown tables (report.md,
compare.md, docs/why.md, docs/results.md): one shape, no cell breaks one. No
TensorFlow: compare and the benchmark's page are written without it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

RULES = {'l': '---', 'r': '---:'}  # Alignment letter: its delimiter cell.


def table(
  header: Sequence[str], align: str, rows: Iterable[Sequence[object]]
) -> str:
  """The header, its delimiter row (`align`: 'l' or 'r' per column), a line
  per row of `str`'d cells, '|' escaped, line breaks made spaces. ValueError
  for a row or `align` not as wide as the header: a shifted column would
  read as wrong figures."""
  if len(align) != len(header) or not set(align) <= RULES.keys():
    raise ValueError(
      f'align {align!r}: one of {"/".join(RULES)} per column of {header}'
    )
  lines = [_row(header), _row(RULES[a] for a in align)]
  for row in rows:
    if len(row) != len(header):
      raise ValueError(f'row {row!r}: {len(header)} cells, one per {header}')
    lines.append(_row(row))
  return '\n'.join(lines)


def _row(cells: Iterable[object]) -> str:
  cells = (' '.join(str(c).replace('|', r'\|').splitlines()) for c in cells)
  return '| ' + ' | '.join(cells) + ' |'
