"""``explore(f, *args)``: the interactive Explorer, a thin layer of ipywidgets.

The widget only wires controls to the analysis (which caches its results)
and to the pure rendering functions. Anything that compiles runs in a
background thread behind a progress bar, so the notebook stays responsive;
an error is shown in the widget and the previous views stay.
"""

from __future__ import annotations

import html
import re
import threading
import traceback

from remat_explorer.analysis import (NO_REMAT, analyze, builtin_policies, compare,
                                     compile_costs, search_policy)
from remat_explorer.analysis.compare import recompute_eliminated
from remat_explorer.analysis.context import TraceSettings
from remat_explorer.engine.lowering import DEFAULT_STRATEGY, STRATEGIES
from remat_explorer.engine.policies import checkpoint_policies
from remat_explorer.viz.charts import (plot_memory_breakdown, plot_memory_timeline,
                                       plot_pareto, plot_residuals_by_origin)
from remat_explorer.viz.embed import chart_img, inline_svg
from remat_explorer.viz.split_graph import split_graph
from remat_explorer.viz.tables import (RESIDUAL_SORT_KEYS, comparison_table_html,
                                       report_jaxprs_html, residual_table_html)
from remat_explorer.viz.text import MISSING, format_bytes, format_flops, format_seconds

TABS = ('Split diagram', 'Residuals', 'Costs', 'Compare', 'Program')
_NAMED = 'save_only_these_names (pick names)'
_SHRINK_TO_FIT_PT = 2000


def explore(f, *args, argnums=0, **kwargs):
  """Open the Explorer on `f` at `args`.

  Without ipywidgets (or outside a notebook front end that runs them) the
  result still displays: as static HTML of the split and the residuals.
  """
  try:
    import ipywidgets  # noqa: F401
  except ImportError:
    return StaticView(analyze(f, *args, argnums=argnums, **kwargs))
  return Explorer(f, *args, argnums=argnums, **kwargs)


class StaticView:
  """The split diagram and residual table of one report, as HTML."""

  def __init__(self, report):
    self.report = report

  def _repr_html_(self) -> str:
    return _split_html(split_graph(self.report)) + residual_table_html(self.report)


class Explorer:
  """Controls: policy, names, lowering, block, memory budget. Tabs: the split
  diagram, residual table, compiled costs, policy comparison, jaxprs."""

  def __init__(self, f, *args, argnums=0, **kwargs):
    import ipywidgets as w
    self.f, self.args, self.kwargs, self.argnums = f, args, kwargs, argnums
    # Widget callbacks and compiles run outside the code that opened the
    # Explorer: they take its mesh and lowering strategy with them.
    self._settings = TraceSettings.current()
    first = analyze(f, *args, argnums=argnums, **kwargs)
    self.names = first.names_in_program
    self.policies = dict(builtin_policies())
    self.comparison = None
    self.search_result = None
    self._generation = 0
    self._threads: list[threading.Thread] = []
    self._running = 0
    self._lock = threading.Lock()

    options = list(self.policies) + ([_NAMED] if self.names else [])
    self.policy = w.Dropdown(options=options, value='nothing_saveable',
                             description='policy')
    self.names_select = w.SelectMultiple(options=self.names, value=self.names[:1],
                                         description='names', rows=min(6, len(self.names) or 1),
                                         layout=w.Layout(display='none'))
    self.lowering = w.Dropdown(options=list(STRATEGIES), value=DEFAULT_STRATEGY,
                               description='lowering')
    blocks = ['all blocks'] + [b.name for b in first.blocks]
    self.block = w.Dropdown(options=blocks, value='all blocks', description='block',
                            layout=w.Layout(display='' if len(blocks) > 2 else 'none'))
    self.budget = w.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.05,
                                description='budget', readout_format='.0%')
    self.search_button = w.Button(description='search policy')
    self.compare_button = w.Button(description='compare all policies')
    self.progress = w.IntProgress(value=0, min=0, max=1, description='',
                                  layout=w.Layout(visibility='hidden'))
    self.status = w.HTML()
    self.error = w.HTML()

    self.split_view = w.HTML()
    self.residual_view = w.HTML()
    self.sort_by = w.Dropdown(options=list(RESIDUAL_SORT_KEYS), value='bytes',
                              description='sort by')
    self.costs_view = w.HTML()
    self.compare_view = w.HTML('<p>Press “compare all policies” to compile the '
                               'gradient under every policy.</p>')
    self.pareto_pick = w.ToggleButtons(options=[], description='select')
    self.program_view = w.HTML()
    self.tabs = w.Tab(children=[
        self.split_view, w.VBox([self.sort_by, self.residual_view]), self.costs_view,
        w.VBox([self.compare_button, self.compare_view, self.pareto_pick]),
        self.program_view])
    for i, title in enumerate(TABS):
      self.tabs.set_title(i, title)

    for control in (self.policy, self.names_select, self.lowering, self.block):
      control.observe(lambda _: self.refresh(), names='value')
    self.sort_by.observe(lambda _: self._render_residuals(self.current_report()),
                         names='value')
    self.search_button.on_click(lambda _: self._in_background(self._search))
    self.compare_button.on_click(lambda _: self._in_background(self._compare))
    self.pareto_pick.observe(self._pick_from_pareto, names='value')
    self.widget = w.VBox([
        w.HBox([self.policy, self.names_select, self.lowering, self.block]),
        w.HBox([self.budget, self.search_button, self.progress, self.status]),
        self.error, self.tabs])
    # Class names for styling and for tests that look at the page.
    self.widget.add_class('remat-explorer')
    self.policy.add_class('remat-policy')
    self.refresh()

  # -- what the controls say ---------------------------------------------------

  def current_policy(self):
    if self.policy.value == _NAMED:
      return checkpoint_policies.save_only_these_names(*self.names_select.value)
    return self.policies[self.policy.value]

  def current_report(self):
    with self._settings.entered():
      return analyze(self.f, *self.args, policy=self.current_policy(),
                     lowering=self.lowering.value, argnums=self.argnums, **self.kwargs)

  # -- views ---------------------------------------------------------------------

  def refresh(self) -> None:
    """Re-render the views for the current controls (analysis is cached)."""
    self.names_select.layout.display = '' if self.policy.value == _NAMED else 'none'
    try:
      report = self.current_report()
      block = None if self.block.value == 'all blocks' else self.block.value
      self.split_view.value = _split_html(split_graph(report, block=block))
      self._render_residuals(report)
      self.program_view.value = report_jaxprs_html(report)
      self._show_warnings(report.warnings)
    except Exception as e:  # shown in the widget; the previous views stay
      self._show_error(e)
      return
    # The compile runs behind the controls: it takes what they say now, and
    # its result is dropped if they have changed again by the time it ends.
    with self._lock:
      self._generation += 1
      generation = self._generation
    label, policy, lowering = self.policy.value, self.current_policy(), self.lowering.value
    self._in_background(lambda: self._costs(generation, label, policy, lowering, report))

  def _render_residuals(self, report) -> None:
    self.residual_view.value = (
        f'<div class="remat-residuals">'
        f'{residual_table_html(report, sort_by=self.sort_by.value)}</div>'
        + chart_img(plot_residuals_by_origin(report), 'residual bytes by origin'))

  def _costs(self, generation, label, policy, lowering, report):
    self._progress(0, 1, f'compiling under {label}')
    costs = compile_costs(self.f, *self.args, policy=policy, lowering=lowering,
                          argnums=self.argnums, **self.kwargs)
    baseline = compile_costs(self.f, *self.args, policy=NO_REMAT, argnums=self.argnums,
                             **self.kwargs)
    if generation != self._generation:
      return
    self.costs_view.value = _costs_html(label, costs, baseline, report)

  def _compare(self):
    self.comparison = compare(self.f, *self.args, lowering=self.lowering.value,
                              argnums=self.argnums, progress=self._progress, **self.kwargs)
    self._render_comparison()

  def _render_comparison(self):
    comparison = self.comparison
    self.compare_view.value = (
        comparison_table_html(comparison)
        + chart_img(plot_pareto(comparison, selected=self.policy.value,
                           search_result=self.search_result))
        + chart_img(plot_memory_breakdown(comparison)))
    self.pareto_pick.options = [r.label for r in comparison.rows if not r.failed]
    self._show_warnings(comparison.warnings)

  def _search(self):
    result = search_policy(self.f, *self.args, memory_budget=self.budget.value,
                           argnums=self.argnums, lowering=self.lowering.value,
                           progress=self._progress, **self.kwargs)
    self.search_result = result
    label = result.label
    self.policies[label] = result.policy
    self.policy.options = [*self.policy.options[:-1], label, self.policy.options[-1]] \
        if self.policy.options[-1] == _NAMED else [*self.policy.options, label]
    self.policy.value = label
    if self.comparison is not None:
      self._render_comparison()

  def _pick_from_pareto(self, change):
    label = change['new']
    if label and label in self.policy.options:
      self.policy.value = label
    elif label and self.comparison is not None:
      self.policies[label] = self.comparison.row(label).policy
      self.policy.options = [*self.policy.options, label]
      self.policy.value = label

  # -- plumbing --------------------------------------------------------------------

  def _in_background(self, work) -> None:
    """Run `work` on a thread behind the progress bar, which stays up while
    any such work runs; an error is shown in the widget."""
    def run():
      try:
        with self._settings.entered():
          work()
      except Exception as e:
        self._show_error(e)
      finally:
        with self._lock:
          self._running -= 1
          if not self._running:
            self.progress.layout.visibility = 'hidden'
            self.status.value = ''
    thread = threading.Thread(target=run, daemon=True)
    with self._lock:
      self._running += 1
      self.progress.layout.visibility = 'visible'
      self._threads = [t for t in self._threads if t.is_alive()] + [thread]
    thread.start()

  def wait(self, timeout: float | None = None) -> None:
    """Block until background work (compiles) is done; for scripts and tests."""
    while True:  # work may start more work (a search selects its policy)
      with self._lock:
        pending = [t for t in self._threads if t.is_alive()]
      if not pending:
        return
      for thread in pending:
        thread.join(timeout)
      if timeout is not None:
        return

  def _progress(self, i, n, label):
    if n is None:  # a total not known yet: say what runs, without a count
      self.status.value = html.escape(label)
      return
    self.progress.max = max(n, 1)
    self.progress.value = min(i, n)
    self.status.value = html.escape(f'{label} ({i}/{n})')

  def _show_error(self, e: Exception) -> None:
    message = ''.join(traceback.format_exception_only(type(e), e)).strip()
    self.error.value = f'<p class="error" style="color:#b00020">{html.escape(message)}</p>'

  def _show_warnings(self, warnings) -> None:
    self.error.value = ''.join(
        f'<p class="warning" style="color:#8a5a00">{html.escape(w)}</p>' for w in warnings)

  def _repr_mimebundle_(self, **kwargs):
    # Front ends that run widgets show the widget; the others (a notebook
    # viewer, nbconvert, a kernel-less reader) fall back to the static HTML
    # of what the widget shows when first displayed.
    bundle = dict(self.widget._repr_mimebundle_(**kwargs))
    bundle['text/html'] = self.split_view.value + self.residual_view.value
    return bundle


def _costs_html(label, costs, baseline, report) -> str:
  """The Costs tab: XLA's figures for `label` beside no remat's, the flag
  when the compiler merged the recompute away, and the memory timeline."""
  if costs.failed:
    return f'<p class="error">Compile failed: {html.escape(costs.error)}</p>'
  def both(value, formatter):
    return f'{value:,} ({formatter(value)})' if value is not None else MISSING
  rows = [('device', html.escape(costs.device_kind)),
          ('temp bytes', both(costs.temp_bytes, format_bytes)),
          ('peak bytes', both(costs.peak_bytes, format_bytes)),
          ('no-remat peak bytes',
           both(baseline.peak_bytes, format_bytes) if not baseline.failed else MISSING),
          ('XLA FLOPs', both(costs.xla_flops and int(costs.xla_flops), format_flops)),
          ('compile time', format_seconds(costs.compile_seconds))]
  table = ''.join(f'<tr><td>{k}</td><td>{v}</td></tr>' for k, v in rows)
  flag = recompute_eliminated(report, costs)
  note = f'<p class="warning" style="color:#8a5a00">{html.escape(flag)}</p>' if flag else ''
  timelines = {label: costs}
  if not baseline.failed:
    timelines['no remat'] = baseline
  caption = f'<caption>compiled under {html.escape(label)}</caption>'
  return (f'<div class="remat-costs"><table>{caption}{table}</table>{note}'
          + chart_img(plot_memory_timeline(timelines), 'memory timeline') + '</div>')


def _split_html(graph) -> str:
  svg = inline_svg(graph)
  # A diagram up to about twice the notebook's width is shrunk to fit; a
  # larger one scrolls instead, since shrinking it would make it unreadable.
  width = re.match(r'<svg width="([\d.]+)pt"', svg)
  if width and float(width.group(1)) <= _SHRINK_TO_FIT_PT:
    svg = '<svg style="max-width:100%;height:auto" ' + svg[len('<svg '):]
  return (f'<div class="remat-split" style="overflow:auto;max-height:85vh">'
          f'{svg}</div>')

