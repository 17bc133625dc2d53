"""The docs' links into the code point at what they name: a line anchor
drifts as the code above it changes, silently."""

from __future__ import annotations

import glob
import os
import re

import pytest

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


PAGES = sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


PAGES.append(os.path.join(ROOT, 'README.md'))


# [`name`](path#L12): the link's text names what line 12 defines.
ANCHOR = re.compile(r'\[`(\w+)`\]\(([^)#]+)#L(\d+)\)')


LINK = re.compile(r'\]\(([^)#\s]+)(?:#L(\d+))?\)')


def _anchors() -> list[tuple[str, str, str, int]]:
  found = []
  for page in PAGES:
    with open(page) as f:
      text = f.read()
    found += [
      (os.path.relpath(page, ROOT), name, path, int(line))
      for name, path, line in ANCHOR.findall(text)
    ]
  return found


def test_the_walkthrough_has_line_anchors():
  pages = {page for page, *_ in _anchors()}
  assert os.path.join('docs', 'development.md') in pages


@pytest.mark.parametrize('page, name, path, line', _anchors())
def test_a_line_anchor_points_at_what_it_names(page, name, path, line):
  target = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path))
  with open(target) as f:
    lines = f.read().splitlines()
  assert line <= len(lines), f'{page}: {path} has {len(lines)} lines'
  defines = re.compile(rf'^\s*(def|class)\s+{name}\b|^{name}\s*[:=]')
  assert defines.match(lines[line - 1]), (
    f'{page}: {path}#L{line} is {lines[line - 1].strip()!r}, not {name}'
  )


@pytest.mark.parametrize('page', PAGES, ids=os.path.basename)
def test_relative_links_reach_a_file(page):
  with open(page) as f:
    text = f.read()
  missing = [
    path
    for path, _ in LINK.findall(text)
    if '://' not in path
    and not path.startswith('mailto:')
    and not os.path.exists(os.path.join(os.path.dirname(page), path))
  ]
  assert not missing, f'{os.path.relpath(page, ROOT)} links to {missing}'
