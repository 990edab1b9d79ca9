"""Figures as HTML fragments: a diagram's SVG with its Graphviz notes, a
chart as a PNG.

Shared by the Explorer, its static fallback and the report, so that all say
the same thing when Graphviz's ``dot`` is missing or warns, and embed charts
the same way.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import graphviz
from matplotlib.figure import Figure

from remat_explorer.viz.split_graph import render_svg
from remat_explorer.viz.text import html_text


def figure_png_data_uri(figure: Figure) -> str:
  buffer = io.BytesIO()
  figure.savefig(buffer, format='png', dpi=110, bbox_inches='tight')
  return 'data:image/png;base64,' + base64.b64encode(buffer.getvalue()).decode('ascii')


def chart_img(figure: Figure, alt: str = '', css_class: str = 'chart') -> str:
  return (f'<img class="{css_class}" style="max-width:100%" alt="{html_text(alt)}" '
          f'src="{figure_png_data_uri(figure)}">')


@dataclass(frozen=True)
class RenderedDiagram:
  svg: str
  """The ``<svg>`` element (no XML prologue); '' when ``dot`` is missing."""
  notes_html: str
  """What to show beside it: Graphviz's warnings folded away, or, without
  ``dot``, how to install it and the DOT source."""


def render_diagram(digraph: graphviz.Digraph) -> RenderedDiagram:
  try:
    rendered = render_svg(digraph)
  except RuntimeError as e:
    return RenderedDiagram('', f'<p class="warning" style="color:#b00020">{html_text(e)}</p>'
                               f'<pre>{html_text(digraph.source)}</pre>')
  svg = rendered.svg[rendered.svg.index('<svg'):]
  return RenderedDiagram(svg, graphviz_notes_html(rendered.warnings))


def graphviz_notes_html(warnings) -> str:
  """Graphviz's stderr, folded: a line saying it warned, the lines inside."""
  if not warnings:
    return ''
  count = len(warnings)
  return ('<details class="remat-graphviz-notes" style="color:#666;font-size:0.85em">'
          f'<summary>Graphviz reported {count} layout warning{"s" * (count != 1)} '
          '(an edge may be routed roughly)</summary>'
          f'<pre>{html_text(chr(10).join(warnings))}</pre></details>')
