"""Markdown for the generated pages: report.md, compare.md, docs/why.md and
docs/results.md.

One writer of tables, so that every page's tables have the same shape and
no cell can break one. Imports no TensorFlow: compare and the benchmark's
page are written without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# A column's alignment letter -> its delimiter cell ('---' is Markdown's
# default, left).
RULES = {'l': '---', 'r': '---:'}


def table(
  header: Sequence[str], align: str, rows: Iterable[Sequence[object]]
) -> str:
  """A Markdown table: the header, its delimiter row, one line per row.

  `align` has one letter per column: 'l' left (text) or 'r' right (figures).
  Cells are written as `str` gives them, so callers format their figures;
  a '|' in a cell is escaped and a line break becomes a space, so that a
  value (a path in a config, an error's text) cannot split its row. A row
  or `align` not as wide as the header raises ValueError: a shifted column
  would read as wrong figures.
  """
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
  return '| ' + ' | '.join(_cell(c) for c in cells) + ' |'


def _cell(value: object) -> str:
  return ' '.join(str(value).replace('|', r'\|').splitlines())
