"""A self-contained HTML report: one file with the diagrams, charts and tables.

``report_html`` is a pure function of analysis data (a ``Comparison`` and the
``RematReport`` of the policy to show in detail); it inlines every compared
policy's split diagram as SVG in the pan-and-zoom viewer, each in a
``<details>`` that a click on the policy opens (policies whose splits draw
the same share one), the memory timeline of the policy shown as SVG with
what is live at its peak (their scripts inlined too) and the charts as PNG
at their natural size, so the file opens anywhere offline.

It opens with what to take away: the program as written, the policy the
comparison recommends (``recommended``, its rule in one line), and one line
when XLA merged a recompute away (the rows' notes say which).
"""

from __future__ import annotations

from remat_explorer.viz.charts.costs import (plot_memory_breakdown, plot_pareto,
                                            plot_residuals_by_origin)
from remat_explorer.viz.charts.timeline_chart import plot_memory_timeline
from remat_explorer.viz.charts._figures import chart_img
from remat_explorer.viz.diagram.render import render_diagram
from remat_explorer.viz.html.captions import compile_error_html
from remat_explorer.viz.html.layout_tables import nesting_levels_html, scan_layouts_html
from remat_explorer.viz.diagram.split_graph import split_graph
from remat_explorer.viz.html.tables import (TABLE_CSS, comparison_table_html,
                                            report_jaxprs_html, residual_table_html)
from remat_explorer.viz.text import format_bytes, format_flops, html_text, unique_lines
from remat_explorer.viz.html.timeline_html import timeline_assets_html, timeline_html
from remat_explorer.viz.charts.timeline_view import timeline_view
from remat_explorer.viz.diagram.viewer import static_viewer_html, viewer_assets_html

RECOMMENDATION_RULE = ('the fewest FLOPs among the policies on the Pareto front whose '
                       "compiled peak is below no remat's")

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1em;
       max-width: 1200px; color: #222; }
h1, h2 { font-weight: 600; }
section { margin-bottom: 2.5em; }
.note { color: #555; font-size: 0.9em; }
.warning { background: #fff4e5; border-left: 4px solid #f0a020; padding: 0.5em 1em; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 12px; }
details.remat-diagram { margin: 0.3em 0; }
details.remat-diagram > summary { cursor: pointer; padding: 0.3em 0; font-weight: 600;
  overflow-wrap: anywhere; }
details.remat-diagram > summary .note { font-weight: normal; }
""" + TABLE_CSS


def report_html(comparison, report, *, title: str | None = None,
                search_result=None, shown_because: str = '') -> str:
  """The whole report as one HTML document (a string); `report` is the
  policy shown in detail, `shown_because` says why (e.g. 'the program as
  written').

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> comparison = rx.compare(loss_fn, *args, policies=['dots_saveable'])
    >>> html = viz.report_html(comparison, comparison.row('dots_saveable').report)
    >>> html.startswith('<!DOCTYPE html>'), '<svg' in html
    (True, True)
  """
  esc = html_text
  title = title or f'Rematerialization report: {comparison.function}'
  selected = next((r for r in comparison.rows if r.report is report), None)
  costs_by_label = {r.label: r.costs for r in comparison.rows
                    if not r.failed and r.costs.timeline is not None}
  baseline = comparison.baseline
  under = (f'{esc(report.policy)} (lowering {esc(report.lowering)}, '
           f'{esc(comparison.device_kind)})')
  parts = [
      '<!DOCTYPE html><html><head><meta charset="utf-8">',
      f'<title>{esc(title)}</title><style>{_STYLE}</style></head><body>',
      f'<h1>{esc(title)}</h1>',
      f'<p class="note">Device: {esc(comparison.device_kind)} '
      f'({esc(comparison.platform)}'
      + (f', {format_bytes(comparison.device_memory_bytes)} of memory each'
         if comparison.device_memory_bytes else '')
      + '). Memory and compiled FLOPs are XLA\'s '
      'figures for the compiled programs (FLOPs executed, each loop body once per '
      'trip); the charts, the front and the recommendation rank by them, and the '
      'table also gives what the jaxpr asks for. A policy\'s warnings are in its '
      'row\'s notes.</p>',
      _summary_html(comparison),
      '<section><h2>Policies compared</h2>', comparison_table_html(comparison),
      # XLA's message of each compile that failed, its first line shown (the
      # table's note) and the rest folded: it can run to pages of HLO.
      *(compile_error_html(r.costs, f'{r.label} did not compile')
        for r in comparison.rows if r.failed and r.report is not None),
      scan_layouts_html(comparison),
      chart_img(plot_pareto(comparison, selected=selected and selected.label,
                         search_result=search_result), 'Peak memory against FLOPs'),
      chart_img(plot_memory_breakdown(comparison), 'Memory by policy'),
      '</section>',
  ]
  if costs_by_label:
    parts += ['<section><h2>Memory along the compiled schedule</h2>',
              chart_img(plot_memory_timeline(
                  costs_by_label, reference=baseline and baseline.label), 'Memory timeline')]
    if selected is not None:
      reference = (None if baseline is None or baseline is selected or baseline.failed
                   else (baseline.label, baseline.costs))
      parts += [f'<h3>Under {esc(selected.label)}: what is live at each step</h3>',
                timeline_html(timeline_view(report, selected.costs, reference=reference))]
    parts.append('</section>')
  shown = selected.label if selected is not None else report.policy
  why = f' ({esc(shown_because)})' if shown_because else ''
  parts += [
      '<section><h2>Split diagrams</h2>',
      f'<p class="note">Shown in detail (its diagram open, its residuals and program '
      f'below): {esc(shown)}{why}, policy {under}. A click on a policy opens its split '
      'diagram, another closes it; an open diagram pans with a drag and zooms with the '
      'wheel, “fit” shows it whole. Modules and calls are drawn closed: the Explorer '
      'opens them with a click, <code>split_graph(report, expand=...)</code> by the id '
      'each one shows on hover.</p>',
      _diagrams_html(comparison, report, selected),
      nesting_levels_html(report),
      '</section>',
      f'<section><h2>Residuals under {esc(shown)}</h2>',
      residual_table_html(report),
      chart_img(plot_residuals_by_origin(report), 'Residual bytes by origin'),
      '</section>',
      f'<section><h2>Program</h2><p class="note">policy {under}</p>',
      report_jaxprs_html(report), '</section>',
      viewer_assets_html(), timeline_assets_html(),
      '</body></html>',
  ]
  return '\n'.join(parts)


def _diagrams_html(comparison, report, selected) -> str:
  """A ``<details>`` per split diagram of the compared policies, the one of
  `report` open; policies whose diagrams draw the same (the program as
  written and the built-in policy it uses) share one, so the page carries
  each SVG once. A failed row says why it has none."""
  shown: dict[str, list] = {}  # SVG text -> [(row label, its report, diagram)]
  failed = []
  for row in comparison.rows:
    if row.report is None:
      failed.append(row)
      continue
    diagram = render_diagram(split_graph(row.report, opens_on_click=False))
    shown.setdefault(diagram.svg or row.label, []).append((row.label, row.report, diagram))
  if selected is None:  # `report` is none of the rows': drawn first
    diagram = render_diagram(split_graph(report, opens_on_click=False))
    shown = {diagram.svg or report.policy: [(report.policy, report, diagram)], **shown}
  parts = []
  for entries in shown.values():
    labels = ', '.join(f'<span class="remat-policy">{html_text(label)}</span>'
                       for label, _, _ in entries)
    _, first, diagram = entries[0]
    is_open = any(r is report for _, r, _ in entries)
    warnings = [w for _, r, _ in entries for w in r.warnings]
    parts.append(
        f'<details class="remat-diagram"{" open" if is_open else ""}>'
        f'<summary>{labels} <span class="note">(lowering '
        f'{html_text(first.lowering)}, {format_bytes(first.residual_bytes)} of residuals)'
        '</span></summary>' + _warnings_html(warnings)
        + (static_viewer_html(diagram.svg) if diagram.svg else '') + diagram.notes_html
        + '</details>')
  for row in failed:
    parts.append(compile_error_html(row.costs, f'No diagram for {row.label}')
                 if row.costs.error else
                 f'<p class="note">No diagram for {html_text(row.label)}: it was not '
                 'analyzed</p>')
  return ''.join(parts)


def _warnings_html(warnings) -> str:
  return ''.join(f'<p class="warning">{html_text(w)}</p>' for w in unique_lines(warnings))


def recommended(comparison):
  """The row `RECOMMENDATION_RULE` picks, None if no policy lowers the
  compiled peak."""
  baseline = comparison.baseline
  if baseline is None or baseline.failed:
    return None
  below = [r for r in comparison.pareto_front if r is not baseline and not r.failed
           and r.peak_bytes < baseline.peak_bytes and r.ranked_flops is not None]
  return min(below, key=lambda r: (r.ranked_flops, r.peak_bytes), default=None)


def _summary_html(comparison) -> str:
  """The program as written, the recommended policy and its rule, and one
  line if XLA merged a recompute away."""
  written, baseline, best = comparison.rows[0], comparison.baseline, recommended(comparison)
  lines = [f'<b>{html_text(written.label)}</b>: {_figures(written, baseline)}.']
  if best is not None:
    lines.append(f'<b>Recommended: {html_text(best.label)}</b>: '
                 f'{_figures(best, baseline)}. Rule: {RECOMMENDATION_RULE}.')
  elif baseline is not None:
    lines.append(f'No policy compiles to a peak below no remat\'s '
                 f'({format_bytes(baseline.peak_bytes)}) here: nothing to recommend.')
  merged = [r.label for r in comparison.rows if r.recompute_eliminated]
  if merged:
    lines.append(f'On {html_text(comparison.device_kind)} XLA merged the recompute of '
                 f'{html_text(", ".join(merged))} into the forward pass, so it keeps those '
                 'values anyway (see the rows\' notes); the cond lowering '
                 '(<code>--lowering cond</code>) keeps the recompute.')
  return ('<section class="summary"><h2>In short</h2>'
          + ''.join(f'<p>{line}</p>' for line in lines) + '</section>')


def _figures(row, baseline) -> str:
  """'peak 17.4 MiB (−68% of no remat's), 3.39 GFLOP (+22%)'."""
  if row.failed:
    return f'did not compile ({html_text(row.costs.error_line)})'
  text = (f'compiled peak {format_bytes(row.peak_bytes)}, '
          f'{format_flops(row.ranked_flops)} executed')
  if baseline is not None and not baseline.failed and row is not baseline:
    text += (f' ({_change(row.peak_bytes, baseline.peak_bytes)} memory, '
             f'{_change(row.ranked_flops, baseline.ranked_flops)} FLOPs against no remat)')
  return text


def _change(value, base) -> str:
  if not base or value is None:
    return '±?'
  change = value / base - 1
  return f'{change:+.0%}'.replace('-', '−')
