"""`markdown.table`: the one writer of the generated pages' tables."""

from __future__ import annotations

import pytest

from xla_mnist.workdir import markdown


def test_a_table_is_its_header_delimiters_and_rows():
  text = markdown.table(
    ('mode', 'steps/call', 'ms/step'),
    'lrr',
    [('off', 1, '0.750'), ('fused', 100, '0.120')],
  )
  assert text.split('\n') == [
    '| mode | steps/call | ms/step |',
    '| --- | ---: | ---: |',
    '| off | 1 | 0.750 |',
    '| fused | 100 | 0.120 |',
  ]


def test_a_table_without_rows_is_its_header():
  assert markdown.table(('op', 'ms'), 'rl', iter(())) == (
    '| op | ms |\n| ---: | --- |'
  )


def test_a_pipe_in_a_cell_is_escaped_and_keeps_the_row_whole():
  text = markdown.table(('field', 'value'), 'll', [('`idx_dir`', "`'a|b'`")])
  row = text.split('\n')[2]
  assert row == r"| `idx_dir` | `'a\|b'` |"
  assert len(row.replace(r'\|', '').split('|')) == 4  # Two cells.


@pytest.mark.parametrize(
  'align, rows',
  [('l', [('a', 'b')]), ('lx', [('a', 'b')]), ('ll', [('a',)])],
  ids=['align too short', 'unknown letter', 'row too short'],
)
def test_a_table_not_as_wide_as_its_header_is_refused(align, rows):
  with pytest.raises(ValueError, match='align|row'):
    markdown.table(('mode', 'ms/step'), align, rows)


def test_a_line_break_in_a_cell_keeps_the_row_on_one_line():
  text = markdown.table(('run', 'error'), 'll', [('a', 'disk full\nretry')])
  assert text.split('\n')[2] == '| a | disk full retry |'
