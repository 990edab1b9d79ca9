"""The Explorer as static HTML: what shows where its widget cannot run.

An untrusted notebook in JupyterLab, a notebook viewer (nbviewer, GitHub)
and nbconvert show an output's ``text/html`` instead of its widget. Their
sanitizers keep images and tables but drop scripts, styles and inline SVG,
so every figure here is an ``<img>`` of SVG data and all styling is inline.
The snapshot says that it is one and how to get the live widget, then
shows the view's caption, the compiled costs when they are known (XLA's
figures, the memory timeline, what is live at the peak), the split diagram
fitted to the cell's width (and, folded, at full size, to read its
labels), the residual table, the error when the analysis failed, and the
Explorer's last search and comparison.
"""

from __future__ import annotations

from remat_explorer.analysis import recompute_eliminated
from remat_explorer.viz.charts.timeline_view import timeline_view
from remat_explorer.viz.diagram.render import render_diagram
from remat_explorer.viz.diagram.split_graph import split_graph
from remat_explorer.viz.diagram.viewer import svg_data_uri, svg_img_html
from remat_explorer.viz.html.captions import (caption_html, compile_error_html, device_text,
                                              error_html, warnings_html)
from remat_explorer.viz.html.tables import (costs_table_html, peak_table_html,
                                            residual_table_html)
from remat_explorer.viz.html.timeline_html import timeline_svg
from remat_explorer.viz.text import html_text

SNAPSHOT_NOTE = ('Static snapshot of the remat Explorer, as it was when this output was '
                 'saved. For the live widget, run this cell in a trusted notebook with a '
                 "running kernel and the widgets installed (pip install 'remat_explorer[lab]').")
NOT_COMPILED = 'Compiled costs: not in this snapshot (not compiled when it was saved).'
_FITTED = 'max-width:100%;height:auto'


def snapshot_html(report=None, costs=None, error: str | None = None, *, baseline=None,
                  policy: str | None = None, lowering: str | None = None, block=None,
                  expand=(), diagram=None, figures=None, search: str | None = None,
                  comparison: str | None = None) -> str:
  """The snapshot of one view of the Explorer (see the module).

  `report` is the view's ``RematReport`` (None when its analysis failed:
  `error` then says why, and `policy` and `lowering` what was asked for);
  `costs` its ``CompiledCosts`` when compiled, `baseline` no remat's;
  `policy` the label the view shows (default the report's policy);
  `block` and `expand` choose the diagram as ``split_graph`` does, or
  `diagram` is the ``RenderedDiagram`` already drawn (worded for an image:
  ``SplitDigraph.as_image``); `figures` what
  ``compiled_figures`` read of `costs`, if it has; `search` and
  `comparison` the HTML of the Explorer's last search and comparison.
  """
  policy = policy if policy is not None else (report.policy if report else 'no policy')
  lowering = lowering if lowering is not None else (report.lowering if report else '')
  parts = [f'<div class="remat-snapshot"><p class="remat-snapshot-note" style="background:'
           f'#eef4fb;border-left:4px solid #4a90d9;padding:0.4em 0.8em">{SNAPSHOT_NOTE}</p>',
           caption_html(policy, lowering, device_text(report), 'showing')]
  if error:
    parts.append(error_html(error))
  if report is not None:
    parts.append(warnings_html(report.warnings))
    parts.append(_costs_html(report, costs, baseline, figures))
    if diagram is None:  # an image: a click on it opens nothing
      diagram = render_diagram(split_graph(report, block=block, expand=expand,
                                           opens_on_click=False))
    parts.append(_diagram_html(diagram))
    parts.append(residual_table_html(report))
  if search:
    parts.append(f'<h4>The last search</h4>{search}')
  if comparison:
    parts.append(f'<h4>The last comparison</h4>{comparison}')
  parts.append('</div>')
  return ''.join(parts)


class StaticView:
  """The Explorer's static snapshot of one report (and its compiled
  `costs`, if given), as HTML: what shows where scripts and inline SVG do
  not, such as an untrusted notebook, whose sanitizer keeps images and
  tables."""

  def __init__(self, report, costs=None):
    self.report, self.costs = report, costs

  def _repr_html_(self) -> str:
    return snapshot_html(self.report, self.costs)


def compiled_figures(report, costs, baseline) -> tuple:
  """(the flag when XLA merged the recompute away, or None; the memory
  timeline's view, no remat's beside it) of compiled `costs`: what the
  Explorer's Costs tab and its snapshot both draw, read once."""
  flag = recompute_eliminated(report, costs)
  reference = (None if baseline is None or baseline.failed or baseline is costs
               else ('no remat', baseline))
  return flag, timeline_view(report, costs, reference=reference)


def _costs_html(report, costs, baseline, figures) -> str:
  """XLA's figures, the merge flag, the memory timeline as an image and
  the buffers live at its peak; or why they are missing."""
  if costs is None:
    return f'<p class="remat-caption">{html_text(NOT_COMPILED)}</p>'
  if costs.failed:
    return compile_error_html(costs)
  flag, view = figures or compiled_figures(report, costs, baseline)
  parts = ['<div class="remat-costs"><h4>Compiled costs</h4>',
           costs_table_html(costs, baseline), warnings_html([flag] if flag else [])]
  if view is not None:
    parts += ['<h4>Memory along the compiled step</h4>',
              f'<img class="remat-timeline-img" style="{_FITTED}" alt="memory along the '
              f'compiled step under {html_text(view.policy)}" '
              f'src="{svg_data_uri(timeline_svg(view))}">',
              peak_table_html(list(view.buffers[view.peak.buffers]),
                              caption='Live at the peak')]
  parts.append('</div>')
  return ''.join(parts)


def _diagram_html(diagram) -> str:
  """The diagram fitted to the cell's width, then folded at its natural
  size (where Graphviz's labels are readable), in a box that scrolls."""
  if not diagram.svg:
    return diagram.notes_html  # no `dot`: how to install it, and the DOT text
  return (f'<h4>Split diagram</h4><img class="remat-snapshot-diagram" style="{_FITTED}" '
          f'alt="split diagram" src="{svg_data_uri(diagram.svg)}">'
          '<details class="remat-full-size"><summary>The diagram at full size (scroll to '
          f'pan)</summary>{svg_img_html(diagram.svg)}</details>{diagram.notes_html}')
