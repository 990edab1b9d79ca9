"""Figures as HTML fragments: a diagram as inline SVG, a chart as a PNG.

Shared by the Explorer and the static report, so that both say the same
thing when Graphviz's ``dot`` is missing and both embed charts the same way.
"""

from __future__ import annotations

import base64
import html
import io

import graphviz
from matplotlib.figure import Figure

from remat_explorer.viz.split_graph import to_svg


def figure_png_data_uri(figure: Figure) -> str:
  buffer = io.BytesIO()
  figure.savefig(buffer, format='png', dpi=110, bbox_inches='tight')
  return 'data:image/png;base64,' + base64.b64encode(buffer.getvalue()).decode('ascii')


def chart_img(figure: Figure, alt: str = '', css_class: str = 'chart') -> str:
  return (f'<img class="{css_class}" style="max-width:100%" alt="{html.escape(alt)}" '
          f'src="{figure_png_data_uri(figure)}">')


def inline_svg(digraph: graphviz.Digraph) -> str:
  """`digraph` as an ``<svg>`` element to inline in HTML; without Graphviz,
  the message saying how to install it and the DOT source instead."""
  try:
    svg = to_svg(digraph)
  except RuntimeError as e:
    return (f'<p class="warning" style="color:#b00020">{html.escape(str(e))}</p>'
            f'<pre>{html.escape(digraph.source)}</pre>')
  return svg[svg.index('<svg'):]  # without the XML prologue
