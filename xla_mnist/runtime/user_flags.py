"""Whether TF can take the XLA flags of the user's environment.

TF parses XLA_FLAGS and TF_XLA_FLAGS at its first compile, and a flag it
cannot take ends the process there with a fatal line, past any Python
handler. So a child process compiles with the user's flags first, and its
fatal line becomes one error. `env.check_user_flags` loads this module only
when the user set one of them: nobody else pays anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile

from xla_mnist.runtime import layout
from xla_mnist.runtime.errors import UsageError

# Compiles one function: TF parses both variables on the way, and a flag it
# cannot take ends it with a fatal (F) line and exit 1, which no Python
# handler can catch (TF 2.21).
_PROBE = (
  'import tensorflow as tf\n'
  'tf.function(lambda x: x + 1, jit_compile=True)(tf.constant(1.0))\n'
)
_CHECKED = False


def check(user: dict[str, str | None]) -> None:
  """Raises UsageError when TF cannot take the flag variables `user` sets
  (None: unset), as the user's environment set them.

  Checked once per process: a child process imports TF and compiles with
  the user's values, and its fatal line becomes the error. A passing
  verdict is remembered per TF version and values in the user's cache
  folder (`verdicts_path`), so a user who sets them pays the check (about
  3 s) once.
  """
  global _CHECKED
  given = {k: v for k, v in user.items() if v is not None}
  if _CHECKED or not given:
    return
  key = _verdict_key(given)
  if key in _verdicts():
    _CHECKED = True
    return
  verdict = _probe(given, user)
  if verdict is not None:
    raise UsageError(verdict)
  _CHECKED = True
  _remember(key)


def verdicts_path() -> str:
  """Where passing verdicts of `check` are kept."""
  return layout.user_cache('xla_mnist-flags-checked.json')


def _verdict_key(given: dict[str, str]) -> str:
  try:
    version = importlib.metadata.version('tensorflow')
  except importlib.metadata.PackageNotFoundError:
    version = '?'
  text = json.dumps([version, sys.executable, sorted(given.items())])
  return hashlib.sha256(text.encode()).hexdigest()


def _verdicts() -> list[str]:
  try:
    with open(verdicts_path(), encoding='utf-8') as f:
      verdicts = json.load(f)
  except (OSError, ValueError):
    return []  # None yet, or unreadable: checked again.
  if not isinstance(verdicts, list):
    return []
  return [v for v in verdicts if isinstance(v, str)]


def _remember(key: str) -> None:
  """Adds `key` to the verdicts, atomically; a folder that cannot take it
  only means checking again next time."""
  path = verdicts_path()
  kept = [v for v in _verdicts() if v != key][-63:] + [key]
  with contextlib.suppress(OSError):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.')
    try:
      with os.fdopen(fd, 'w', encoding='utf-8') as f:
        json.dump(kept, f)
      os.replace(temporary, path)
    except OSError:
      os.unlink(temporary)


def _probe(given: dict[str, str], user: dict[str, str | None]) -> str | None:
  """What is wrong with the user's flags, from a child that compiles with
  them alone (none that xla_mnist added); None when it compiled, or failed
  for a reason of its own (the process's own import then shows it)."""
  child = {k: v for k, v in os.environ.items() if k not in user}
  child['TF_CPP_MIN_LOG_LEVEL'] = '3'  # Fatal lines only.
  try:
    # The child's dumps go to a scratch folder: the user's is for the run.
    with tempfile.TemporaryDirectory() as scratch:
      child.update(
        (k, _DUMP_TO.sub(lambda m: m.group(1) + scratch, v))
        for k, v in given.items()
      )
      done = subprocess.run(
        [sys.executable, '-c', _PROBE],
        env=child,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors='replace',
        timeout=600,
        check=False,
      )
  except (OSError, subprocess.TimeoutExpired):
    return None
  if done.returncode == 0:
    return None
  return _describe_fatal(done.stderr, given)


_FATAL = re.compile(r'^F\d{4} [^\]]*\] (.*)$')
_DUMP_TO = re.compile(r'(--xla_dump_to=)\S*')


def _describe_fatal(stderr: str, given: dict[str, str]) -> str | None:
  """TF's fatal flag line in `stderr` as the one error line, or None."""
  lines = stderr.splitlines()
  for i, line in enumerate(lines):
    match = _FATAL.match(line)
    if not match or 'parse_flags_from_env' not in line:
      continue
    said = match.group(1)
    unknown = re.match(r'Unknown flag in (\w+): (.*)', said)
    if unknown:
      name, flag = unknown.groups()
      return f'{name}: TF has no flag {flag}: {_fix(name)}'
    if 'Could not open file' in said:
      name = next((n for n in given if f'"{n}"' in said), _names(given))
      value = given.get(name, '')
      return (
        f'{name}={value!r}: not flags (they start with --) nor a file of'
        f' flags TF can read: {_fix(name)}'
      )
    usage = next((s for s in lines[i + 1 :] if s.startswith('usage: ')), '')
    flag = usage.removeprefix('usage: ').strip()
    if flag:
      name = next((n for n in given if flag in given[n]), _names(given))
      return f'{name}: TF cannot parse {flag} (a bad value): {_fix(name)}'
    return f'{_names(given)}: TF refuses them ({said}): {_fix(_names(given))}'
  return None


def _names(given: dict[str, str]) -> str:
  return ' or '.join(given)


def _fix(name: str) -> str:
  return f'fix or unset {name} (TF would stop at its first compile)'
