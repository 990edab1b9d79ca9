"""The split diagram on a page: pan and zoom where scripts run, an image where
they do not.

The viewer (``static/viewer.js``) opens an SVG at the largest zoom that
shows it whole, up to its natural size, unless its smallest text would be
under 11 CSS px: then at the zoom where it is 11 px, from the top left of
the forward pass (and the title where it fits beside). It pans and zooms
with d3-zoom (vendored under ``static/d3/``, each module as npm ships it,
with its licence: no network at run time); a minimap in the stage's corner
(``static/viewer_minimap.js``) shows and moves the view, and a search box
(``static/viewer_search.js``) finds nodes by what their labels and tooltips
say (a name, a module path, ``model.py:42``). Shown another drawing (the
widget's ``svg`` set again), it keeps the zoom and position the user chose.
The same script serves the Explorer's widget
(``viewer_widget.DiagramViewer``) and the static report
(``static_viewer_html``, whose element keeps its viewer as ``rematViewer``). An untrusted notebook keeps no scripts and no
inline SVG, so the Explorer's fallback shows the diagram as an ``<img>`` of
SVG data (``svg_img_html``), which JupyterLab keeps.
"""

from __future__ import annotations

import base64
import functools
from pathlib import Path

from remat_explorer.viz.text import html_text

STATIC = Path(__file__).parent / 'static'
D3_MODULES = ('d3-color', 'd3-dispatch', 'd3-ease', 'd3-interpolate', 'd3-selection',
              'd3-timer', 'd3-transition', 'd3-drag', 'd3-zoom')
"""In dependency order: each module's ``require``s are loaded before it."""
VIEWER_SCRIPTS = ('viewer_search.js', 'viewer_minimap.js', 'viewer.js')
"""The viewer's own scripts, the one that uses the others last."""

# Each d3 file is a UMD bundle. Given `module` and `exports` it takes its
# CommonJS branch, so no `d3` global is made (a page may hold another d3)
# and its `require`s resolve to the modules loaded before it.
_LOADER = """
const d3Modules = {};
function d3Load(name, body) {
  const module = {exports: {}};
  body.call(undefined, module, module.exports, (dep) => {
    if (!(dep in d3Modules)) throw new Error(`${name} needs ${dep}, not loaded`);
    return d3Modules[dep];
  });
  d3Modules[name] = module.exports;
}
"""


@functools.cache
def viewer_script() -> str:
  """The d3 modules and the viewer as one script body (no ``export``)."""
  parts = [_LOADER]
  for name in D3_MODULES:
    source = (STATIC / 'd3' / f'{name}.min.js').read_text(encoding='utf-8')
    # The newline keeps the file's leading `//` comment from eating the brace.
    parts.append(f'd3Load({name!r}, function (module, exports, require) {{\n{source}\n}});')
  parts.append('const d3 = Object.assign({}, d3Modules["d3-selection"], '
               'd3Modules["d3-zoom"]);')
  for name in VIEWER_SCRIPTS:
    parts.append((STATIC / name).read_text(encoding='utf-8'))
  script = '\n'.join(parts)
  # Inlined in a <script> element, these would end it or open a comment.
  assert '</script' not in script.lower() and '<!--' not in script, 'unsafe to inline'
  return script


@functools.cache
def viewer_css() -> str:
  return (STATIC / 'viewer.css').read_text(encoding='utf-8')


@functools.cache
def widget_module() -> str:
  """The anywidget ES module: the script with ``render`` exported."""
  return viewer_script() + '\nexport default { render: renderWidget };\n'


def static_viewer_html(svg: str) -> str:
  """`svg` inline in a viewer element that ``viewer_assets_html`` mounts;
  before that (or without scripts) it shows at natural size, scrolled."""
  return f'<div class="remat-viewer-static">{svg}</div>'


def viewer_assets_html() -> str:
  """The style and script that mount every ``static_viewer_html`` on a page:
  once per document, after the diagrams."""
  return (f'<style>{viewer_css()}</style>'
          f'<script>(function () {{\n{viewer_script()}\nmountStatic(document);\n}})();</script>')


def svg_data_uri(svg: str) -> str:
  return 'data:image/svg+xml;base64,' + base64.b64encode(svg.encode('utf-8')).decode('ascii')


def svg_img_html(svg: str, alt: str = 'split diagram') -> str:
  """`svg` as an ``<img>`` at its natural size, in a box that scrolls.

  An image keeps the SVG's own width and height (Graphviz's points), so its
  labels stay readable; ``max-width:none`` stops the page from shrinking it.
  """
  return (f'<div class="remat-split-img" style="overflow:auto;max-height:80vh">'
          f'<img class="diagram" alt="{html_text(alt)}" style="max-width:none" '
          f'src="{svg_data_uri(svg)}"></div>')
