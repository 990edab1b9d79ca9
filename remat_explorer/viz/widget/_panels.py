"""The Explorer's HTML pieces: pure functions of analysis data and of what
is running, so the widget only assigns their results.
"""

from __future__ import annotations

from remat_explorer.analysis import error_summary
# The captions are the snapshot's too (``viz.html.captions``); the
# Explorer takes them from here.
from remat_explorer.viz.html.captions import (caption_html, compile_error_html,  # noqa: F401
                                              device_text, error_html, warnings_html)
from remat_explorer.viz.charts._figures import chart_img
from remat_explorer.viz.charts.costs import plot_memory_breakdown, plot_pareto
from remat_explorer.viz.html.layout_tables import scan_layouts_html
from remat_explorer.viz.html.tables import TABLE_CSS, comparison_table_html, costs_table_html
from remat_explorer.viz.html.snapshot import compiled_figures
from remat_explorer.viz.html.timeline_html import timeline_html
from remat_explorer.viz.text import format_bytes, format_flops, html_text, memory_share_text

STALE = 'remat-stale'
"""Class of a view whose figures are being recomputed: greyed, labelled."""
OUTDATED = 'remat-outdated'
"""Class of a view computed under other controls than the current ones."""
ESTIMATE = 'remat-estimate-box'
"""Class of the estimate shown while a compile runs: not greyed with it."""

KERNEL_CONTROL = 'remat-kernel-control'
"""Class of a control that asks the kernel to work: inert without one."""
NEEDS_KERNEL_HTML = (
    '<p class="remat-needs-kernel" role="status">No kernel runs this Explorer: '
    'it shows what was saved, and its controls do nothing. To explore again, '
    'run its cell.</p>')
"""Shown only where ipywidgets marks the Explorer disconnected: drawn from a
notebook's saved widget state, or after its kernel restarted."""

CSS = f"""<style>
.remat-explorer .{STALE} > *, .remat-explorer .{OUTDATED} > * {{ opacity: 0.4; }}
/* The badge has a line of its own above the view, at its right: laid over
   the view, it covered the estimate shown there while a compile runs. */
.remat-explorer .{STALE}::before, .remat-explorer .{OUTDATED}::before {{
  display: block; width: fit-content; margin: 0.2em 0.5em 0.2em auto; align-self: flex-end;
  padding: 0.1em 0.6em; background: #fff4e5; border: 1px solid #f0a020;
  border-radius: 3px; font-size: 12px;
}}
.remat-explorer .{STALE}::before {{ content: 'updating…'; }}
.remat-explorer .{STALE} > .{ESTIMATE} {{ opacity: 1; }}
.remat-explorer .{OUTDATED}::before {{
  content: 'computed under another lowering: press “compare all …” again';
}}
/* ipywidgets marks a widget whose kernel is gone 'jupyter-widgets-disconnected'
   (saved state, a restarted kernel). Its tabs and diagram still work in the
   page; what would ask the kernel says it cannot. */
.remat-explorer .remat-needs-kernel {{ display: none; }}
.remat-explorer.jupyter-widgets-disconnected .remat-needs-kernel {{
  display: block; margin: 0.2em 0 0.4em; padding: 0.3em 0.6em; background: #fff4e5;
  border: 1px solid #f0a020; border-radius: 3px; font-size: 13px;
}}
.remat-explorer.jupyter-widgets-disconnected .{KERNEL_CONTROL} {{
  opacity: 0.5; pointer-events: none;
}}
.remat-explorer .remat-caption {{ color: #444; font-size: 12px; margin: 0.2em 0 0.4em; }}
.remat-explorer .remat-task {{ display: flex; align-items: center; gap: 0.5em;
  font-size: 12px; white-space: nowrap; }}
.remat-explorer .remat-task progress {{ width: 9em; }}
.remat-explorer p.warning {{ color: #8a5a00; margin: 0.2em 0; }}
.remat-explorer p.error {{ color: #b00020; }}
.remat-explorer button {{ white-space: nowrap; }}
/* Figures on one line (“153.2 kFLOP”); the tables' text columns wrap
   (TABLE_CSS). */
.remat-explorer table td {{ white-space: nowrap; }}
{TABLE_CSS}
</style>"""


TABS = ('Split diagram', 'Residuals', 'Costs', 'Compare', 'Program')
"""The Explorer's tabs, in order."""


def progress_html(tasks) -> str:
  """A line per running task (``_work.Task``): a determinate ``<progress>``
  where its number of steps is known, an indeterminate one (no value: the
  browser animates it) where it is not, e.g. a single compile or a search
  that decides as it goes how many compiles it needs; none for a task that
  waits for another."""
  lines = []
  for t in tasks:
    text = html_text(t.label + (f': {t.step}' if t.step else ''))
    if t.waiting:  # no bar: nothing runs yet
      lines.append(f'<div class="remat-task"><span>{text}: next, once the '
                   'one under way ends</span></div>')
      continue
    if t.total:
      bar = f'<progress value="{min(t.done, t.total)}" max="{t.total}"></progress>'
      text += f' ({t.done}/{t.total})'
    else:
      bar = '<progress></progress>'
      text += '…'
    lines.append(f'<div class="remat-task">{bar}<span>{text}</span></div>')
  return ''.join(lines)


def estimate_html(label: str, estimate) -> str:
  """The figures estimated from the jaxpr (``estimate_costs``) while the
  compile runs, said to be an estimate: a model of the platform's XLA, not
  its numbers, with the estimate's notes."""
  notes = ''.join(f' {html_text(note)}.' for note in estimate.notes)
  return (f'<p class="remat-caption remat-estimate">Estimated from the jaxpr under '
          f'{html_text(label)}, before XLA compiles it: peak about '
          f'{html_text(format_bytes(estimate.peak_bytes))}, about '
          f'{html_text(format_flops(estimate.flops))} (a model of what '
          f'XLA:{html_text(estimate.platform.upper())} will do, not its figures; they '
          f'replace this when the compile lands).{notes}</p>')


def error_text(e: Exception) -> str:
  """'ValueError: ...': the exception's type and message, without a
  traceback or JAX's note about it."""
  return error_summary(e)


def costs_html(label, lowering, costs, baseline, report, figures=None) -> str:
  """The Costs tab: XLA's figures for `label` beside no remat's, the flag
  when the compiler merged the recompute away, the memory timeline (no
  remat's beside it) and what is live at the peak; `figures`, what
  ``compiled_figures`` read of them, if it has."""
  share = memory_share_text(costs.peak_bytes, costs.device_memory_bytes)
  caption = caption_html(label, lowering, f'device {costs.device_kind}'
                         + (f' · peak {share}' if share else ''), 'compiled')
  if costs.failed:
    return caption + compile_error_html(costs)
  flag, view = figures or compiled_figures(report, costs, baseline)
  return (f'<div class="remat-costs">{caption}{costs_table_html(costs, baseline)}'
          + warnings_html([flag] if flag else [])
          + '<h4>Memory along the compiled step</h4>' + timeline_html(view) + '</div>')


def budget_bytes(fraction: float, ends: tuple[int, int]) -> int:
  """A fraction of the way from the lowest compiled peak known to the
  highest (`ends`), in bytes."""
  low, high = ends
  return int(low + fraction * (high - low))


def budget_text(fraction: float, ends: tuple[int, int] | None) -> str:
  """'50% (≈ 1.2 MiB)' once the ends are known, else '50%'."""
  if ends is None:
    return f'{fraction:.0%}'
  return f'{fraction:.0%} (≈ {format_bytes(budget_bytes(fraction, ends))})'


def budget_html(fraction: float, ends: tuple[int, int] | None,
                compiling: bool = True) -> str:
  """Beside the budget slider: the bytes its fraction stands for, or that
  they are being compiled, or that they will be once the budget is used."""
  if ends is None:
    spans = ('nothing_saveable, everything_saveable, the program as written and '
             'without remat, whose peaks the budget spans')
    if not compiling:
      return (f'<span class="remat-caption" title="moving the slider compiles {spans}">'
              '≈ … bytes (move the slider to compile its ends)</span>')
    return (f'<span class="remat-caption" title="compiling {spans}">'
            '≈ … bytes (compiling…)</span>')
  low, high = ends
  return (f'<span title="0%: the lowest compiled peak known, {format_bytes(low)}; '
          f'100%: the highest, {format_bytes(high)}">'
          f'≈ {format_bytes(budget_bytes(fraction, ends))} '
          f'<span class="remat-caption">({format_bytes(low)} – {format_bytes(high)})'
          '</span></span>')


def search_html(result) -> str:
  """What a search found (``SearchResult``): its policy and explanation
  (what it saves, its peak against the budget, its FLOPs), or, when
  nothing fits the budget, that no policy can."""
  if not result.fits:
    return error_html(f'No policy fits the budget of {format_bytes(result.budget_bytes)}. '
                      f'{result.explanation}')
  return (f'<p class="remat-search-result">Search within {format_bytes(result.budget_bytes)}:'
          f' <b>{html_text(result.label)}</b>. {html_text(result.explanation)}</p>')


def comparison_html(comparison, selected, search_result) -> str:
  """The Compare tab: its tables, then its charts."""
  return (comparison_tables_html(comparison)
          + comparison_charts_html(comparison, selected, search_result))


def comparison_tables_html(comparison) -> str:
  """The table (each policy's warnings in its row) and each checkpointed
  scan's schedule in theory and measured."""
  return comparison_table_html(comparison) + scan_layouts_html(comparison)


def comparison_charts_html(comparison, selected, search_result) -> str:
  """The Pareto chart and memory by policy."""
  return (chart_img(plot_pareto(comparison, selected=selected, search_result=search_result),
                    'peak memory against FLOPs')
          + chart_img(plot_memory_breakdown(comparison), 'memory by policy'))
