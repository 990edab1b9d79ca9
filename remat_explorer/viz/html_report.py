"""A self-contained HTML report: one file with the diagrams, charts and tables.

``report_html`` is a pure function of analysis data (a ``Comparison`` and the
``RematReport`` of the policy to show in detail); it inlines the split
diagram as SVG in the pan-and-zoom viewer (its script inlined too) and the
charts as PNG, so the file opens anywhere offline.
"""

from __future__ import annotations


from remat_explorer.viz.charts import (plot_memory_breakdown, plot_memory_timeline,
                                       plot_pareto, plot_residuals_by_origin)
from remat_explorer.viz.embed import chart_img, render_diagram
from remat_explorer.viz.split_graph import split_graph
from remat_explorer.viz.tables import (comparison_table_html, other_warnings,
                                       report_jaxprs_html, residual_table_html)
from remat_explorer.viz.text import html_text, unique_lines
from remat_explorer.viz.viewer import static_viewer_html, viewer_assets_html

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; }
h1, h2 { font-weight: 600; }
section { margin-bottom: 2.5em; }
.note { color: #555; font-size: 0.9em; }
.warning { background: #fff4e5; border-left: 4px solid #f0a020; padding: 0.5em 1em; }
img.chart { max-width: 100%; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.8em; }
"""


def report_html(comparison, report, *, title: str | None = None,
                search_result=None) -> str:
  """The whole report as one HTML document (a string)."""
  esc = html_text
  title = title or f'Rematerialization report: {comparison.function}'
  selected = next((r for r in comparison.rows if r.report is report), None)
  costs_by_label = {r.label: r.costs for r in comparison.rows
                    if not r.failed and r.costs.timeline is not None}
  baseline = comparison.baseline
  diagram = render_diagram(split_graph(report))
  under = (f'{esc(report.policy)} (lowering {esc(report.lowering)}, '
           f'{esc(comparison.device_kind)})')
  parts = [
      '<!DOCTYPE html><html><head><meta charset="utf-8">',
      f'<title>{esc(title)}</title><style>{_STYLE}</style></head><body>',
      f'<h1>{esc(title)}</h1>',
      f'<p class="note">Device: {esc(comparison.device_kind)} '
      f'({esc(comparison.platform)}). Memory and XLA FLOPs are XLA\'s compiled '
      'figures; the charts plot FLOPs counted from the jaxpr (scan trip counts '
      'applied), with XLA\'s count in the table. A policy\'s warnings are in its '
      'row\'s notes.</p>',
      '<section><h2>Policies compared</h2>', comparison_table_html(comparison),
      _warnings_html(other_warnings(comparison)),
      chart_img(plot_pareto(comparison, selected=selected and selected.label,
                         search_result=search_result), 'Peak memory against FLOPs'),
      chart_img(plot_memory_breakdown(comparison), 'Memory by policy'),
      '</section>',
  ]
  if costs_by_label:
    parts += ['<section><h2>Memory along the compiled schedule</h2>',
              chart_img(plot_memory_timeline(
                  costs_by_label, reference=baseline and baseline.label), 'Memory timeline'),
              '</section>']
  parts += [
      f'<section><h2>Split under {esc(report.policy)}</h2>',
      f'<p class="note">policy {under}: drag to pan, wheel to zoom, '
      '“fit” for the whole diagram.</p>',
      _warnings_html(report.warnings),
      '<div class="diagram">',
      static_viewer_html(diagram.svg) if diagram.svg else '', diagram.notes_html, '</div>',
      '</section>',
      f'<section><h2>Residuals under {esc(report.policy)}</h2>',
      residual_table_html(report),
      chart_img(plot_residuals_by_origin(report), 'Residual bytes by origin'),
      '</section>',
      f'<section><h2>Program</h2><p class="note">policy {under}</p>',
      report_jaxprs_html(report), '</section>',
      viewer_assets_html(),
      '</body></html>',
  ]
  return '\n'.join(parts)


def _warnings_html(warnings) -> str:
  return ''.join(f'<p class="warning">{html_text(w)}</p>' for w in unique_lines(warnings))
