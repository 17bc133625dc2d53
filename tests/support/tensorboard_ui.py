"""TensorBoard as a user sees it: a real server and a headless Chromium.

The browser tests and `scripts/screenshots.py` drive the same pages the same
way, from here. An HTTP 200 proves little: each check waits until the page
has drawn what a user looks at (the loss line, the graph's nodes, the trace
viewer's events). Chromium and its driver are Debian's (`apt-get install
chromium chromium-driver`): nothing is downloaded at run time.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from PIL import Image, ImageStat
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

CHROMIUM = '/usr/bin/chromium'
CHROMEDRIVER = '/usr/bin/chromedriver'
CHROMIUM_FLAGS = (
  '--headless',
  '--no-sandbox',  # Root in a container.
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
  '--window-size=1400,900',
)
STARTUP_SECONDS = 90
RENDER_SECONDS = 30
MIN_PIXEL_SPREAD = 5  # Grey-level stddev; a blank page is about 0.

# `deep(root, selector)`: matches in `root` and in every shadow root below
# it, as TensorBoard's Polymer dashboards keep their charts in shadow DOM.
_DEEP = """
const deep = (root, selector) => {
  const found = [...root.querySelectorAll(selector)];
  for (const e of root.querySelectorAll('*'))
    if (e.shadowRoot) found.push(...deep(e.shadowRoot, selector));
  return found;
};
"""
# The loss card and its drawn series: Plottable paths of one segment or more.
_LOSS_CHART = (
  _DEEP
  + """
const card = deep(document, 'tf-scalar-card')
  .find((c) => c.tag === 'train/loss');
if (!card) return null;
const lines = deep(card.shadowRoot, 'path.line')
  .filter((p) => (p.getAttribute('d') || '').includes('L'));
return lines.length ? [card, lines.length] : null;
"""
)
_GRAPH_NODES = (
  _DEEP
  + """
const nodes = deep(document, 'g.node[data-name]');
return nodes.length ? nodes.map((e) => e.getAttribute('data-name')) : null;
"""
)
# The HParams table as drawn: vaadin-grid's header and body rows, each cell's
# text from the content slotted into it; None until a body row is drawn.
_HPARAMS_TABLE = (
  _DEEP
  + """
const grid = deep(document, 'tf-hparams-table-view vaadin-grid')[0]
  || deep(document, 'vaadin-grid')[0];
if (!grid) return null;
const rows = [...grid.shadowRoot.querySelectorAll('tr')].map((row) =>
  [...row.querySelectorAll('th, td')].map((cell) => {
    const slot = cell.querySelector('slot');
    const nodes = slot ? slot.assignedNodes({flatten: true}) : [];
    return nodes.map((n) => n.textContent.trim()).join(' ');
  }));
const filled = rows.filter((r) => r.some((text) => text));
return filled.length > 1 ? filled : null;
"""
)
# The catapult trace viewer's model: the names of the events it draws. Its
# Web Components polyfill breaks NodeList.forEach, hence plain loops.
_TRACE_EVENTS = """
const viewer = document.querySelector('tf-trace-viewer');
const model = viewer && viewer._traceViewer && viewer._traceViewer.model;
if (!model) return null;
const names = [];
for (const thread of model.getAllThreads())
  for (const slice of thread.sliceGroup.slices) names.push(slice.title);
return names.length ? names : null;
"""


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class TensorBoard:
  """A TensorBoard process on a free local port, and its HTTP API."""

  def __init__(self, logdir: str, log_path: str):
    self.log_path = log_path
    port = free_port()
    self.base = f'http://127.0.0.1:{port}'
    with open(log_path, 'wb') as log:
      self.process = subprocess.Popen(
        [
          sys.executable,
          '-m',
          'tensorboard.main',
          '--logdir',
          logdir,
          '--host',
          '127.0.0.1',
          '--port',
          str(port),
          '--reload_interval',
          '1',
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
      )

  def stop(self) -> None:
    self.process.terminate()
    try:
      self.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()

  def get(self, path: str, **query: str) -> Any:
    url = f'{self.base}{path}?{urllib.parse.urlencode(query)}'
    with urllib.request.urlopen(url, timeout=30) as response:
      body = response.read()
      if response.headers.get('Content-Encoding') == 'gzip':
        body = gzip.decompress(body)  # The profile plugin always gzips.
    return json.loads(body)

  def text(self, path: str, **query: str) -> str:
    """A GET's body as text (the graphs plugin answers in pbtxt)."""
    url = f'{self.base}{path}?{urllib.parse.urlencode(query)}'
    with urllib.request.urlopen(url, timeout=30) as response:
      return response.read().decode()

  def post(self, path: str, body: dict) -> Any:
    """A POST of `body` as JSON (the HParams plugin's queries)."""
    request = urllib.request.Request(
      f'{self.base}{path}',
      data=json.dumps(body).encode(),
      headers={'Content-Type': 'application/json'},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
      return json.loads(response.read())

  def poll(
    self, path: str, ready: Callable[[Any], bool], seconds: float, **query: str
  ) -> Any:
    """GETs `path` until `ready(answer)`: TensorBoard loads logs lazily."""
    deadline = time.monotonic() + seconds
    while self.process.poll() is None and time.monotonic() < deadline:
      try:
        answer = self.get(path, **query)
        if ready(answer):
          return answer
      except (urllib.error.URLError, ConnectionError):
        pass  # Not listening yet.
      time.sleep(0.5)
    with open(self.log_path, errors='replace') as log:
      tail = log.read()[-3000:]
    raise TimeoutError(
      f'TensorBoard gave no answer to {path} in {seconds} s:\n{tail}'
    )

  def wait_until_serving(self) -> None:
    self.poll('/data/plugins_listing', bool, STARTUP_SECONDS)


def require_chromium() -> None:
  """Skips without Debian's Chromium, except under CI where that fails."""
  import pytest

  if reason := browser_missing():
    if os.environ.get('CI'):
      pytest.fail(reason)
    pytest.skip(reason)


def browser_missing() -> str | None:
  """Why the browser cannot run here, or None when it can."""
  for path, package in (
    (CHROMIUM, 'chromium'),
    (CHROMEDRIVER, 'chromium-driver'),
  ):
    if not os.access(path, os.X_OK):
      return f'{path} is missing: apt-get install {package}'
  return None


class Browser:
  """A headless Chromium on TensorBoard's pages, with a fresh profile."""

  def __init__(self, base: str):
    self.base = base
    self._profile = tempfile.TemporaryDirectory(prefix='chromium-')
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f'--user-data-dir={self._profile.name}'):
      options.add_argument(flag)
    self.driver = webdriver.Chrome(
      options=options, service=Service(CHROMEDRIVER)
    )

  def close(self) -> None:
    try:
      self.driver.quit()
    finally:
      self._profile.cleanup()

  def open(self, dashboard: str) -> None:
    """Loads a dashboard afresh; a hash change alone keeps the old DOM."""
    self.driver.get('about:blank')
    self.driver.get(f'{self.base}/#{dashboard}')

  def wait_for(self, what: str, script: str, *args: Any) -> Any:
    """Runs `script` until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + RENDER_SECONDS
    while time.monotonic() < deadline:
      try:
        if value := self.driver.execute_script(script, *args):
          return value
      except WebDriverException:
        pass  # The page is still loading its scripts.
      time.sleep(0.5)
    raise TimeoutError(f'{what}: not drawn in {RENDER_SECONDS} s')

  def loss_chart(self) -> tuple[WebElement, int]:
    """Scalars: the loss card and the number of drawn lines in its chart.

    Filtered to the loss, as a user would type it: TensorBoard draws only
    the charts in view, and `train` comes after the other groups.
    """
    self.open('scalars&tagFilter=train%2Floss')
    card, lines = self.wait_for('the loss chart', _LOSS_CHART)
    return card, lines

  def graph_nodes(self) -> list[str]:
    """Graphs: the names of the drawn nodes of the run's graph."""
    self.open('graphs')
    return self.wait_for('the graph', _GRAPH_NODES)

  def hparams_table(self) -> list[dict[str, str]]:
    """HParams: the table view's rows, as {column title: cell text}."""
    self.open('hparams')
    header, *rows = self.wait_for('the HParams table', _HPARAMS_TABLE)
    return [dict(zip(header, row, strict=False)) for row in rows]

  def trace_viewer(self) -> tuple[str, list[str]]:
    """Profile: opens the Trace Viewer like a user, in the plugin's iframe.

    Returns the session the Profile tab lists and the names of the events the
    trace viewer loaded; the driver is left on the top page.
    """
    self.open('profile')
    driver = self.driver
    driver.switch_to.frame(self._wait_element('iframe'))
    try:
      tools = self._wait_select('Overview Page')
      session = driver.find_elements(By.CSS_SELECTOR, 'mat-select')[0].text
      tools.click()
      option = self.wait_for(
        'the Trace Viewer tool',
        'return [...document.querySelectorAll("mat-option")]'
        '.find((o) => o.textContent.trim() === "Trace Viewer");',
      )
      option.click()
      driver.switch_to.frame(self._wait_element('iframe'))
      events = self.wait_for('the trace events', _TRACE_EVENTS)
    finally:
      driver.switch_to.default_content()
    return session, events

  def screenshot(self, path: str, element: WebElement | None = None) -> bytes:
    """Saves the window, or one element of it, as a PNG; returns its bytes."""
    if element is None:
      png = self.driver.get_screenshot_as_png()
    else:
      png = element.screenshot_as_png
    with open(path, 'wb') as f:
      f.write(png)
    return png

  def _wait_element(self, selector: str) -> WebElement:
    return self.wait_for(
      selector, 'return document.querySelector(arguments[0]);', selector
    )

  def _wait_select(self, text: str) -> WebElement:
    return self.wait_for(
      f'the {text} selector',
      'return [...document.querySelectorAll("mat-select")]'
      '.find((s) => s.textContent.includes(arguments[0]));',
      text,
    )


def pixel_spread(png: bytes) -> float:
  """The grey levels' standard deviation, to tell a drawn page from a blank
  one (compare with `MIN_PIXEL_SPREAD`)."""
  with Image.open(io.BytesIO(png)) as image:
    return ImageStat.Stat(image.convert('L')).stddev[0]


@contextlib.contextmanager
def browsing(workdir: str, log_path: str) -> Iterator[Browser]:
  """A TensorBoard serving `workdir` and a browser on it, both stopped after."""
  board = TensorBoard(workdir, log_path)
  browser = None
  try:
    board.wait_until_serving()
    browser = Browser(board.base)
    yield browser
  finally:
    if browser:
      browser.close()
    board.stop()
