"""The Explorer and the HTML report in a real browser (Debian's Chromium).

JupyterLab 4, then the classic notebook interface (Notebook 7), is started on
a free loopback port with a token; Playwright drives Chromium through the
first tutorial: run all cells, then check on the page that the widget
rendered, that its diagram is an SVG with the forward and backward clusters,
that switching the policy changes the residual table and that the compiled
costs arrive. Without Chromium these tests fail and say how to install it.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = '/usr/bin/chromium'
SCREENSHOT = ROOT / 'docs' / 'explorer.png'
BROKEN_WIDGET = ('Error displaying widget', 'Failed to load model')


def _require_chromium():
  if not os.access(CHROMIUM, os.X_OK):
    pytest.fail(f'{CHROMIUM} is missing: install Debian\'s Chromium with '
                '`sudo apt-get install chromium` (make test does this as root).')


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


@pytest.fixture(scope='module')
def browser():
  _require_chromium()
  from playwright.sync_api import sync_playwright
  with sync_playwright() as p:
    browser = p.chromium.launch(
        executable_path=CHROMIUM, headless=True,
        args=['--no-sandbox', '--disable-background-networking',
              '--disable-component-update', '--no-first-run'])
    yield browser
    browser.close()


def _serve(app: str, tmp_path_factory):
  """Start `jupyter <app>` on a free loopback port with a token; yield
  (base URL, token) while it runs."""
  port, token = _free_port(), secrets.token_hex(16)
  runtime = tmp_path_factory.mktemp('jupyter-runtime')
  env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime), JUPYTER_TOKEN=token)
  app_class = {'lab': 'LabApp', 'notebook': 'JupyterNotebookApp'}[app]
  process = subprocess.Popen(
      [sys.executable, '-m', 'jupyter', app, '--no-browser',
       '--ServerApp.ip=127.0.0.1', f'--ServerApp.port={port}',
       '--ServerApp.port_retries=0', f'--ServerApp.root_dir={ROOT / "notebooks"}',
       f'--{app_class}.expose_app_in_browser=True', '--ServerApp.disable_check_xsrf=False',
       *(['--allow-root'] if os.geteuid() == 0 else [])],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  base = f'http://127.0.0.1:{port}'
  deadline = time.time() + 90
  while time.time() < deadline and process.poll() is None:
    try:
      urllib.request.urlopen(f'{base}/api/status?token={token}', timeout=2)
      break
    except OSError:
      time.sleep(0.5)
  else:
    process.kill()
    pytest.fail(f'jupyter {app} did not start: ' + process.stdout.read().decode()[-2000:])
  yield base, token
  process.terminate()
  try:
    process.wait(timeout=20)
  except subprocess.TimeoutExpired:
    process.kill()


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
  yield from _serve('lab', tmp_path_factory)


@pytest.fixture(scope='module')
def classic_notebook(tmp_path_factory):
  yield from _serve('notebook', tmp_path_factory)


def test_lab_refuses_requests_without_the_token(lab):
  base, _ = lab
  with pytest.raises(urllib.error.HTTPError) as e:
    urllib.request.urlopen(f'{base}/api/contents', timeout=5)
  assert e.value.code == 403


def _run_all_cells(page, url):
  page.goto(url)
  page.wait_for_function('window.jupyterapp && window.jupyterapp.shell', timeout=60_000)
  page.wait_for_selector('.jp-Notebook', timeout=60_000)
  # Wait for the kernel, then run every cell.
  page.wait_for_function(
      "document.querySelector('.jp-Notebook') && "
      "window.jupyterapp.shell.currentWidget && "
      "window.jupyterapp.shell.currentWidget.sessionContext.session && "
      "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel && "
      "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
      timeout=120_000)
  page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


def _check_explorer(page):
  """The Explorer of notebook 01 rendered, with its diagram, and its residual
  table and compiled costs following the policy control. Returns it."""
  explorer = page.locator('.remat-explorer').first
  explorer.wait_for(timeout=240_000)
  for tab in ('Split diagram', 'Residuals', 'Costs', 'Compare', 'Program'):
    assert explorer.get_by_text(tab, exact=True).count() >= 1, tab
  svg = explorer.locator('.remat-split svg').first
  svg.wait_for(timeout=60_000)
  cluster_titles = svg.locator('g.cluster > title').all_text_contents()
  assert any('forward' in t for t in cluster_titles), cluster_titles
  assert any('backward' in t for t in cluster_titles), cluster_titles

  # The residual table follows the policy control.
  explorer.get_by_role('tab', name='Residuals').click()
  table = explorer.locator('.remat-residuals').first
  table.wait_for(timeout=60_000)
  before = table.inner_text()
  explorer.locator('.remat-policy select').select_option('everything_saveable')
  page.wait_for_function(
      "([old]) => { const t = document.querySelector('.remat-explorer .remat-residuals');"
      " return t && t.innerText !== old; }", arg=[before], timeout=60_000)
  assert 'everything_saveable' in table.inner_text()

  # The compiled costs arrive from the kernel's background thread.
  explorer.get_by_role('tab', name='Costs').click()
  page.wait_for_function(
      "() => { const e = document.querySelector('.remat-explorer .remat-costs');"
      " return e && e.innerText.includes('peak bytes'); }", timeout=120_000)

  content = page.content()
  for message in BROKEN_WIDGET:
    assert message not in content
  return explorer


def test_explorer_in_jupyterlab(lab, browser):
  base, token = lab
  page = browser.new_page(viewport={'width': 1500, 'height': 1100})
  _run_all_cells(page, f'{base}/lab/tree/01_remat_basics.ipynb?token={token}')
  explorer = _check_explorer(page)
  SCREENSHOT.parent.mkdir(exist_ok=True)
  for dismiss in page.get_by_role('button', name='No').all():
    dismiss.click()  # JupyterLab's "get notified about news?" toast
  page.evaluate("window.jupyterapp.shell.collapseLeft()")
  explorer.get_by_role('tab', name='Split diagram').click()
  page.wait_for_timeout(500)
  explorer.screenshot(path=str(SCREENSHOT))
  assert SCREENSHOT.stat().st_size > 10_000
  page.close()


def test_explorer_in_the_classic_notebook(classic_notebook, browser):
  base, token = classic_notebook
  page = browser.new_page(viewport={'width': 1400, 'height': 1000})
  _run_all_cells(page, f'{base}/notebooks/01_remat_basics.ipynb?token={token}')
  _check_explorer(page)
  page.close()


def test_static_report_renders_its_diagrams_and_charts(browser, tmp_path):
  from remat_explorer import examples
  from remat_explorer.analysis import compare
  from remat_explorer.viz.html_report import report_html
  loss_fn, args = examples.mlp(num_layers=3, width=32, batch=8)
  comparison = compare(loss_fn, *args)
  path = tmp_path / 'report.html'
  path.write_text(report_html(comparison, comparison.row('dots_saveable').report))
  page = browser.new_page()
  page.goto(path.as_uri())
  assert page.locator('svg g.cluster').count() >= 2
  charts = page.locator('img.chart')
  assert charts.count() >= 3
  widths = page.evaluate(
      "Array.from(document.querySelectorAll('img.chart')).map(i => i.naturalWidth)")
  assert all(w > 100 for w in widths), widths
  assert re.search(r'Policies compared', page.inner_text('body'))
  page.close()
