"""Regenerates the README's TensorBoard screenshots from a real run.

Trains the Fashion-MNIST recipe with the fused XLA loop and its last 100
steps traced, serves the run with TensorBoard, and photographs it in a
headless Chromium: `docs/loss_curve.png` (Scalars) and
`docs/profile_trace_viewer.png` (Profile, Trace Viewer). Needs Debian's
`chromium`, `chromium-driver` and `dataset-fashion-mnist`.

  .venv/bin/python scripts/screenshots.py [--data_dir=./data] [--outdir=docs]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))
from support import tensorboard_ui  # noqa: E402 - the test suite's driver.

TRAIN_FLAGS = (
  '--config=fashion_mnist',
  '--config.log_every=20',  # A denser loss curve than the default 100.
  '--config.profile_steps=100',  # One call of the fused loop.
  '--jit=on',
)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data_dir', default=os.path.join(REPO, 'data'))
  parser.add_argument('--outdir', default=os.path.join(REPO, 'docs'))
  args = parser.parse_args()
  if reason := tensorboard_ui.browser_missing():
    sys.exit(f'error: {reason}')
  os.makedirs(args.outdir, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix='screenshots-') as workdir:
    subprocess.run(
      [
        sys.executable,
        '-m',
        'xla_mnist.train',
        *TRAIN_FLAGS,
        f'--data_dir={args.data_dir}',
        f'--workdir={workdir}',
      ],
      cwd=REPO,
      check=True,
    )
    board = tensorboard_ui.TensorBoard(
      workdir, os.path.join(workdir, 'tensorboard.log')
    )
    browser = None
    try:
      board.wait_until_serving()
      browser = tensorboard_ui.Browser(board.base)
      browser.loss_chart()
      shoot(browser, os.path.join(args.outdir, 'loss_curve.png'))
      browser.trace_viewer()
      shoot(browser, os.path.join(args.outdir, 'profile_trace_viewer.png'))
    finally:
      if browser:
        browser.close()
      board.stop()


def shoot(browser: tensorboard_ui.Browser, path: str) -> None:
  spread = tensorboard_ui.pixel_spread(browser.screenshot(path))
  if spread < tensorboard_ui.MIN_PIXEL_SPREAD:
    sys.exit(f'error: {path} came out blank')
  print(f'wrote {path}')


if __name__ == '__main__':
  main()
