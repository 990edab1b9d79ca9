"""The split-diagram viewer on a plain page, in a real browser (Debian's
Chromium, through Playwright; no Jupyter): how it opens, how it keeps the
user's view across redraws, its minimap and its search.

Each page holds one diagram as the static report does
(``static_viewer_html(svg) + viewer_assets_html()``); the viewer is kept on
its element (``rematViewer``), whose ``show`` stands for the Explorer
setting ``svg`` again. Everything is measured on the page: text sizes from
the screen transform of each ``<text>``, positions from bounding rects.
"""

from __future__ import annotations

import inspect
import re

import jax
import pytest

from tests.test_browser import MIN_TEXT_PX, browser  # noqa: F401 (a fixture)

pytestmark = pytest.mark.xdist_group('browser')

VIEWER = '.remat-viewer'
SMALL_VIEWPORT = {'width': 1440, 'height': 900}
LARGE_VIEWPORT = {'width': 3200, 'height': 1800}
MARGIN_PX = 8  # viewer.js keeps this much around a drawing

# The smallest text on screen (px) among the <text>s that show in the stage
# (all of them with `everywhere`), and where the stage and drawing are.
_MEASURE = """([viewer, everywhere]) => {
  const stage = viewer.querySelector('.remat-viewer-stage').getBoundingClientRect();
  const drawn = viewer.querySelector('.remat-zoom-layer').getBoundingClientRect();
  const sizes = [];
  for (const t of viewer.querySelectorAll('.remat-zoom-layer text')) {
    const r = t.getBoundingClientRect();
    if (!t.textContent.trim() || (!everywhere && (r.right < stage.left || r.left > stage.right
        || r.bottom < stage.top || r.top > stage.bottom))) continue;
    sizes.push(parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
  }
  const box = (r) => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom,
                       width: r.width, height: r.height});
  return {smallest: Math.min(...sizes), stage: box(stage), drawn: box(drawn)};
}"""


@pytest.fixture(scope='module')
def diagrams():
  """SVGs of real splits: the small MLP under two policies, and a
  transformer with every group open (too big to read whole)."""
  from remat_explorer import examples
  from remat_explorer.analysis import analyze
  from remat_explorer.viz.diagram.render import render_diagram
  from remat_explorer.viz.diagram.split_graph import split_graph
  loss_fn, args = examples.mlp(num_layers=3, width=32, batch=8)
  big_fn, big_args = examples.transformer(num_layers=2, d_model=16, num_heads=2, seq_len=8,
                                          batch=2)
  return {
      'mlp': render_diagram(split_graph(analyze(loss_fn, *args))).svg,
      'mlp_dots': render_diagram(split_graph(analyze(
          loss_fn, *args, policy=jax.checkpoint_policies.dots_saveable))).svg,
      'large': render_diagram(split_graph(analyze(big_fn, *big_args), expand='all')).svg,
  }


def _open(browser, tmp_path, svg, viewport=SMALL_VIEWPORT):  # noqa: F811
  from remat_explorer.viz.diagram.viewer import static_viewer_html, viewer_assets_html
  path = tmp_path / f'viewer_{len(list(tmp_path.iterdir()))}.html'
  path.write_text('<!doctype html><meta charset="utf-8"><body>'
                  + static_viewer_html(svg) + viewer_assets_html(), encoding='utf-8')
  page = browser.new_page(viewport=viewport)
  errors = []
  page.on('pageerror', lambda e: errors.append(str(e)))
  page.goto(path.as_uri())
  page.locator(f'{VIEWER} .remat-zoom-layer[transform]').wait_for(timeout=10_000)
  return page, page.locator(VIEWER).first, errors


def _measure(page, viewer, everywhere=False) -> dict:
  return page.evaluate(_MEASURE, [viewer.element_handle(), everywhere])


def _transform(viewer) -> tuple[float, float, float]:
  text = viewer.locator('.remat-zoom-layer').get_attribute('transform')
  x, y, k = re.fullmatch(r'translate\(([-\d.e]+),([-\d.e]+)\) scale\(([-\d.e]+)\)', text).groups()
  return float(x), float(y), float(k)


def _drag(page, viewer, dx, dy):
  """Drag the drawing by (dx, dy) px, the stage's centre halfway."""
  box = viewer.locator('.remat-viewer-stage').bounding_box()
  x, y = box['x'] + box['width'] / 2 - dx / 2, box['y'] + box['height'] / 2 - dy / 2
  page.mouse.move(x, y)
  page.mouse.down()
  page.mouse.move(x + dx, y + dy, steps=5)
  page.mouse.up()


def _inside(inner, outer, slack=1.0) -> bool:
  return (inner['left'] >= outer['left'] - slack and inner['right'] <= outer['right'] + slack
          and inner['top'] >= outer['top'] - slack and inner['bottom'] <= outer['bottom'] + slack)


def test_static_viewer_opens_a_diagram_that_fits_whole_with_readable_text(
    browser, tmp_path, diagrams):  # noqa: F811
  page, viewer, errors = _open(browser, tmp_path, diagrams['mlp'], LARGE_VIEWPORT)
  seen = _measure(page, viewer, everywhere=True)
  assert _inside(seen['drawn'], seen['stage']), seen
  assert seen['smallest'] >= MIN_TEXT_PX, seen
  # The largest such zoom: the drawing spans the stage (within its
  # margins) across or down, or shows at its natural size (100%).
  x, y, k = _transform(viewer)
  spans = (seen['drawn']['width'] >= seen['stage']['width'] - 2 * MARGIN_PX - 2
           or seen['drawn']['height'] >= seen['stage']['height'] - 2 * MARGIN_PX - 2)
  assert spans or k == pytest.approx(4 / 3), (seen, k)
  assert viewer.locator('.remat-viewer-zoom').inner_text() == f'{round(100 * k / (4 / 3))}%'
  assert viewer.locator('.remat-viewer-minimap').is_hidden()  # all of it is in view
  assert errors == []
  page.close()


# For each pair of lines in one node's label, the room between the ink of
# the first (its underscores hang below the baseline) and the ink of the
# next (digits and brackets reach up), in the drawing's own units, as
# Chromium draws them in the font the page gives each line.
_LINE_GAPS = """(viewer) => {
  const context = document.createElement('canvas').getContext('2d');
  const ink = (t) => {
    const style = getComputedStyle(t);
    context.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    return context.measureText(t.textContent);
  };
  const gaps = [];
  for (const node of viewer.querySelectorAll('g.node')) {
    const lines = [...node.querySelectorAll('text')];
    for (let i = 0; i + 1 < lines.length; i++) {
      const [above, below] = [lines[i], lines[i + 1]];
      gaps.push([(parseFloat(below.getAttribute('y')) - ink(below).actualBoundingBoxAscent)
                 - (parseFloat(above.getAttribute('y')) + ink(above).actualBoundingBoxDescent),
                 above.textContent, below.textContent]);
    }
  }
  return gaps.sort((a, b) => a[0] - b[0]);
}"""


def test_the_lines_of_a_node_keep_clear_of_each_other(browser, tmp_path, diagrams):  # noqa: F811
  """An underscore (``dot_general``, ``“pre_activation”``) hangs below its
  line, and the shapes on the line under it (``f32[8,32]``) reach up: a
  pixel at least between them, or the underscore strikes through them."""
  page, viewer, errors = _open(browser, tmp_path, diagrams['mlp'])
  gaps = page.evaluate(_LINE_GAPS, viewer.element_handle())
  assert any('_' in above for _, above, _ in gaps)
  assert gaps[0][0] >= 1, gaps[:4]
  assert errors == []
  page.close()


# Where a diagram shown as an image (a notebook's static output) puts its
# title: the SVG in the image, laid out at the image's size, its first
# label line measured against the part of the image its box shows first.
_TITLE_IN_VIEW = """async (box) => {
  const img = box.querySelector('img');
  await img.decode();
  const bytes = Uint8Array.from(atob(img.src.split(',')[1]), (c) => c.charCodeAt(0));
  const holder = document.createElement('div');
  holder.style.cssText = 'position: absolute; left: 0; top: 0; visibility: hidden';
  holder.innerHTML = new TextDecoder().decode(bytes);
  document.body.appendChild(holder);
  const svg = holder.querySelector('svg');
  svg.setAttribute('width', img.getBoundingClientRect().width);
  svg.setAttribute('height', img.getBoundingClientRect().height);
  const origin = svg.getBoundingClientRect();
  const title = svg.querySelector('g.graph > text').getBoundingClientRect();
  let scroller = img.parentElement;
  while (scroller !== box && getComputedStyle(scroller).overflowX === 'visible')
    scroller = scroller.parentElement;
  return {image: origin.width, shown: scroller.clientWidth,
          left: title.left - origin.left, right: title.right - origin.left};
}"""


def test_a_wide_diagram_shown_as_an_image_has_its_title_in_view(
    browser, tmp_path, diagrams):  # noqa: F811
  """A notebook shows a diagram as an image at its natural size, in a box
  that scrolls: a drawing wider than the cell keeps its title in the part
  the cell shows, not centred over a width no one sees at once."""
  from tests.test_browser import _widget_page
  from remat_explorer.viz.diagram.viewer import svg_img_html
  page = browser.new_page(viewport=SMALL_VIEWPORT)
  box = _widget_page(page, svg_img_html(diagrams['large']), width=900)
  seen = page.evaluate(_TITLE_IN_VIEW, page.locator(box).element_handle())
  assert seen['image'] > 2 * seen['shown'], seen  # wide: the case in question
  assert 0 <= seen['left'] and seen['right'] <= seen['shown'], seen
  page.close()


def test_static_viewer_opens_a_large_diagram_readable_at_its_start(
    browser, tmp_path, diagrams):  # noqa: F811
  page, viewer, errors = _open(browser, tmp_path, diagrams['large'])
  seen = _measure(page, viewer)
  assert seen['smallest'] >= MIN_TEXT_PX, seen
  assert seen['drawn']['width'] > seen['stage']['width']  # not all in view
  # The top left of the forward pass (the program's start) is in view.
  forward = page.evaluate("""(v) => {
    const title = Array.from(v.querySelectorAll('g.cluster > title'))
        .find((t) => t.textContent === 'cluster_forward');
    const r = title.parentNode.querySelector('polygon').getBoundingClientRect();
    return {left: r.left, top: r.top};
  }""", viewer.element_handle())
  stage = seen['stage']
  assert stage['left'] <= forward['left'] < stage['left'] + stage['width'] / 2, (forward, stage)
  assert stage['top'] <= forward['top'] < stage['top'] + stage['height'] / 2, (forward, stage)

  # The rest is reached by dragging, at the same zoom: the bottom right
  # corner, then the top left one.
  k = _transform(viewer)[2]
  for corner, (dx, dy) in (('bottom right', (-1, -1)), ('top left', (1, 1))):
    for _ in range(30):
      seen = _measure(page, viewer)
      drawn, stage = seen['drawn'], seen['stage']
      if corner == 'bottom right' and (drawn['right'] <= stage['right']
                                       and drawn['bottom'] <= stage['bottom']):
        break
      if corner == 'top left' and drawn['left'] >= stage['left'] and drawn['top'] >= stage['top']:
        break
      # (From nowhere near the minimap, in the bottom right corner.)
      _drag(page, viewer, dx * 0.7 * stage['width'], dy * 0.7 * stage['height'])
    else:
      pytest.fail(f'the {corner} corner is not reached by dragging: {seen}')
  assert _transform(viewer)[2] == k

  # Whole, the same drawing's text would be too small to read.
  viewer.get_by_role('button', name='fit').click()
  seen = _measure(page, viewer, everywhere=True)
  assert _inside(seen['drawn'], seen['stage']) and seen['smallest'] < MIN_TEXT_PX, seen
  assert errors == []
  page.close()


def test_static_viewer_keeps_the_users_view_when_it_shows_another_drawing(
    browser, tmp_path, diagrams):  # noqa: F811
  page, viewer, errors = _open(browser, tmp_path, diagrams['mlp'])
  show = '([v, svg]) => v.rematViewer.show(svg)'
  # Untouched, a new drawing opens as it would on its own page.
  fresh, fresh_viewer, _ = _open(browser, tmp_path, diagrams['mlp_dots'])
  opened = _transform(fresh_viewer)
  fresh.close()
  page.evaluate(show, [viewer.element_handle(), diagrams['mlp_dots']])
  assert _transform(viewer) == pytest.approx(opened)
  assert 'dots_saveable' in viewer.locator('svg').text_content()

  # Zoomed in and panned, the view stays where the user left it.
  box = viewer.locator('.remat-viewer-stage').bounding_box()
  page.mouse.move(box['x'] + box['width'] / 3, box['y'] + box['height'] / 3)
  page.mouse.wheel(0, -300)
  _drag(page, viewer, -70, -40)
  moved = _transform(viewer)
  assert moved[2] > opened[2]
  readout = viewer.locator('.remat-viewer-zoom').inner_text()
  for svg in (diagrams['mlp'], diagrams['mlp_dots']):
    page.evaluate(show, [viewer.element_handle(), svg])
    assert _transform(viewer) == pytest.approx(moved)
    assert viewer.locator('.remat-viewer-zoom').inner_text() == readout

  # Dragged off the drawing, the view comes back to it on a redraw.
  for _ in range(10):
    if _measure(page, viewer)['drawn']['left'] > box['x'] + box['width'] / 2:
      break
    _drag(page, viewer, 500, 0)
  assert _measure(page, viewer)['drawn']['left'] > box['x'] + box['width'] / 2
  page.evaluate(show, [viewer.element_handle(), diagrams['mlp']])
  seen = _measure(page, viewer)
  assert seen['drawn']['left'] <= seen['stage']['left'] + MARGIN_PX + 1, seen
  assert _transform(viewer)[2] == pytest.approx(moved[2])

  # Fitted, a new drawing is fitted too.
  viewer.get_by_role('button', name='fit').click()
  page.evaluate(show, [viewer.element_handle(), diagrams['mlp_dots']])
  seen = _measure(page, viewer, everywhere=True)
  assert _inside(seen['drawn'], seen['stage']), seen
  assert errors == []
  page.close()


def _minimap(page, viewer) -> dict:
  """The minimap's drawing and its view rectangle, on the page."""
  return page.evaluate("""(v) => {
    const box = (e) => { const r = e.getBoundingClientRect();
                         return {left: r.left, top: r.top, width: r.width, height: r.height}; };
    const map = v.querySelector('.remat-viewer-minimap');
    return {map: box(map.querySelector('img')), view: box(map.querySelector('.remat-viewer-minimap-view')),
            loaded: map.querySelector('img').naturalWidth > 0};
  }""", viewer.element_handle())


def _centre_in_drawing(viewer) -> tuple[float, float]:
  """The point of the drawing (its units) at the stage's centre."""
  x, y, k = _transform(viewer)
  box = viewer.locator('.remat-viewer-stage').bounding_box()
  return (box['width'] / 2 - x) / k, (box['height'] / 2 - y) / k


def test_static_viewer_minimap_shows_the_view_and_moves_it(browser, tmp_path,
                                                          diagrams):  # noqa: F811
  page, viewer, errors = _open(browser, tmp_path, diagrams['large'])
  minimap = viewer.locator('.remat-viewer-minimap')
  assert minimap.is_visible()
  before = _minimap(page, viewer)
  assert before['loaded'] and 0 < before['map']['width'] <= 160, before
  # The rectangle is the stage's share of the drawing.
  x, y, k = _transform(viewer)
  stage = viewer.locator('.remat-viewer-stage').bounding_box()
  drawn = _measure(page, viewer)['drawn']
  assert before['view']['width'] / before['map']['width'] == pytest.approx(
      stage['width'] / drawn['width'], rel=0.02)

  # Dragging the drawing left and up moves the view right and down.
  _drag(page, viewer, -400, -200)
  after = _minimap(page, viewer)
  scale = before['map']['width'] / drawn['width']  # minimap px per stage px
  assert after['view']['left'] - before['view']['left'] == pytest.approx(400 * scale, abs=1)
  assert after['view']['top'] - before['view']['top'] == pytest.approx(200 * scale, abs=1)

  # A click on the minimap centres the view on that point, at the same zoom;
  # a drag on it follows the pointer.
  width, height = (float(v) for v in re.search(
      r'viewBox="[\d.]+ [\d.]+ ([\d.]+) ([\d.]+)"', diagrams['large']).groups())
  m = after['map']
  for fx, fy in ((0.5, 0.6), (0.3, 0.4)):
    page.mouse.click(m['left'] + fx * m['width'], m['top'] + fy * m['height'])
    assert _centre_in_drawing(viewer) == pytest.approx((fx * width, fy * height), abs=3)
    assert _transform(viewer)[2] == k
  page.mouse.move(m['left'] + 0.4 * m['width'], m['top'] + 0.5 * m['height'])
  page.mouse.down()
  page.mouse.move(m['left'] + 0.6 * m['width'], m['top'] + 0.3 * m['height'], steps=4)
  assert _centre_in_drawing(viewer) == pytest.approx((0.6 * width, 0.3 * height), abs=3)
  page.mouse.up()

  # The whole drawing in view: no minimap.
  viewer.get_by_role('button', name='fit').click()
  assert minimap.is_hidden()
  assert errors == []
  page.close()


def _found(viewer) -> str:
  return viewer.locator('.remat-viewer-found').inner_text()


def _current_match(page, viewer) -> dict:
  """The node the search is on: its id, what it says, whether it shows
  whole in the stage, and its smallest text (px)."""
  return page.evaluate("""(v) => {
    const node = v.querySelector('g.node.remat-match-current');
    const stage = v.querySelector('.remat-viewer-stage').getBoundingClientRect();
    const r = node.getBoundingClientRect();
    const link = node.querySelector('a');
    const sizes = Array.from(node.querySelectorAll('text'),
        (t) => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
    return {id: node.id, says: node.textContent + ' ' + (link.getAttribute('xlink:title') || ''),
            shown: r.left >= stage.left && r.right <= stage.right && r.top >= stage.top
                   && r.bottom <= stage.bottom, smallest: Math.min(...sizes)};
  }""", viewer.element_handle())


def test_static_viewer_search_finds_names_and_source_lines(browser, tmp_path,
                                                          diagrams):  # noqa: F811
  from remat_explorer import examples
  page, viewer, errors = _open(browser, tmp_path, diagrams['mlp'])
  search = viewer.get_by_role('searchbox')
  # A checkpoint_name, typed as the user would.
  search.press_sequentially('pre_activation')
  marked = viewer.locator('g.node.remat-match')
  count = marked.count()
  assert count >= 2  # the forward pass names it, the backward pass reads it
  assert _found(viewer) == f'1 of {count}'
  # Each says it, on its label or in its tooltip.
  for says in marked.evaluate_all(
      "(nodes) => nodes.map((n) => n.textContent + ' '"
      " + n.querySelector('a').getAttribute('xlink:title'))"):
    assert 'pre_activation' in says
  first = _current_match(page, viewer)
  assert first['shown'] and first['smallest'] >= MIN_TEXT_PX, first
  search.press('Enter')
  second = _current_match(page, viewer)
  assert _found(viewer) == f'2 of {count}' and second['id'] != first['id']
  assert second['shown'] and second['smallest'] >= MIN_TEXT_PX, second
  search.press('Shift+Enter')
  assert _found(viewer) == f'1 of {count}' and _current_match(page, viewer)['id'] == first['id']
  for _ in range(count):
    search.press('Enter')  # round to the first again
  assert _current_match(page, viewer)['id'] == first['id']

  # A line of the program's source, as its tooltip names it.
  lines, start = inspect.getsourcelines(examples.mlp)
  line = start + next(i for i, text in enumerate(lines) if "'pre_activation')" in text)
  search.fill(f'examples.py:{line}')
  count = marked.count()
  assert count >= 1 and _found(viewer) == f'1 of {count}'
  hit = _current_match(page, viewer)
  assert f'examples.py:{line} ' in hit['says'] and hit['shown'], hit
  # A query ending in a digit ends a number there: line 1 is not line 1xx.
  search.fill(f'examples.py:{str(line)[0]}')
  assert _found(viewer) == 'no match'

  search.fill('no such thing in this program')
  assert _found(viewer) == 'no match' and marked.count() == 0
  search.fill('pre_activation')
  search.press('Escape')
  assert search.input_value() == '' and _found(viewer) == '' and marked.count() == 0
  assert not viewer.locator('.remat-viewer-stage.remat-searching').count()
  assert errors == []
  page.close()
