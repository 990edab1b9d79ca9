"""The Explorer and the HTML report in a real browser (Debian's Chromium).

JupyterLab 4, then the classic notebook interface (Notebook 7), is started on
a free loopback port with a token, on a temporary copy of the notebooks and
with its own settings (news and update checks off: their notifications cover
the page), configuration and data folders. Playwright drives Chromium
through the first tutorial: run all cells, then check on the page that the
widget rendered, that its diagram pans and zooms with readable text, that
the policy control drives the views (with the old figures marked while a
compile runs), that a click on a diagram node reaches Python, that no button
is cut and no terminal escape shows. A notebook executed elsewhere, opened
untrusted, shows the Explorer's static snapshot (its costs, timeline and
diagrams as images, or its error); opened trusted with no kernel holding
its widgets, it draws them from the state saved with it. Every wait is for a condition on
the page, never a fixed time. Without Chromium these tests fail and say how
to install it.

The screenshot of the Explorer goes to a temporary file;
``REMAT_UPDATE_SCREENSHOT=1`` also writes it to ``docs/pages/explorer.png``.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import secrets
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from remat_explorer.viz.html.snapshot import SNAPSHOT_NOTE

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = '/usr/bin/chromium'
DOCS_SCREENSHOT = ROOT / 'docs' / 'pages' / 'explorer.png'
BROKEN_WIDGET = ('Error displaying widget', 'Failed to load model')
MIN_TEXT_PX = 11
# No notification toasts over the page: no news, no update checks, none shown.
LAB_SETTINGS = {'@jupyterlab/apputils-extension/notification.jupyterlab-settings': {
    'fetchNews': 'false', 'checkForUpdates': False, 'doNotDisturbMode': True}}
UNTRUSTED_NOTEBOOK = 'untrusted.ipynb'
TRUSTED_NOTEBOOK = 'reopened.ipynb'
SHARED_NOTEBOOK = 'shared.ipynb'
PEAK_NOTEBOOK = 'peak.ipynb'

# One worker runs them all (under `--dist loadgroup`): one JupyterLab server.
pytestmark = pytest.mark.xdist_group('browser')


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


def _jupyter_home(tmp_path_factory) -> tuple[Path, dict]:
  """A folder of its own for one Jupyter server: notebooks, settings,
  workspaces, configuration, data (the notebook trust database) and
  runtime files, so parallel servers and the user's own never meet."""
  home = tmp_path_factory.mktemp('jupyter')
  notebooks = home / 'notebooks'
  shutil.copytree(ROOT / 'notebooks', notebooks)
  for name, settings in LAB_SETTINGS.items():
    path = home / 'settings' / name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(settings))
  env = dict(os.environ,
             JUPYTERLAB_SETTINGS_DIR=str(home / 'settings'),
             JUPYTERLAB_WORKSPACES_DIR=str(home / 'workspaces'),
             JUPYTER_CONFIG_DIR=str(home / 'config'),
             JUPYTER_DATA_DIR=str(home / 'data'),
             JUPYTER_RUNTIME_DIR=str(home / 'runtime'),
             # The kernel imports this checkout.
             PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
  return notebooks, env


def _serve(app: str, tmp_path_factory):
  """Start `jupyter <app>` on a free loopback port with a token; yield
  (base URL, token, notebook folder) while it runs."""
  port, token = _free_port(), secrets.token_hex(16)
  notebooks, env = _jupyter_home(tmp_path_factory)
  env['JUPYTER_TOKEN'] = token
  app_class = {'lab': 'LabApp', 'notebook': 'JupyterNotebookApp'}[app]
  log = open(notebooks.parent / 'server.log', 'wb')
  process = subprocess.Popen(
      [sys.executable, '-m', 'jupyter', app, '--no-browser',
       '--ServerApp.ip=127.0.0.1', f'--ServerApp.port={port}',
       '--ServerApp.port_retries=0', f'--ServerApp.root_dir={notebooks}',
       f'--{app_class}.expose_app_in_browser=True', '--ServerApp.disable_check_xsrf=False',
       *(['--LabApp.news_url=None',
          '--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate']
         if app == 'lab' else []),
       *(['--allow-root'] if os.geteuid() == 0 else [])],
      env=env, stdout=log, stderr=subprocess.STDOUT)
  base = f'http://127.0.0.1:{port}'
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline and process.poll() is None:
    try:
      urllib.request.urlopen(f'{base}/api/status?token={token}', timeout=2)
      break
    except OSError:
      time.sleep(0.25)  # polling for the server to answer
  else:
    process.kill()
    log.close()
    pytest.fail(f'jupyter {app} did not start: '
                + (notebooks.parent / 'server.log').read_text()[-2000:])
  yield base, token, notebooks
  process.terminate()
  try:
    process.wait(timeout=20)
  except subprocess.TimeoutExpired:
    process.kill()
  log.close()


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
  yield from _serve('lab', tmp_path_factory)


@pytest.fixture(scope='module')
def classic_notebook(tmp_path_factory):
  yield from _serve('notebook', tmp_path_factory)


def test_lab_refuses_requests_without_the_token(lab):
  base, _, _ = lab
  with pytest.raises(urllib.error.HTTPError) as e:
    urllib.request.urlopen(f'{base}/api/contents', timeout=5)
  assert e.value.code == 403


_KERNEL = ('window.jupyterapp.shell.currentWidget.sessionContext.session'
           ' && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel')


def _open(page, url):
  """Open a notebook and wait until it is the page's current one, shown.
  (JupyterLab may also restore, in hidden tabs, notebooks that earlier
  tests opened: tests read the current notebook's panel, `_panel`.)"""
  page.goto(url)
  name = urllib.parse.urlparse(url).path.rsplit('/', 1)[-1]
  page.wait_for_function(
      """([name]) => { const app = window.jupyterapp;
        const w = app && app.shell && app.shell.currentWidget;
        return Boolean(w && w.context && w.context.path.endsWith(name) && w.isVisible
                       && w.node.querySelector('.jp-Notebook')); }""",
      arg=[name], timeout=90_000)


def _panel(page) -> str:
  """A CSS selector for the current notebook's panel."""
  return '#' + page.evaluate('() => window.jupyterapp.shell.currentWidget.id')


def _assert_no_broken_widget(page) -> None:
  """No widget of the notebook on screen failed to draw. Only its panel is
  read: the server's workspace reopens, hidden, notebooks that earlier
  tests opened, whose kernels are gone."""
  content = page.locator(_panel(page)).inner_html()
  for message in BROKEN_WIDGET:
    assert message not in content, message


def _run_all_cells(page, url):
  _open(page, url)
  page.wait_for_function(f"{_KERNEL} && ({_KERNEL}).status === 'idle'", timeout=180_000)
  page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


def _kernel_print(page, code: str) -> str:
  """What `code` prints, run in the notebook's kernel (after any queued cells)."""
  return page.evaluate(f"""async ([code]) => {{
    const kernel = {_KERNEL};
    const future = kernel.requestExecute({{code, store_history: false}});
    let out = '';
    future.onIOPub = (msg) => {{
      if (msg.header.msg_type === 'stream') out += msg.content.text;
      if (msg.header.msg_type === 'error') out += msg.content.ename + ': ' + msg.content.evalue;
    }};
    await future.done;
    return out;
  }}""", [code])


def _transform(viewer) -> str:
  return viewer.locator('.remat-zoom-layer').get_attribute('transform')


def _check_viewer(page, viewer):
  """The diagram shows at a readable size; the wheel zooms, a drag pans,
  the fit button shows it whole. Returns the smallest label's size (px)."""
  layer = viewer.locator('.remat-zoom-layer')
  layer.wait_for(timeout=60_000)
  smallest = page.evaluate("""(viewer) => {
    const stage = viewer.querySelector('.remat-viewer-stage').getBoundingClientRect();
    const sizes = [];
    for (const t of viewer.querySelectorAll('g.node text')) {
      const r = t.getBoundingClientRect();
      if (r.width === 0 || r.bottom < stage.top || r.top > stage.bottom) continue;
      sizes.push(parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
    }
    return sizes.length ? Math.min(...sizes) : 0;
  }""", viewer.element_handle())
  assert smallest >= MIN_TEXT_PX, f'smallest node label on screen: {smallest:.1f} px'

  stage = viewer.locator('.remat-viewer-stage')
  stage.scroll_into_view_if_needed()
  box = stage.bounding_box()
  # Hovering waits until the stage is still and is what the pointer hits.
  spot = {'x': box['width'] / 2, 'y': min(box['height'] / 2, 200)}
  before = _transform(viewer)
  stage.hover(position=spot)
  page.mouse.wheel(0, 400)
  page.wait_for_function(
      "([el, old]) => el.getAttribute('transform') !== old",
      arg=[layer.element_handle(), before], timeout=10_000)
  zoomed = _scale(_transform(viewer))
  assert zoomed < _scale(before), (before, _transform(viewer))

  before = _transform(viewer)
  stage.hover(position=spot)
  box = stage.bounding_box()
  x, y = box['x'] + spot['x'], box['y'] + spot['y']
  page.mouse.down()
  page.mouse.move(x - 120, y - 80, steps=6)
  page.mouse.up()
  assert _transform(viewer) != before and _scale(_transform(viewer)) == zoomed

  # Each button's effect is waited for, not read at once: one suite run
  # under load read the fit zoom (0.46) just after 100% was clicked.
  viewer.get_by_role('button', name='fit').click()
  page.wait_for_function("""(viewer) => {
    const stage = viewer.querySelector('.remat-viewer-stage').getBoundingClientRect();
    const drawn = viewer.querySelector('.remat-zoom-layer').getBoundingClientRect();
    return drawn.left >= stage.left - 1 && drawn.right <= stage.right + 1
        && drawn.top >= stage.top - 1 && drawn.bottom <= stage.bottom + 1;
  }""", arg=viewer.element_handle(), timeout=10_000)  # the whole diagram in view
  assert _scale(_transform(viewer)) <= 4 / 3
  viewer.get_by_role('button', name='100%').click()
  page.wait_for_function("""(layer) => {
    const k = /scale\\(([\\d.e-]+)\\)/.exec(layer.getAttribute('transform'));
    return k && Math.abs(parseFloat(k[1]) - 4 / 3) < 1e-6;
  }""", arg=layer.element_handle(), timeout=10_000)  # its natural size
  assert _scale(_transform(viewer)) == pytest.approx(4 / 3)

  # The search box takes its keys, in a notebook too (where letters and
  # digits are commands): a node's id finds it.
  node_id = viewer.locator('g.node').first.get_attribute('id')
  search = viewer.get_by_role('searchbox')
  search.press_sequentially(node_id)
  assert search.input_value() == node_id
  assert re.fullmatch(r'1 of \d+', viewer.locator('.remat-viewer-found').inner_text())
  current = viewer.locator('g.node.remat-match-current')
  assert node_id in current.evaluate("(g) => g.querySelector('title').textContent + ' '"
                                     " + g.querySelector('a').getAttribute('xlink:title')")
  search.press('Escape')
  assert viewer.locator('g.node.remat-match').count() == 0
  return smallest


def _scale(transform: str) -> float:
  return float(re.search(r'scale\(([\d.e-]+)\)', transform).group(1))


def _note_once(explorer, **marks: str) -> None:
  """Watch `explorer` for marks that may come and go between two polls:
  each mark (a JavaScript condition on ``e``, the Explorer's element) is
  noted as ``e.dataset[name] = '1'`` once it held. A note is itself a
  mutation of what is watched, so each is written once and the watcher
  stops when all are: otherwise it would wake itself without end and
  freeze the page."""
  conditions = ', '.join(f'{name}: () => {condition}' for name, condition in marks.items())
  explorer.evaluate(f"""(e) => {{
    const marks = {{{conditions}}};
    for (const name in marks) delete e.dataset[name];
    const observer = new MutationObserver(() => {{
      for (const [name, holds] of Object.entries(marks))
        if (!e.dataset[name] && holds()) e.dataset[name] = '1';
      if (Object.keys(marks).every((name) => e.dataset[name])) observer.disconnect();
    }});
    observer.observe(e, {{subtree: true, childList: true, attributes: true}});
  }}""")


def _check_explorer(page):
  """The Explorer of notebook 01 rendered, with its diagram, and its residual
  table and compiled costs following the policy control. Returns it."""
  explorer = page.locator(f'{_panel(page)} .remat-explorer').first
  explorer.wait_for(timeout=240_000)
  for tab in ('Split diagram', 'Residuals', 'Costs', 'Compare', 'Program'):
    assert explorer.get_by_text(tab, exact=True).count() >= 1, tab
  svg = explorer.locator('.remat-viewer svg').first
  svg.wait_for(timeout=60_000)
  cluster_titles = svg.locator('g.cluster > title').all_text_contents()
  assert any('forward' in t for t in cluster_titles), cluster_titles
  assert any('backward' in t for t in cluster_titles), cluster_titles
  _check_viewer(page, explorer.locator('.remat-viewer').first)
  # A kernel holds it: no note that it needs one.
  assert explorer.locator('.remat-needs-kernel').count() == 1
  assert not explorer.locator('.remat-needs-kernel').is_visible()

  # The residual table follows the policy control; the compiled costs
  # follow from the kernel's background thread, the old ones greyed and
  # labelled meanwhile, an indeterminate bar (one compile) running.
  explorer.get_by_role('tab', name='Residuals').click()
  table = explorer.locator('.remat-residuals').first
  table.wait_for(timeout=60_000)
  before = table.inner_text()
  page.wait_for_function(  # the first compile is done
      "(e) => !e.querySelector('.remat-task')", arg=explorer.element_handle(), timeout=240_000)
  # The marks last as long as the compile, which may be short: a watcher
  # notes that they appeared.
  _note_once(explorer, sawStale="e.querySelector('.remat-stale .remat-costs')",
             sawBar="e.querySelector('.remat-task progress:not([value])')")
  explorer.locator('.remat-policy select').select_option('everything_saveable')
  page.wait_for_function("(e) => e.dataset.sawStale && e.dataset.sawBar",
                         arg=explorer.element_handle(), timeout=60_000)
  page.wait_for_function(
      "([e, old]) => { const t = e.querySelector('.remat-residuals');"
      " return t && t.innerText !== old; }", arg=[explorer.element_handle(), before],
      timeout=60_000)
  assert 'everything_saveable' in table.inner_text()
  explorer.get_by_role('tab', name='Costs').click()
  page.wait_for_function(
      "(x) => { const e = x.querySelector('.remat-costs');"
      " return e && e.innerText.includes('compiled under everything_saveable')"
      " && !e.closest('.remat-stale'); }", arg=explorer.element_handle(), timeout=180_000)

  _assert_no_broken_widget(page)
  return explorer


def _cut_selects(explorer) -> list[str]:
  """The dropdowns whose chosen option is wider than the room they give it
  and not given whole as their tooltip."""
  return explorer.evaluate("""(e) => {
    const measure = document.createElement('canvas').getContext('2d');
    // ipywidgets puts a widget's tooltip on its element or on its label.
    const tooltip = (s) => s.getAttribute('title')
        || s.parentElement.querySelector('[title]')?.getAttribute('title')
        || s.closest('[title]')?.getAttribute('title');
    return Array.from(e.querySelectorAll('select:not([multiple])'))
        .filter((s) => s.offsetParent !== null && s.selectedIndex >= 0)
        // (ipywidgets writes an option's spaces as no-break spaces)
        .filter((s) => tooltip(s) !== s.options[s.selectedIndex].text.replace(/\u00a0/g, ' '))
        .filter((s) => {
          const style = getComputedStyle(s);
          measure.font = style.font;
          const room = s.clientWidth - parseFloat(style.paddingLeft)
                       - parseFloat(style.paddingRight);
          return measure.measureText(s.options[s.selectedIndex].text).width > room + 0.5;
        })
        .map((s) => s.value);
  }""")


def _check_nothing_cut_and_no_escapes(page, explorer):
  """After a comparison (its policy buttons on the page): every button shows
  its whole text, and no terminal escape is anywhere in the widget."""
  explorer.get_by_role('tab', name='Compare').click()
  # A comparison counts its compiles: a determinate bar. Where the compiles
  # are found in the cache it may come and go between two polls, so a
  # watcher set before the click notes that it was shown.
  _note_once(explorer, sawCountedBar="e.querySelector('.remat-task progress[max]')"
                                     "?.offsetParent != null")
  explorer.get_by_role('button', name='compare all policies').click()
  page.wait_for_function(
      "(e) => e.querySelectorAll('.widget-toggle-button').length > 3"
      " && !e.querySelector('.remat-task')", arg=explorer.element_handle(), timeout=300_000)
  assert explorer.evaluate('(e) => e.dataset.sawCountedBar') == '1'
  cut = explorer.evaluate("""(e) => Array.from(e.querySelectorAll('button'))
      .filter(b => b.offsetParent !== null && b.scrollWidth > b.clientWidth)
      .map(b => b.innerText)""")
  assert cut == [], f'buttons whose text is cut: {cut}'
  assert _cut_selects(explorer) == []
  explorer.get_by_role('tab', name='Program').click()
  explorer.locator('.remat-jaxpr').first.wait_for(timeout=30_000)
  text = explorer.evaluate('(e) => e.textContent')
  assert '\x1b[' not in text and '[35m' not in text and '\ufffd' not in text


def test_explorer_in_jupyterlab(lab, browser, tmp_path):
  base, token, _ = lab
  page = browser.new_page(viewport={'width': 1440, 'height': 900},
                          permissions=['clipboard-read', 'clipboard-write'])
  _run_all_cells(page, f'{base}/lab/tree/01_remat_basics.ipynb?token={token}')
  explorer = _check_explorer(page)
  _screenshot(page, explorer, tmp_path / 'explorer.png')

  # A click on a diagram node reaches Python (the hook for opening groups).
  explorer.get_by_role('tab', name='Split diagram').click()
  viewer = explorer.locator('.remat-viewer').first
  viewer.locator('.remat-viewer-stage').hover()  # in view, still
  node = page.evaluate("""(viewer) => {
    const stage = viewer.querySelector('.remat-viewer-stage').getBoundingClientRect();
    for (const g of viewer.querySelectorAll('g.node')) {
      const r = g.getBoundingClientRect();
      const x = (r.left + r.right) / 2, y = (r.top + r.bottom) / 2;
      const hit = document.elementFromPoint(x, y);  // not under an edge or label
      if (r.left > stage.left && r.right < stage.right && r.top > stage.top
          && r.bottom < stage.bottom && hit && hit.closest('g.node') === g) {
        return {id: g.id, x, y};
      }
    }
    return null;
  }""", viewer.element_handle())
  assert node, 'no node in view'
  page.mouse.move(node['x'], node['y'])
  page.mouse.click(node['x'], node['y'])
  # The widget may hold the change until the kernel is idle: ask until it
  # has arrived (each answer idles the kernel), within a bound.
  deadline, seen = time.monotonic() + 60, None
  while time.monotonic() < deadline:
    seen = _kernel_print(page, 'print(explorer.diagram.clicked, explorer.diagram.click_count)')
    if seen.split() != ['0']:
      break
  assert seen.split() == [node['id'], '1'], (node, seen)

  # The same without a mouse: from the viewer's search box, Tab reaches the
  # first node that opens, named by its text, and Enter clicks it.
  viewer.locator('.remat-viewer-search').focus()
  page.keyboard.press('Tab')
  focused = page.evaluate("""() => { const e = document.activeElement;
    return {id: e.id, node: e.matches('g.node.opens'), role: e.getAttribute('role'),
            name: e.getAttribute('aria-label')}; }""")
  assert focused['node'] and focused['role'] == 'button', focused
  assert focused['name'].endswith('(open)') and len(focused['name']) > len(' (open)'), focused
  page.keyboard.press('Enter')
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    seen = _kernel_print(page, 'print(explorer.diagram.clicked, explorer.diagram.click_count)')
    if seen.split()[-1:] != ['1']:
      break
  assert seen.split() == [focused['id'], '2'], (focused, seen)

  # A policy written as an expression becomes the option shown, and "copy
  # as code" puts it on the clipboard as Python that needs only JAX.
  expression = "save_from_both_policies(dots_saveable, nothing_saveable)"
  field = explorer.locator('.remat-expression input')
  field.fill(expression)
  field.press('Enter')
  page.wait_for_function(
      "([e, text]) => e.querySelector('.remat-policy select').value === text",
      arg=[explorer.element_handle(), expression], timeout=30_000)
  assert _cut_selects(explorer) == []
  code = _kernel_print(page, 'print(explorer.controls.copy.code, end="")')  # once it is shown
  assert ('policy = jax.checkpoint_policies.save_from_both_policies('
          'jax.checkpoint_policies.dots_saveable, ') in code
  page.wait_for_function(  # the page has the code the kernel has
      "([e, code]) => e.querySelector('pre.remat-code').textContent === code",
      arg=[explorer.element_handle(), code], timeout=30_000)
  explorer.get_by_role('button', name='copy as code').click()
  explorer.locator('pre.remat-code').wait_for(timeout=10_000)
  assert page.evaluate('navigator.clipboard.readText()') == code
  assert explorer.locator('.remat-copy-said').inner_text() == 'copied'

  _check_stale_state_is_cleared(page, explorer)
  _check_the_budget_is_named_and_moves_by_keyboard(page, explorer)
  _check_nothing_cut_and_no_escapes(page, explorer)

  _check_compare_tab_is_readable(page, explorer)
  _check_the_snapshot_follows_unseen(page, explorer)
  # Its kernel restarted, the Explorer on screen is inert and says so.
  assert not explorer.locator('.remat-needs-kernel').is_visible()
  page.evaluate(f'({_KERNEL}).restart()')
  explorer.locator('.remat-needs-kernel').wait_for(state='visible', timeout=60_000)
  _check_says_it_needs_the_kernel(explorer)
  page.close()


def _check_the_snapshot_follows_unseen(page, explorer):
  """The snapshot a save keeps for front ends without widgets: hidden while
  the widget shows, and holding what it shows: the policy on screen with
  its compiled costs, and the last comparison."""
  mark = next(c for c in explorer.get_attribute('class').split()
              if c.startswith('remat-explorer-of-'))
  of = mark.replace('remat-explorer-of-', 'remat-snapshot-of-')
  snapshot = page.locator(f'{_panel(page)} .jp-OutputArea-child:has(.{of})')
  assert snapshot.count() == 1 and not snapshot.is_visible()
  shown = explorer.locator('.remat-policy select').evaluate(
      's => s.options[s.selectedIndex].text.replaceAll("\\u00a0", " ")')
  try:
    page.wait_for_function(
        """([s, policy]) => { const t = s.textContent.replaceAll('\\u00a0', ' ');
           return t.includes('showing under ' + policy) && t.includes('Compiled costs')
               && t.includes('The last comparison'); }""",
        arg=[snapshot.element_handle(), shown], timeout=60_000)
  except Exception as e:  # Playwright's TimeoutError: say what it shows
    if 'Timeout' not in type(e).__name__:
      raise
    pytest.fail(f'the snapshot does not show {shown!r} with its costs and the comparison: '
                f'{snapshot.text_content()[:2000]!r}')


def _check_stale_state_is_cleared(page, explorer):
  """An expression's error goes once another policy is chosen; a long
  policy label leaves the dropdown its width (the full label on hover),
  with the 'policy' and 'lowering' labels in view."""
  field = explorer.locator('.remat-expression input')
  field.fill('save_only_these_names(')
  field.press('Enter')
  error = explorer.locator('.remat-error')
  error.wait_for(timeout=30_000)
  explorer.locator('.remat-policy select').select_option('dots_saveable')
  error.wait_for(state='detached', timeout=30_000)
  names = ', '.join(repr(f'a_rather_long_checkpoint_name_{i}') for i in range(12))
  long_policy = f'save_only_these_names({names})'
  field.fill(long_policy)
  field.press('Enter')
  page.wait_for_function(
      "([e, text]) => e.querySelector('.remat-policy select').value.startsWith(text)",
      arg=[explorer.element_handle(), 'save_only_these_names('], timeout=30_000)
  box = explorer.bounding_box()
  select = explorer.locator('.remat-policy select').bounding_box()
  assert select['width'] <= 600, select
  for label in ('policy', 'lowering'):
    shown = explorer.locator('.widget-label', has_text=label).first.bounding_box()
    assert shown is not None and box['x'] <= shown['x'] <= box['x'] + box['width'], label
  # The whole label on hover (ipywidgets puts the tooltip on the widget or
  # on its label), once the kernel has sent it.
  page.wait_for_function(
      """([e, text]) => [e, ...e.querySelectorAll('[title]')].some(
          (t) => (t.getAttribute('title') || '').startsWith(text)
                 && t.getAttribute('title').length > 300)""",
      arg=[explorer.locator('.remat-policy').element_handle(), 'save_only_these_names('],
      timeout=30_000)


# The badge a view wears while it is recomputed (its ``::before``), as a
# box on the page, and the line boxes of the estimate's text it covers.
_BADGE_OVER_ESTIMATE = """(view) => {
  const badge = getComputedStyle(view, '::before');
  const px = (v) => parseFloat(v) || 0;
  const shown = view.getBoundingClientRect();
  const width = px(badge.width) + px(badge.paddingLeft) + px(badge.paddingRight)
      + px(badge.borderLeftWidth) + px(badge.borderRightWidth);
  const height = px(badge.height) + px(badge.paddingTop) + px(badge.paddingBottom)
      + px(badge.borderTopWidth) + px(badge.borderBottomWidth);
  const absolute = badge.position === 'absolute';
  const top = absolute ? shown.top + px(badge.top) : shown.top + px(badge.marginTop);
  const right = absolute ? shown.right - px(badge.right) : shown.right - px(badge.marginRight);
  const box = {left: right - width, right, top, bottom: top + height};
  const range = document.createRange();
  range.selectNodeContents(view.querySelector('.remat-estimate'));
  const lines = [...range.getClientRects()];
  const covered = lines.filter((l) => l.left < box.right && l.right > box.left
                                      && l.top < box.bottom && l.bottom > box.top);
  return {content: badge.content, box, lines: lines.length, covered: covered.length};
}"""


def _check_the_budget_is_named_and_moves_by_keyboard(page, explorer):
  """The budget slider has an accessible name, says its value in words,
  and an arrow key moves it: the kernel gets the new share."""
  before = float(_kernel_print(page, 'print(explorer.budget.value)'))
  slider = explorer.get_by_role('slider', name='budget')
  assert slider.count() == 1
  assert '%' in (slider.get_attribute('aria-valuetext') or ''), slider.get_attribute(
      'aria-valuetext')
  slider.focus()
  page.keyboard.press('ArrowRight')
  deadline, seen = time.monotonic() + 60, before
  while time.monotonic() < deadline and seen == before:
    seen = float(_kernel_print(page, 'print(explorer.budget.value)'))
  assert seen == pytest.approx(before + 0.05), (before, seen)


def _screenshot(page, explorer, shot: Path) -> None:
  """The Explorer's diagram tab, zoomed out two steps from how it opens
  (its drawing from the start, at readable size), its top at the window's
  top, the file browser closed: what a user sees in a 1440x900 window."""
  page.evaluate("window.jupyterapp.shell.collapseLeft()")
  explorer.get_by_role('tab', name='Split diagram').click()
  explorer.evaluate("(e) => e.scrollIntoView({block: 'start'})")
  viewer = explorer.locator('.remat-viewer').first
  for _ in range(2):  # zoomed out a little: the passes side by side
    viewer.get_by_role('button', name='−').click()
  # Dragged so that the drawing's top left corner is the stage's.
  stage, drawing = viewer.evaluate("""(v) => [v.querySelector('.remat-viewer-stage'),
      v.querySelector('svg g.graph')].map((e) => e.getBoundingClientRect().toJSON())""")
  x, y = stage['x'] + stage['width'] / 2, stage['y'] + stage['height'] / 2
  page.mouse.move(x, y)
  page.mouse.down()
  page.mouse.move(x + stage['x'] + 8 - drawing['x'], y + stage['y'] + 8 - drawing['y'],
                  steps=8)
  page.mouse.up()
  page.wait_for_function("document.fonts.status === 'loaded'")
  box = explorer.bounding_box()
  viewport = page.viewport_size
  page.screenshot(path=str(shot), clip=dict(
      x=box['x'], y=box['y'], width=min(box['width'], viewport['width'] - box['x']),
      height=min(box['height'], viewport['height'] - box['y'] - 30)))  # above the status bar
  assert shot.stat().st_size > 10_000
  if os.environ.get('REMAT_UPDATE_SCREENSHOT') == '1':
    shutil.copyfile(shot, DOCS_SCREENSHOT)
  page.evaluate("window.jupyterapp.shell.expandLeft()")


def _check_compare_tab_is_readable(page, explorer):
  """With the file browser open (a cell about 1000 px wide at a 1440-px
  window), the Compare tab's table fits the cell, no row more than six
  lines tall, and its charts show at their natural size."""
  from remat_explorer.viz.charts._figures import MIN_TEXT_PX
  page.evaluate('window.jupyterapp.shell.expandLeft()')
  explorer.get_by_role('tab', name='Compare').click()
  explorer.locator('.remat-comparison-table').wait_for(timeout=30_000)
  selector = f'{_panel(page)} .remat-explorer'
  cell = page.evaluate("(s) => document.querySelector(s).getBoundingClientRect().width",
                       selector)
  assert 800 < cell < 1200, cell  # the cell this check is about
  _check_fits(page, selector, 'the Compare tab in JupyterLab')
  images = _chart_scales(page, selector)['images']
  assert len(images) >= 2
  for alt, scale, natural in images:
    assert scale * MIN_TEXT_PX >= 11, (alt, scale, natural)


def test_explorer_in_the_classic_notebook(classic_notebook, browser):
  base, token, _ = classic_notebook
  page = browser.new_page(viewport={'width': 1440, 'height': 900})
  _run_all_cells(page, f'{base}/notebooks/01_remat_basics.ipynb?token={token}')
  _check_explorer(page)
  page.close()


_EXPLORED = ('import remat_explorer as rx\n'
             'from remat_explorer import examples, viz\n'
             'from remat_explorer.analysis import analyze\n'
             'loss_fn, (params, batch) = examples.mlp(num_layers=3, width=32, batch=8)\n'
             'explorer = rx.explore(loss_fn, params, batch)\n'
             'explorer')
_NOT_ANALYZABLE = ('import jax, jax.numpy as jnp\n'
                   'def training_step(w, x):  # differentiates itself: refused\n'
                   '    return jax.grad(lambda w: jnp.sum(jnp.sin(x @ w)))(w)\n'
                   'rx.explore(training_step, *jax.random.normal(jax.random.key(3), (2, 4, 4)))')


def _executed_notebook(path: Path, *cells: str) -> None:
  """Execute a small notebook (an Explorer, a diagram, and the given
  `cells`) and save it with its outputs as `make notebooks` saves the
  tutorials (``run_notebooks``): unsigned, the Explorers' work done."""
  import nbformat
  from tests.run_notebooks import execute
  notebook = nbformat.v4.new_notebook(cells=[
      nbformat.v4.new_code_cell(source) for source in
      (_EXPLORED, 'viz.split_graph(analyze(loss_fn, params, batch))', *cells)])
  notebook.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3',
                                     'language': 'python'}
  nbformat.write(notebook, path)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(ROOT), os.environ.get('PYTHONPATH', '')]))
  execute(path, write=True, timeout=120, env=env)


@pytest.fixture(scope='module')
def executed_notebook(tmp_path_factory) -> Path:
  """The small notebook, executed once for the tests that open it saved."""
  path = tmp_path_factory.mktemp('executed') / 'executed.ipynb'
  _executed_notebook(path, _NOT_ANALYZABLE)
  return path


def _saved_copy(executed: Path, path: Path, title: str) -> None:
  """`executed` at `path`, its metadata told apart by `title` (a notebook
  is trusted by a signature of its content: copies alike would share it)."""
  import nbformat
  notebook = nbformat.read(executed, as_version=4)
  notebook.metadata['title'] = title
  nbformat.write(notebook, path)


def _trusted_cells(page) -> list[bool]:
  """Whether JupyterLab trusts each cell of the notebook shown."""
  return page.evaluate("""() => {
    const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
    return Array.from({length: cells.length}, (_, i) => cells.get(i).trusted);
  }""")


def _trust(path: Path, notebooks: Path) -> None:
  """Trust the notebook at `path` as the served JupyterLab's user would."""
  subprocess.run([sys.executable, '-m', 'jupyter', 'trust', str(path)], check=True,
                 capture_output=True,
                 env=dict(os.environ, JUPYTER_DATA_DIR=str(notebooks.parent / 'data')))


def test_a_saved_notebook_opened_untrusted_shows_its_diagrams_as_images(
    lab, browser, executed_notebook):
  base, token, notebooks = lab
  _saved_copy(executed_notebook, notebooks / UNTRUSTED_NOTEBOOK, 'untrusted')
  page = browser.new_page(viewport={'width': 1440, 'height': 900})
  _open(page, f'{base}/lab/tree/{UNTRUSTED_NOTEBOOK}?token={token}')
  panel = _panel(page)
  outputs = page.locator(f'{panel} .jp-OutputArea-output')
  # The snapshot's images: the timeline, the diagram fitted and at full size.
  page.wait_for_function(
      "([panel]) => { const images = document.querySelectorAll("
      "  panel + ' .jp-OutputArea-output .remat-snapshot img');"
      "  return images.length >= 3 && Array.from(images)"
      "    .every(i => i.complete && i.naturalWidth > 0); }", arg=[panel], timeout=60_000)
  trusted = _trusted_cells(page)
  assert trusted == [False, False, False]
  # The split graph's own image: at natural size, in a box that scrolls.
  cells = page.locator(f'{panel} .jp-Cell')
  graph = cells.nth(1).locator('.jp-OutputArea-output img.diagram')
  graph.scroll_into_view_if_needed()  # cells out of view are not laid out
  page.wait_for_function('(i) => i.complete && i.naturalWidth > 0',
                         arg=graph.element_handle(), timeout=30_000)
  natural, shown = graph.evaluate('(i) => [i.naturalWidth, i.getBoundingClientRect().width]')
  assert natural > 300 and shown == pytest.approx(natural, abs=1)  # not shrunk
  text = outputs.all_inner_texts()
  assert not any('cluster_forward' in t or '->' in t for t in text), text
  _check_snapshot(page, cells.nth(0).locator('.jp-OutputArea-output:has(.remat-snapshot)'))
  # A program that cannot be analyzed: its snapshot says why.
  failed = cells.nth(2).locator('.jp-OutputArea-output:has(.remat-snapshot)')
  # (Its text, laid out or not: JupyterLab skips cells out of view.)
  assert SNAPSHOT_NOTE in failed.text_content()
  assert failed.locator('p.error').text_content().startswith('Could not analyze the program')
  page.close()


def test_a_saved_notebook_reopened_trusted_shows_its_explorer_from_the_saved_state(
    lab, browser, executed_notebook):
  """No kernel holds the widgets of a notebook saved by `make notebooks`:
  JupyterLab draws them from the state saved with it, compiled costs
  included, instead of "model not found"."""
  base, token, notebooks = lab
  path = notebooks / TRUSTED_NOTEBOOK
  _saved_copy(executed_notebook, path, 'trusted')
  _trust(path, notebooks)
  page = browser.new_page(viewport={'width': 1440, 'height': 900})
  _open(page, f'{base}/lab/tree/{TRUSTED_NOTEBOOK}?token={token}')
  panel = _panel(page)
  explorer = page.locator(f'{panel} .remat-explorer').first
  explorer.wait_for(timeout=60_000)
  trusted = _trusted_cells(page)
  assert trusted == [True, True, True]
  explorer.locator('.remat-viewer svg g.cluster').first.wait_for(timeout=30_000)
  # Saved once its work was done: no progress line, the compiled figures.
  assert explorer.locator('.remat-task').count() == 0
  explorer.get_by_role('tab', name='Costs').click()
  table = explorer.locator('.remat-costs-table')
  table.wait_for(timeout=30_000)
  cells = dict(table.locator('tr').evaluate_all(
      'rows => rows.map(r => Array.from(r.cells).map(c => c.innerText))'))
  assert cells['peak bytes'].startswith(f'{_mlp_costs().peak_bytes:,} ('), cells
  # No kernel holds it: it says so, and its controls are marked inert,
  # while its tabs and diagram still work.
  _check_says_it_needs_the_kernel(explorer)
  # The widgets drawn, their snapshots (the outputs after them) are not.
  snapshots = page.locator(f'{panel} .jp-OutputArea-child:has(.remat-snapshot)')
  assert snapshots.count() == 2  # two Explorers (the other output is a split graph)
  assert not any(s.is_visible() for s in snapshots.all())
  _assert_no_broken_widget(page)
  page.close()


def _check_says_it_needs_the_kernel(explorer) -> None:
  note = explorer.locator('.remat-needs-kernel')
  assert note.is_visible() and 'run its cell' in note.inner_text(), note.inner_text()
  # What asks the kernel is greyed and takes no clicks; what runs in the
  # page (the tabs, the diagram's buttons, "copy as code") still does.
  explorer.get_by_role('tab', name='Split diagram').click()
  events = explorer.evaluate('''(e) => {
    const events = (selector) => Array.from(e.querySelectorAll(selector))
        .filter(c => c.offsetParent !== null)
        .map(c => getComputedStyle(c).pointerEvents);
    return {policy: events('.remat-policy select'),
            expression: events('.remat-expression input'),
            viewer: events('.remat-viewer button'), copy: events('.remat-copy-code')};
  }''')
  assert events['policy'] == ['none'] and events['expression'] == ['none'], events
  assert events['viewer'] and 'none' not in events['viewer'] + events['copy'], events


def test_a_notebook_saved_without_widget_state_shows_its_snapshot_once_shared(
    lab, browser, executed_notebook):
  """A notebook saved by a JupyterLab that keeps no widget state (its
  default) holds widget views JupyterLab cannot draw: "model not found".
  `python -m remat_explorer share` drops them; reopened trusted, the
  notebook shows each Explorer's snapshot, compiled costs included."""
  import nbformat
  base, token, notebooks = lab
  path = notebooks / SHARED_NOTEBOOK
  notebook = nbformat.read(executed_notebook, as_version=4)
  notebook.metadata['title'] = 'shared'
  del notebook.metadata['widgets']  # what such a JupyterLab saves
  nbformat.write(notebook, path)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                     os.environ.get('PYTHONPATH', '')]))
  shared = subprocess.run([sys.executable, '-m', 'remat_explorer', 'share', str(path)],
                          check=True, capture_output=True, text=True, env=env)
  assert '2 widget view(s) without saved state dropped' in shared.stdout, shared.stdout
  _trust(path, notebooks)
  page = browser.new_page(viewport={'width': 1440, 'height': 900})
  _open(page, f'{base}/lab/tree/{SHARED_NOTEBOOK}?token={token}')
  panel = _panel(page)
  snapshot = page.locator(f'{panel} .jp-OutputArea-output:has(.remat-snapshot)').first
  snapshot.wait_for(timeout=60_000)
  trusted = _trusted_cells(page)
  assert trusted == [True, True, True]
  _check_snapshot(page, snapshot)
  _assert_no_broken_widget(page)
  page.close()


def _mlp_costs():
  """XLA's figures for the Explorer's program of `_EXPLORED`, here."""
  from remat_explorer import examples
  from remat_explorer.analysis import compile_costs
  loss_fn, args = examples.mlp(num_layers=3, width=32, batch=8)
  return compile_costs(loss_fn, *args)


def _check_snapshot(page, output):
  """The Explorer's static snapshot in `output`: it says what it is, shows
  XLA's figures (those `compile_costs` gives here), the memory timeline as
  an image, the diagram fitted to the output's width and, unfolded, at its
  natural size, and the residual table."""
  assert output.locator('.remat-snapshot-note').inner_text() == SNAPSHOT_NOTE
  cells = dict(output.locator('.remat-costs-table tr').evaluate_all(
      'rows => rows.map(r => Array.from(r.cells).map(c => c.innerText))'))
  costs = _mlp_costs()
  assert cells['peak bytes'].startswith(f'{costs.peak_bytes:,} ('), cells
  assert cells['temp bytes'].startswith(f'{costs.temp_bytes:,} ('), cells
  assert cells['FLOPs executed (loops counted)'].startswith(
      f'{int(costs.executed_flops):,} ('), cells
  for image in ('img.remat-timeline-img', 'img.remat-snapshot-diagram'):
    loaded = output.locator(image).evaluate('(i) => i.complete && i.naturalWidth > 0')
    assert loaded, image
  diagram = output.locator('img.remat-snapshot-diagram')
  natural, right, box = diagram.evaluate("""(i) => [i.naturalWidth,
      i.getBoundingClientRect().right, i.closest('.jp-OutputArea-output')
      .getBoundingClientRect().right]""")
  assert right <= box + 1 and natural > right - diagram.bounding_box()['x'], (natural, right, box)
  # Folded: the diagram at full size, readable, in a box that scrolls.
  output.locator('details.remat-full-size summary').click()
  full = output.locator('details.remat-full-size img.diagram')
  natural, shown = full.evaluate('(i) => [i.naturalWidth, i.getBoundingClientRect().width]')
  assert shown == pytest.approx(natural, abs=1)
  assert output.locator('.remat-residual-table').count() == 1


def _peak_notebook(path: Path) -> None:
  """A notebook that opens the Explorer on the NNX transformer, as its
  users write it (unexecuted: the browser runs it)."""
  import nbformat
  source = ('import remat_explorer as rx\n'
            'from tests.framework_models import nnx_transformer\n'
            'loss_fn, args = nnx_transformer()\n'
            'explorer = rx.explore(loss_fn, *args)\n'
            'explorer')
  notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
  notebook.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3',
                                     'language': 'python'}
  nbformat.write(notebook, path)


_LIVE_AT = ('from remat_explorer.analysis import analyze, compile_costs, live_at_peak\n'
            'live = live_at_peak(analyze(loss_fn, *args), compile_costs(loss_fn, *args), {step})\n')
_TOP_RESIDUAL = (_LIVE_AT.format(step=None)
                 + "top = next(r for r in live if r.kind == 'residual')\n"
                 + "print(top.buffer, top.source, sep='\\t')")


def _shown_panel(timeline):
  """The live-buffer table the timeline shows now."""
  return timeline.locator('.remat-at:not([hidden])')


def _check_timeline_hover(page, timeline, live_at):
  """Hovering over a band other than the peak's lists the buffers live at
  its step (`live_at(step)` names the largest); a click keeps them once
  the pointer has left the chart; a second click lets them go."""
  band = timeline.locator('.remat-band:not([data-at="peak"])').nth(3)
  band.hover()
  page.wait_for_function("(t) => t.dataset.showing !== 'peak'", arg=timeline.element_handle(),
                         timeout=10_000)
  head = timeline.locator('.remat-live-head').inner_text()
  step = int(re.match(r'Live at (?:steps \d+–\d+, highest )?step (\d+) of', head).group(1))
  rows = _shown_panel(timeline).locator('tbody tr')
  assert rows.count() >= 1
  assert live_at(step) in rows.first.inner_text(), (head, rows.first.inner_text())
  band.click()
  page.mouse.move(5, 5)  # off the chart: the kept band stays
  assert timeline.evaluate('(t) => t.dataset.showing') == band.get_attribute('data-band')
  band.hover()
  band.click()  # let go: leaving the chart shows the peak again
  page.mouse.move(5, 5)
  page.wait_for_function("(t) => t.dataset.showing === 'peak'", arg=timeline.element_handle(),
                         timeout=10_000)


def _check_source_lines_have_their_whole_path(page, timeline):
  """A source line shown relative to the user's project has its file's
  whole path as its tooltip: in the peak's table (drawn in Python) and in
  a band's (drawn by the page's script)."""
  def source_cells(panel):
    return panel.locator('td').evaluate_all(
        "(cells) => cells.filter(c => /\\.py:\\d+/.test(c.textContent))"
        "  .map(c => [c.title, c.textContent])")

  def whole(cells):
    return cells and all(title.startswith(os.sep) and title.endswith(os.sep + text)
                         for title, text in cells)
  peak = source_cells(timeline.locator('.remat-at[data-at="peak"]'))
  assert whole(peak), peak
  bands = timeline.locator('.remat-band:not([data-at="peak"])')
  for i in range(min(bands.count(), 24)):
    band = bands.nth(i)
    band.hover()
    page.wait_for_function('([t, b]) => t.dataset.showing === b',
                           arg=[timeline.element_handle(), band.get_attribute('data-band')],
                           timeout=10_000)
    cells = source_cells(_shown_panel(timeline))
    if cells:
      assert whole(cells), cells
      break
  else:
    pytest.fail('no band of the first 24 lists a source line')
  page.mouse.move(5, 5)


def _check_modules_open_on_click(page, explorer):
  """The diagram of the NNX model draws its modules as named boxes, readable
  at the size shown; a click on one opens it, one level down."""
  viewer = explorer.locator('.remat-viewer').first
  _check_viewer(page, viewer)
  group = viewer.locator('g.node[id$="/attention"]').first
  assert group.count() == 1 and 'attention' in group.text_content()
  assert viewer.locator('g.node[id$="/mlp_in"]').count() >= 1
  nodes = viewer.locator('g.node').count()
  viewer.get_by_role('button', name='fit').click()
  spot = page.evaluate("""(g) => {
    const r = g.getBoundingClientRect();
    const x = (r.left + r.right) / 2, y = (r.top + r.bottom) / 2;
    const hit = document.elementFromPoint(x, y);
    return hit && hit.closest('g.node') === g ? {x, y} : null;
  }""", group.element_handle())
  assert spot, 'the attention box is covered'
  page.mouse.click(spot['x'], spot['y'])
  # Redrawn by the kernel with the group opened. The widget may hold the
  # click until the kernel is idle: ask the kernel until it has arrived.
  clicked = group.get_attribute('id')
  opened = """([v, n, id]) => v.querySelectorAll('g.node').length > n
                              && !v.querySelector('g.node[id="' + CSS.escape(id) + '"]')"""
  deadline, clicks = time.monotonic() + 120, None
  while time.monotonic() < deadline:
    if page.evaluate(opened, [viewer.element_handle(), nodes, clicked]):
      return
    clicks = _kernel_print(page, 'print(explorer.diagram.clicked, explorer.diagram.click_count)')
    time.sleep(0.5)
  shown = page.evaluate('(v) => v.querySelectorAll("g.node").length', viewer.element_handle())
  pytest.fail(f'{clicked} did not open; the kernel saw the click as {clicks!r}; '
              f'nodes before {nodes}, shown {shown}')


def test_explorer_costs_list_what_is_live_at_the_peak(lab, browser):
  base, token, notebooks = lab
  _peak_notebook(notebooks / PEAK_NOTEBOOK)
  page = browser.new_page(viewport={'width': 1440, 'height': 900})
  _run_all_cells(page, f'{base}/lab/tree/{PEAK_NOTEBOOK}?token={token}')
  # This notebook's Explorer: the server may have reopened others, hidden.
  explorer = page.locator(f'{_panel(page)} .remat-explorer').first
  explorer.wait_for(timeout=240_000)
  _check_modules_open_on_click(page, explorer)
  explorer.get_by_role('tab', name='Costs').click()
  timeline = explorer.locator('.remat-timeline').first
  timeline.wait_for(timeout=240_000)
  page.wait_for_function(  # compiled, and the script has mounted it
      "(e) => { const t = e.querySelector('.remat-timeline');"
      " return t && t.dataset.mounted && !t.closest('.remat-stale'); }",
      arg=explorer.element_handle(), timeout=240_000)

  # The peak's table lists the largest residual with the model's own line.
  buffer, source = _kernel_print(page, _TOP_RESIDUAL).strip().split('\t')
  # (The kernel runs in the notebooks' folder: the path is absolute there.)
  assert re.search(r'(^|/)tests/framework_models\.py:\d+ ', source), source
  # The pointer rests where the module was clicked, which the Costs tab may
  # now lay its chart under: a hover there would show a band's buffers.
  page.mouse.move(0, 0)
  peak = _shown_panel(timeline)
  assert peak.get_attribute('data-at') == 'peak'
  row = timeline.locator('.remat-at[data-at="peak"]').locator('tr', has_text=buffer).first
  row.wait_for(timeout=120_000)  # a loaded machine redraws the table late
  row.scroll_into_view_if_needed()
  assert row.is_visible() and source in row.inner_text()

  def live_at(step):
    return _kernel_print(page, _LIVE_AT.format(step=step) + 'print(live[0].buffer)').strip()
  _check_timeline_hover(page, timeline, live_at)
  _check_source_lines_have_their_whole_path(page, timeline)

  # Nothing cut: the tables fit their box, no button is clipped, no escapes.
  # Measured once the page's fonts are in: while one loads, a label may be
  # laid out in a fallback font. A failure says which element and by how much.
  page.evaluate('document.fonts.ready.then(() => true)')
  overflow = explorer.evaluate("""(e) => Array.from(
      e.querySelectorAll('.remat-live, button'))
      .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
      .map(e => `${e.className}: ${e.innerText} (${e.scrollWidth} > ${e.clientWidth})`)""")
  assert overflow == [], overflow
  text = explorer.evaluate('(e) => e.textContent')
  assert '\x1b[' not in text and '[35m' not in text
  page.close()


def test_static_report_pans_and_zooms_its_diagram(browser, tmp_path, long_label_comparison):
  from remat_explorer.viz.html.html_report import report_html
  comparison = long_label_comparison
  path = tmp_path / 'report.html'
  path.write_text(report_html(comparison, comparison.row('dots_saveable').report))
  page = browser.new_page(viewport={'width': 1440, 'height': 900})
  errors = []
  page.on('pageerror', lambda e: errors.append(str(e)))
  page.goto(path.as_uri())
  assert page.locator('svg g.cluster').count() >= 2
  # The diagram of the policy shown in detail is open.
  _check_viewer(page, page.locator('details[open] .remat-viewer').first)
  charts = page.locator('img.chart')
  assert charts.count() >= 3
  widths = page.evaluate(
      "Array.from(document.querySelectorAll('img.chart')).map(i => i.naturalWidth)")
  assert all(w > 100 for w in widths), widths
  assert re.search(r'Policies compared', page.inner_text('body'))
  assert '\x1b[' not in page.evaluate('document.body.textContent')
  # The program listings are as readable as the charts' text.
  listings = page.evaluate("Array.from(document.querySelectorAll('pre'))"
                           ".map(p => parseFloat(getComputedStyle(p).fontSize))")
  assert listings and min(listings) >= MIN_TEXT_PX, listings

  # The timeline lists what is live where the pointer is, from the page.
  from remat_explorer.analysis import live_at_peak
  row = comparison.row('dots_saveable')
  timeline = page.locator('.remat-timeline').first
  timeline.scroll_into_view_if_needed()
  _check_timeline_hover(page, timeline,
                        lambda step: live_at_peak(row.report, row.costs, step)[0].buffer)
  assert errors == []
  page.close()


# -- static pages at a 1440-px window: tables, charts, the report's diagrams ------------
# Plain pages (the widget's HTML with its style, the report's file), no
# JupyterLab: each check takes seconds.

# A label of 150 characters, as a searched policy's can be, of names the
# example MLP has (a name it lacks would add its own warning to the row).
LONG_LABEL = ("save_from_both_policies(save_only_these_names('layer_output', "
              "'pre_activation'), save_from_both_policies(dots_with_no_batch_dims_saveable, "
              "nothing_saveable))")
_WINDOW = {'width': 1440, 'height': 900}
MAX_ROW_LINES = 6


def _raising_policy(prim, *_, **params):
  raise KeyError(f'no rule for {prim}')


@pytest.fixture(scope='module')
def long_label_comparison():
  """A small MLP under two built-in policies, one with a long label (what a
  searched policy's label looks like) and one that fails; the long one's
  row carries a long note whose module path has no space, as XLA's
  "largest residuals" lines do."""
  import dataclasses
  from remat_explorer import examples
  from remat_explorer.analysis import compare
  loss_fn, args = examples.mlp(num_layers=3, width=32, batch=8)
  comparison = compare(loss_fn, *args, policies={
      'dots_saveable': 'dots_saveable', 'nothing_saveable': 'nothing_saveable',
      LONG_LABEL: LONG_LABEL,
      'raises': _raising_policy})
  path = '/'.join(['a_rather_deeply_nested_package'] * 3) + '/model.py:123:4'
  note = ("compiled peak 56,165,404 bytes is not below no remat's 56,165,404 bytes. "
          f'Largest residuals besides arguments: float32[4,8,64,512] output of scan from '
          f'{path} (loss_fn) (×6); float32[4,8,4,64,64] output of scan from {path} (×2)')
  rows = tuple(dataclasses.replace(r, warnings=r.warnings + (note,))
               if r.label == LONG_LABEL else r for r in comparison.rows)
  assert any(r.failed for r in rows)
  return dataclasses.replace(comparison, rows=rows)


def _widget_page(page, html: str, width: int) -> str:
  """`html` as the Explorer shows it: with its style (and the timeline's,
  which its Costs view carries), in a box `width` px wide (a notebook
  cell's output) at JupyterLab's font size. Returns the box's selector."""
  from remat_explorer.viz.html.timeline_html import timeline_css
  from remat_explorer.viz.widget import _panels
  page.set_content('<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
                   '<body style="margin:8px;font-family:system-ui,sans-serif;font-size:14px">'
                   f'{_panels.CSS}<style>{timeline_css()}</style>'
                   f'<div class="remat-explorer" style="width:{width}px">'
                   f'{html}</div></body></html>')
  return '.remat-explorer'


_LAYOUT = """(selector) => {
  // What sticks out of the box (elements clipped by a scroller inside it,
  // or not shown, aside), and each table row's height in lines of its text.
  const box = document.querySelector(selector);
  const right = box.getBoundingClientRect().right;
  const clipped = (e) => {
    for (let a = e.parentElement; a && a !== box; a = a.parentElement)
      if (getComputedStyle(a).overflowX !== 'visible') return true;
    return false;
  };
  const beyond = Array.from(box.querySelectorAll('*')).filter((e) => {
    const r = e.getBoundingClientRect();
    return r.width > 0 && r.right > right + 1 && !clipped(e);
  }).map((e) => `${e.tagName}.${e.className}: ${e.textContent.slice(0, 60)}`);
  const rows = [];
  for (const tr of box.querySelectorAll('table.remat-table tbody tr')) {
    let lines = 0;
    for (const td of tr.cells) {
      const style = getComputedStyle(td);
      const inner = td.clientHeight - parseFloat(style.paddingTop)
          - parseFloat(style.paddingBottom);
      const probe = document.createElement('div');  // one line box of the cell's text
      probe.textContent = 'x';
      td.appendChild(probe);
      const line = probe.getBoundingClientRect().height;
      probe.remove();
      lines = Math.max(lines, line ? inner / line : 0);
    }
    rows.push([tr.cells[0].textContent.slice(0, 40), Math.round(lines * 10) / 10]);
  }
  return {scroll: [box.scrollWidth, box.clientWidth],
          page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
          beyond, rows};
}"""


# Where the text of a table's wrapping cells (names, paths, labels) breaks
# between two letters or digits: a word cut in two (``_transformer_bloc|k``)
# rather than broken after its '_', '/', '.' or a space.
_MID_WORD_BREAKS = """(selector) => {
  const cut = [];
  for (const td of document.querySelectorAll(
      `${selector} td.remat-wrap, ${selector} td.remat-label`)) {
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    const chars = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.data.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const r = range.getClientRects()[0];
        if (r) chars.push([node.data[i], r.top]);
      }
    }
    for (let i = 1; i < chars.length; i++) {
      const [before, after] = [chars[i - 1], chars[i]];
      if (after[1] > before[1] + 1 && /[A-Za-z0-9]/.test(before[0])
          && /[A-Za-z0-9]/.test(after[0])) {
        const text = chars.map((c) => c[0]).join('');
        cut.push(`${text.slice(Math.max(0, i - 20), i)}|${text.slice(i, i + 10)}`);
      }
    }
  }
  return cut;
}"""


def _check_fits(page, selector: str, what: str) -> dict:
  layout = page.evaluate(_LAYOUT, selector)
  assert layout['scroll'][0] <= layout['scroll'][1], (what, layout['scroll'])
  assert layout['page'][0] <= layout['page'][1], (what, layout['page'])
  assert layout['beyond'] == [], (what, layout['beyond'][:5])
  tall = [row for row in layout['rows'] if row[1] > MAX_ROW_LINES]
  assert layout['rows'] and tall == [], (what, tall)
  cut = page.evaluate(_MID_WORD_BREAKS, selector)
  assert cut == [], (what, cut[:5])
  return layout


def test_tables_fit_their_container_with_a_long_label_and_note(browser, tmp_path,
                                                                long_label_comparison):
  """The comparison, residual and live-buffer tables, with a policy label
  of 150 characters and a note of 450 (as long as XLA's) whose path has no
  space, stay inside a 1000-px cell and a 900-px one at a 1440-px window,
  in the Explorer's style, and inside the report's page at 1440 and 1000
  px; no row of a comparison or residual table is more than six lines
  tall."""
  from remat_explorer.viz.html.html_report import report_html
  from remat_explorer.viz.html.tables import comparison_table_html, residual_table_html
  from remat_explorer.viz.widget._panels import costs_html
  comparison = long_label_comparison
  long_row = comparison.row(LONG_LABEL)
  # The Compare, Residuals and Costs tabs' tables (the last with what is
  # live at the peak: module paths, source lines).
  tables_html = (comparison_table_html(comparison) + residual_table_html(long_row.report)
                 + costs_html(LONG_LABEL, 'barrier', long_row.costs, comparison.baseline.costs,
                              long_row.report))
  page = browser.new_page(viewport=_WINDOW)
  for width in (1000, 900):
    _check_fits(page, _widget_page(page, tables_html, width), f'widget {width} px')
    text = page.inner_text('.remat-comparison-table')
    assert LONG_LABEL in text.replace('\n', ' ')  # whole, in its notes row
    assert 'a_rather_deeply_nested_package/' in text
  path = tmp_path / 'report.html'
  path.write_text(report_html(comparison, long_row.report))
  for width in (1440, 1000):
    page.set_viewport_size({'width': width, 'height': 900})
    page.goto(path.as_uri())
    layout = _check_fits(page, 'body', f'report at {width} px')
    assert len(layout['rows']) >= len(comparison.rows)
  page.close()


def test_the_updating_badge_leaves_the_estimate_in_view(browser):  # noqa: F811
  """While a compile runs, the Costs view is greyed and badged 'updating…',
  and the estimate shown in it stays readable: the badge covers none of
  its lines. The view as the Explorer builds it (a VBox, a flex column, of
  the estimate and the costs), in its style, in a 900-px cell."""
  from types import SimpleNamespace
  from remat_explorer.viz.widget import _panels
  estimate = _panels.estimate_html('dots_saveable',
                                   SimpleNamespace(peak_bytes=123_456_789, flops=4.5e12,
                                                   platform='gpu', notes=()))
  view = (f'<div class="widget-box widget-vbox {_panels.STALE}" '
          'style="display: flex; flex-direction: column">'
          f'<div class="widget-html {_panels.ESTIMATE}">{estimate}</div>'
          '<div class="widget-html"><p>the costs compiled under the last policy</p></div></div>')
  page = browser.new_page(viewport=_WINDOW)
  box = _widget_page(page, view, width=900)
  seen = page.evaluate(_BADGE_OVER_ESTIMATE,
                       page.locator(f'{box} .{_panels.STALE}').element_handle())
  assert seen['content'] == '"updating…"' and seen['lines'] >= 1, seen
  assert seen['covered'] == 0, seen
  page.close()


def _chart_scales(page, selector: str) -> list:
  """Each chart image's displayed width over its natural width, and each
  timeline text's size on screen (px)."""
  return page.evaluate("""(selector) => {
    const box = document.querySelector(selector);
    const images = Array.from(box.querySelectorAll('img.chart')).map(
        (i) => [i.alt, i.width / i.naturalWidth, i.naturalWidth]);
    const texts = Array.from(box.querySelectorAll('svg.remat-timeline-chart text'))
        .filter((t) => t.getBoundingClientRect().width > 0 && t.textContent.trim())
        .map((t) => {  // (a rotated label's scale is the length of its x axis)
          const m = t.getScreenCTM();
          return [t.textContent.slice(0, 30),
                  parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b)];
        });
    return {images, texts};
  }""", selector)


def test_chart_text_is_at_least_11_px_as_displayed(browser, tmp_path, long_label_comparison):
  """Every chart of the report at a 1440-px window and at 900 px, and of
  the Explorer's Compare and Residuals tabs in a 900-px cell, is shown at
  its natural size or near it: its scale times the smallest text it was
  drawn with (``_figures.MIN_TEXT_PX``, which test_viz checks against every
  text of every chart) is at least 11 px; so is every text of the memory
  timeline (the Costs tab's and the report's) on screen."""
  from remat_explorer.viz.charts._figures import MIN_TEXT_PX, chart_img
  from remat_explorer.viz.charts.costs import plot_residuals_by_origin
  from remat_explorer.viz.html.html_report import report_html
  from remat_explorer.viz.widget._panels import comparison_html, costs_html
  comparison = long_label_comparison
  row = comparison.row('dots_saveable')
  path = tmp_path / 'report.html'
  path.write_text(report_html(comparison, row.report))
  page = browser.new_page(viewport=_WINDOW)
  shown = {}
  for width in (1440, 900):
    page.set_viewport_size({'width': width, 'height': 900})
    page.goto(path.as_uri())
    shown[f'report at {width} px'] = _chart_scales(page, 'body')
  tabs = (comparison_html(comparison, row.label, None)
          + chart_img(plot_residuals_by_origin(row.report), 'residual bytes by origin')
          + costs_html(row.label, 'barrier', row.costs, comparison.baseline.costs, row.report))
  page.set_viewport_size(_WINDOW)
  shown['widget in 900 px'] = _chart_scales(page, _widget_page(page, tabs, 900))
  for where, found in shown.items():
    assert len(found['images']) >= 3 and found['texts'], where
    for alt, scale, natural in found['images']:
      assert scale * MIN_TEXT_PX >= 11, (where, alt, scale, natural)
    smallest = min(found['texts'], key=lambda t: t[1])
    assert smallest[1] >= 11, (where, smallest)
  page.close()


def test_report_opens_each_policys_diagram_on_click(browser, tmp_path, long_label_comparison):
  """Every policy that compiled has its diagram in the report: a click on
  its name opens it (the SVG shows in the viewer), another closes it. The
  failed policy says why it has none."""
  from remat_explorer.viz.html.html_report import report_html
  comparison = long_label_comparison
  path = tmp_path / 'report.html'
  path.write_text(report_html(comparison, comparison.row('dots_saveable').report))
  page = browser.new_page(viewport=_WINDOW)
  errors = []
  page.on('pageerror', lambda e: errors.append(str(e)))
  page.goto(path.as_uri())
  entries = page.locator('details.remat-diagram')
  named = []
  for i in range(entries.count()):
    entry = entries.nth(i)
    summary = entry.locator('summary')
    labels = entry.locator('summary .remat-policy').all_inner_texts()
    named += labels
    layer = entry.locator('.remat-zoom-layer')
    if entry.evaluate('(e) => e.open'):
      assert 'dots_saveable' in labels  # the policy shown in detail starts open
      summary.click()
      assert not entry.evaluate('(e) => e.open') and not layer.is_visible()
    summary.click()
    layer.wait_for(state='visible', timeout=10_000)
    box = entry.locator('.remat-viewer-stage svg').bounding_box()
    assert box['width'] > 300 and box['height'] > 100, (labels, box)
    # Placed once it had a size: at the natural scale, with node labels in view.
    page.wait_for_function('(e) => /scale/.test(e.getAttribute("transform") || "")',
                           arg=layer.element_handle(), timeout=10_000)
    assert entry.locator('g.node text').first.is_visible(), labels
  compiled = [r.label for r in comparison.rows if not r.failed]
  assert sorted(named) == sorted(compiled)
  failed = [r for r in comparison.rows if r.failed]
  assert failed and all(f'No diagram for {r.label}' in page.inner_text('body') for r in failed)
  assert errors == []
  page.close()
