"""TensorBoard in a real headless Chromium, on a real traced training run.

Each check waits for what a user looks at to be drawn, not for HTTP 200:
the loss line, the step's graph nodes, the trace viewer's events. Without
Chromium the tests skip, except under CI, where that is a failure.
"""

from __future__ import annotations

import os

import pytest
from support import tensorboard_ui
from support.runs import train_here
from support.tensorboard_ui import require_chromium

STEPS = 300

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def chromium() -> None:
  """Skips without Chromium, except under CI where that is a failure."""
  require_chromium()


@pytest.fixture(scope='module')
def workdir(chromium, fashion_data_dir, tmp_path_factory) -> str:
  """A run of the fused XLA loop, its last 100 steps traced."""
  workdir = str(tmp_path_factory.mktemp('run'))
  train_here(
    '--config=fashion_mnist',
    f'--data_dir={fashion_data_dir}',
    f'--workdir={workdir}',
    f'--config.num_steps={STEPS}',
    '--config.profile_steps=100',
    '--jit=on',
  )
  return workdir


@pytest.fixture(scope='module')
def browser(workdir, tmp_path_factory):
  log_path = tmp_path_factory.mktemp('tensorboard') / 'log.txt'
  with tensorboard_ui.browsing(workdir, str(log_path)) as browser:
    yield browser


def assert_drawn(png: bytes) -> None:
  assert tensorboard_ui.pixel_spread(png) > tensorboard_ui.MIN_PIXEL_SPREAD


def test_scalars_draw_the_loss_curve(browser, tmp_path):
  card, lines = browser.loss_chart()
  assert lines == 2  # The smoothed curve and the raw one under it.
  assert_drawn(browser.screenshot(str(tmp_path / 'loss.png'), card))


def test_graphs_draw_the_training_step(browser, tmp_path):
  nodes = browser.graph_nodes()
  # The fused loop: K steps in one XLA while loop over the resident data.
  assert {'while', 'images', 'labels', 'indices'} <= set(nodes), nodes
  assert_drawn(browser.screenshot(str(tmp_path / 'graph.png')))


def test_profile_lists_the_run_and_the_trace_viewer_draws_it(
  browser, workdir, tmp_path
):
  session, events = browser.trace_viewer()
  (capture,) = os.listdir(os.path.join(workdir, 'plugins', 'profile'))
  assert session == capture
  assert f'train {STEPS}' in events  # The last call's step marker.
  assert any(name.endswith('fusion') for name in events), events[:50]
  assert_drawn(browser.screenshot(str(tmp_path / 'trace_viewer.png')))


# All the text TensorBoard drew, shadow roots included.
_PAGE_TEXT = """
const texts = [];
const walk = (root) => {
  for (const e of root.querySelectorAll('*')) {
    if (e.shadowRoot) walk(e.shadowRoot);
  }
  texts.push(root.textContent || '');
};
walk(document);
const text = texts.join(' ');
return text.includes(arguments[0]) ? text : null;
"""


def test_text_tab_shows_compares_why(chromium, compare_workdir, tmp_path):
  with tensorboard_ui.browsing(
    compare_workdir, str(tmp_path / 'log.txt')
  ) as browser:
    browser.open('text')
    text = browser.wait_for('the Why text', _PAGE_TEXT, 'on this machine')
    assert 'Why' in text and 'kernels ms' in text
    assert_drawn(browser.screenshot(str(tmp_path / 'why.png')))
