"""HTML whose memory timelines respond to the pointer, as a widget.

An ipywidgets ``HTML`` runs no script, so the Explorer's Costs view is this
anywidget instead: Python sets ``value`` (HTML, as for ``widgets.HTML``) and
the front end shows it and mounts each timeline in it (``timeline.js``).
"""

from __future__ import annotations

from remat_explorer.viz.widget.lab import require_lab

require_lab('The HTML view widget')

import anywidget  # noqa: E402
import traitlets  # noqa: E402

from remat_explorer.viz.html.timeline_html import timeline_css, timeline_script  # noqa: E402


class HtmlView(anywidget.AnyWidget):
  _esm = timeline_script() + '\nexport default { render: renderHtmlWidget };\n'
  _css = timeline_css()
  value = traitlets.Unicode('').tag(sync=True)
