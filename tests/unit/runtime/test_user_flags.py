"""`user_flags`: TF's fatal line about a flag becomes one error."""

from __future__ import annotations

import pytest

from xla_mnist.runtime import user_flags

FATAL = 'F0000 00:00:1.2   31541 parse_flags_from_env.cc:{} {}'


@pytest.mark.parametrize(
  ('stderr', 'given', 'expected'),
  [
    (
      FATAL.format('234]', 'Unknown flag in XLA_FLAGS: --x'),
      {'XLA_FLAGS': '--x'},
      'XLA_FLAGS: TF has no flag --x',
    ),
    (
      FATAL.format('220]', 'Check failed: Flag parsing failed.')
      + '\nusage: --tf_a=b\n\t--other',
      {'XLA_FLAGS': '--ok', 'TF_XLA_FLAGS': '--tf_a=b'},
      'TF_XLA_FLAGS: TF cannot parse --tf_a=b',
    ),
    ('I0000 a line\nTraceback: not a flag fault', {'XLA_FLAGS': '--x'}, None),
  ],
)
def test_tfs_fatal_line_becomes_one_error(stderr, given, expected):
  said = user_flags._describe_fatal(stderr, given)
  if expected is None:
    assert said is None
  else:
    assert said.startswith(expected), said
    assert '\n' not in said
