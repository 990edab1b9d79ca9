"""The diagram viewer as a widget (anywidget: no build step, no extension to
install beyond ``pip``; it runs in JupyterLab 4 and Notebook 7).

Python sets ``svg``; the front end shows it with pan, zoom, a minimap and
a search box (``viewer.js``) and sets ``clicked`` to the id of a node the user
clicks (Graphviz writes each node's id on its ``<g class="node">``), adding
one to ``click_count`` so that a second click on the same node is seen too.
Setting ``svg`` again replaces the drawing, keeping the zoom and position
the user chose.
"""

from __future__ import annotations

from remat_explorer.viz.widget.lab import require_lab

require_lab('The diagram viewer widget')

import anywidget  # noqa: E402
import traitlets  # noqa: E402

from remat_explorer.viz.diagram.viewer import viewer_css, widget_module  # noqa: E402


class DiagramViewer(anywidget.AnyWidget):
  _esm = widget_module()
  _css = viewer_css()
  svg = traitlets.Unicode('').tag(sync=True)
  clicked = traitlets.Unicode('').tag(sync=True)
  """The id of the node clicked last ('' before any click)."""
  click_count = traitlets.Int(0).tag(sync=True)
