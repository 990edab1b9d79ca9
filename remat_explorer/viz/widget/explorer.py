"""``explore(f, *args)``: the interactive Explorer, a thin layer of ipywidgets.

The widget only wires controls to the analysis (which caches its results)
and to the pure rendering functions. Compiles (and the figures drawn from
them) run on worker threads behind a progress line, so the notebook stays
responsive; their results are applied to the widgets on the main thread
(``_work``). A view whose figures are being recomputed is greyed and
labelled until they arrive; an error is shown in the widget and the
previous views stay.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax

from remat_explorer.analysis import (DEFAULT_LOWERING, LOWERINGS, NO_REMAT, analyze,
                                     compile_costs, estimate_costs, TraceSettings,
                                     check_keywords, check_positions, donated_positions)
from remat_explorer.viz.widget import _panels
from remat_explorer.viz.widget._comparison import ComparisonTab
from remat_explorer.viz.widget._panels import (STALE, TABS, caption_html, error_text,
                                              warnings_html)
from remat_explorer.viz.widget._policy_controls import ALL_BLOCKS, PolicyControls
from remat_explorer.viz.widget._search import BudgetSearch
from remat_explorer.viz.widget._work import Work
from remat_explorer.viz.widget.notebook_output import ExplorerOutput, replace_in_cell
from remat_explorer.viz.charts.costs import plot_residuals_by_origin
from remat_explorer.viz.charts._figures import chart_img
from remat_explorer.viz.diagram.render import render_diagram
from remat_explorer.viz.widget.lab import require_lab
from remat_explorer.viz.html.snapshot import compiled_figures, snapshot_html
from remat_explorer.viz.text import html_text
from remat_explorer.viz.diagram.split_graph import split_graph
from remat_explorer.viz.html.tables import (RESIDUAL_SORT_KEYS, report_jaxprs_html,
                                       residual_table_html)


def explore(f, *args, argnums=0, has_aux=False, donate_argnums=(), **kwargs):
  """Open the Explorer on `f` at `args`.

  `argnums` and `has_aux` mean what they mean for ``jax.value_and_grad``:
  with ``has_aux=True``, `f` returns ``(loss, aux)`` and only the loss is
  differentiated, in every view. `donate_argnums` means what it means for
  ``jax.jit``: every step the views compile or estimate donates those
  arguments, as a training step jitted with them does.

  `f` may also be a mapping from labels to functions of the same arguments,
  such as layouts of one long scan (``{'every': f0, 'sqrt': f1}``): a
  "layout" control picks the one shown, and the Compare tab compiles each
  as written, side by side.

  It needs ipywidgets and anywidget (the ``[lab]`` extra); outside a
  notebook front end that runs widgets it displays as static HTML.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> explorer = rx.explore(loss_fn, *args)  # a notebook cell's last line shows it
    >>> explorer.policy.value, explorer.block.options
    ('as written', ('all blocks', 'layer'))
    >>> explorer.stop()
  """
  _layouts(f)
  check_keywords(explore, f, kwargs, argnums=argnums, has_aux=has_aux,
                 donate_argnums=donate_argnums)
  return Explorer(f, *args, argnums=argnums, has_aux=has_aux,
                  donate_argnums=donate_argnums, **kwargs)


def _layouts(f) -> dict | None:
  """`f` as a dict of labelled functions, or None for one function."""
  if not isinstance(f, Mapping):
    if not callable(f):
      raise TypeError('explore takes a function (or a mapping from labels to functions) '
                      f'as its first argument, not {type(f).__name__}: explore(loss_fn, *args).')
    return None
  if not f:
    raise ValueError('explore got an empty mapping; pass {label: function, ...} with '
                     'one function per layout, or a single function.')
  for label, fn in f.items():
    if not isinstance(label, str) or not callable(fn):
      raise TypeError('explore takes a function or a mapping from labels (str) to '
                      f'functions, but the mapping maps {label!r} to {type(fn).__name__}.')
  return dict(f)


class Explorer:
  """Controls: policy (the program as written first, and selected), names,
  lowering, block (a block picked gets the policy picked for it alone), a
  policy expression, "copy as code", memory budget (with the bytes it
  stands for) and the policy search. Tabs: the split diagram (pan, zoom; a click on a collapsed
  call opens it), residual table, compiled costs (with the memory timeline
  and what is live at its peak), policy comparison, jaxprs. A program that
  cannot be analyzed as written still opens, with the error shown.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> explorer = rx.Explorer(loss_fn, *args)
    >>> explorer.policy.value = 'dots_saveable'  # as a click on the control does
    >>> explorer.current_report().policy
    'dots_saveable'
    >>> explorer.stop()
  """

  def __init__(self, f, *args, argnums=0, has_aux=False, donate_argnums=(), **kwargs):
    self.layouts = _layouts(f)
    # Bad options raise here, before anything is traced; a program that
    # cannot be analyzed opens with its error shown.
    check_keywords(Explorer, f, kwargs, argnums=argnums, has_aux=has_aux,
                   donate_argnums=donate_argnums)
    check_positions(argnums, len(args), 'argnums')
    donate = donated_positions(donate_argnums, args)
    require_lab('The Explorer')
    import ipywidgets as w
    self._function = None if self.layouts else f
    # Every view's analysis gets the function's own keywords and `has_aux`;
    # its compiles, estimates, comparisons and searches, the donations too.
    self.args, self.kwargs, self.argnums = args, dict(kwargs, has_aux=has_aux), argnums
    self.step_kwargs = dict(self.kwargs, donate_argnums=donate)
    # Layouts of one computation (functions of the same arguments): the
    # control picks the function every view analyzes.
    self.layout = w.Dropdown(options=list(self.layouts or ()), description='layout',
                             layout=w.Layout(display='' if self.layouts else 'none'))
    # Work on other threads takes the mesh and lowering strategy of the code
    # that opened the Explorer with it.
    self._settings = TraceSettings.current()
    self._work = Work(on_tasks=self._show_tasks, on_error=self._show_error,
                      context=self._settings.entered)
    replace_in_cell(self)
    first = self._first_analysis()
    # The program as written comes first, and opens: the policies the
    # user wrote, before any other.
    self.controls = PolicyControls(first, self.refresh)
    self.policy, self.names_select = self.controls.policy, self.controls.names_select
    self.block = self.controls.block
    self.search_result = None
    self._generation = 0
    self._compiled_generation = -1
    self._expanded: set[str] = set()
    self._drawn_block = self.block.value  # node ids are per drawing
    # What the snapshot of the view shown is drawn from: the analysis (or
    # its error), then the compiled costs (or the compile's error).
    self._snapshot: dict = {}
    self._snapshot_costs: dict = {}
    # The residual chart of the report last drawn, with that report: picking
    # a block or sorting the table redraws the views of the same (cached)
    # report, and drawing the chart's PNG took most of that. It is drawn
    # only while its tab is open (or once it is opened): a policy changed
    # with another tab open redrew a chart no one saw, 0.13 s each time.
    self._residual_chart: tuple[object, str] = (None, '')
    self._residuals_shown = None  # the report the residual table shows

    self.lowering = w.Dropdown(options=list(LOWERINGS), value=DEFAULT_LOWERING,
                               description='lowering')
    self._budget = BudgetSearch(self)
    self.budget, self.budget_note = self._budget.slider, self._budget.note
    self.search_button, self.search_note = self._budget.button, self._budget.found
    self._comparison = ComparisonTab(self)
    tab = self._comparison
    self.compare_button, self.compare_view, self.pareto_pick = tab.button, tab.view, tab.pick
    self.progress = w.HTML()
    self.error = w.HTML()

    self._build_tabs()
    self._wire()
    self._lay_out()
    self._output = ExplorerOutput(self, self.widget)
    self.refresh()
    self._budget.learn_range()

  def _build_tabs(self) -> None:
    """The tabs and what each shows: the split diagram, the residuals, the
    compiled costs, the comparison, the jaxprs."""
    import ipywidgets as w

    from remat_explorer.viz.widget.html_widget import HtmlView
    from remat_explorer.viz.widget.viewer_widget import DiagramViewer
    self.split_note = w.HTML()
    self.diagram = DiagramViewer(layout=w.Layout(width='100%'))
    self.split_view = w.VBox([self.split_note, self.diagram])
    self.residual_view = w.HTML()
    self.sort_by = w.Dropdown(options=list(RESIDUAL_SORT_KEYS), value='bytes',
                              description='sort by')
    self.costs_view = HtmlView()
    # While a compile runs: the figures estimated from the jaxpr, marked so.
    self.estimate_view = w.HTML()
    self.estimate_view.add_class(_panels.ESTIMATE)
    # Marked while a compile runs: in a box, whose classes reach the page
    # (an anywidget's own do not follow changes after it is shown).
    self.costs_tab = w.VBox([self.estimate_view, self.costs_view])
    self.program_view = w.HTML()
    self.tabs = w.Tab(children=[
        self.split_view, w.VBox([self.sort_by, self.residual_view]), self.costs_tab,
        w.VBox([self.compare_button, self.compare_view, self.pareto_pick]),
        self.program_view])
    for i, title in enumerate(TABS):
      self.tabs.set_title(i, title)

  def _wire(self) -> None:
    """What each control's change redraws or starts."""
    self.lowering.observe(lambda _: self.refresh(), names='value')
    self.layout.observe(self._layout_changed, names='value')
    self.sort_by.observe(lambda _: self._render_residuals(self.current_report()),
                         names='value')
    self.tabs.observe(self._tab_opened, names='selected_index')
    # Another lowering's budget ends are compiled once the budget is used there.
    self.lowering.observe(lambda _: self._budget.show(), names='value')
    self.diagram.observe(self._node_clicked, names='click_count')

  def _lay_out(self) -> None:
    """The controls in rows above the tabs."""
    import ipywidgets as w
    c = self.controls
    for control in (self.layout, c.policy, self.names_select, self.lowering, self.block,
                    c.expression, c.per_block, c.reset, self.budget, self.search_button,
                    self.compare_button, self.sort_by, self.pareto_pick):
      control.add_class(_panels.KERNEL_CONTROL)
    self.widget = w.VBox([
        w.HTML(_panels.CSS), w.HTML(_panels.NEEDS_KERNEL_HTML),
        w.HBox([self.layout, self.controls.policy_row, self.names_select, self.lowering,
                self.block],
               layout=w.Layout(flex_flow='row wrap')),
        w.HBox([c.expression, c.expression_note, c.per_block, c.reset, c.copy],
               layout=w.Layout(flex_flow='row wrap', align_items='center')),
        w.HBox([self.budget, self.budget_note, self.search_button, self.progress],
               layout=w.Layout(flex_flow='row wrap')),
        self.search_note, self.error, self.tabs])
    # Class names for styling and for tests that look at the page.
    self.widget.add_class('remat-explorer')

  def _first_analysis(self):
    """The program's report as written, for its names and blocks; if that
    fails (a policy of the user's that raises, ...), under nothing_saveable
    (which replaces the program's policies); None if that fails too. The
    error itself shows when the views are drawn."""
    for policy in (None, jax.checkpoint_policies.nothing_saveable):
      try:
        with self._settings.entered():
          return analyze(self.f, *self.args, policy=policy, argnums=self.argnums,
                         **self.kwargs)
      except Exception:  # refresh() analyzes again and shows the error
        continue
    return None

  # -- what the controls say ---------------------------------------------------

  @property
  def comparison(self):
    """The last comparison the Compare tab shows (``Comparison``), or None."""
    return self._comparison.comparison

  @property
  def f(self):
    """The function the views analyze: the one given, or the chosen layout."""
    return self.layouts[self.layout.value] if self.layouts else self._function

  @property
  def policies(self) -> dict:
    """The policy options, by label."""
    return self.controls.policies

  def current_policy(self):
    """The choice the views show: a policy, or ``{block: policy}``."""
    return self.controls.choice()

  def current_report(self):
    with self._settings.entered():
      return analyze(self.f, *self.args, policy=self.current_policy(),
                     lowering=self.lowering.value, argnums=self.argnums, **self.kwargs)

  def current_block(self) -> str | None:
    return None if self.block.value == ALL_BLOCKS else self.block.value

  # -- views ---------------------------------------------------------------------

  def refresh(self) -> None:
    """Re-render the views for the current controls (analysis is cached);
    the compiled costs follow from a worker."""
    if self.block.value != self._drawn_block:
      self._expanded.clear()  # node ids are per drawing
      self._drawn_block = self.block.value
    self._generation += 1
    generation = self._generation
    try:
      report = self.current_report()
      self._render_analysis(report)
    except Exception as e:  # shown in the widget; the previous views stay
      context = (f'Could not analyze the program under {self.controls.label()} '
                 f'(lowering {self.lowering.value}); choose another policy or '
                 'lowering, or fix the program and explore it again')
      self._show_error(e, context)
      self._snapshot = dict(error=f'{context}: {error_text(e)}',
                            policy=self.controls.label(), lowering=self.lowering.value)
      self._snapshot_costs = {}
      self._output.changed()
      return
    self.error.value = ''
    self.controls.shown()
    self._comparison.mark()
    # The compile takes the controls as they are now; its result is dropped
    # if they have changed again by the time it ends.
    fn, policy, lowering = self.f, self.current_policy(), self.lowering.value
    shown = self.controls.label()
    label = f'{self.layout.value} · {shown}' if self.layouts else shown
    self.costs_tab.add_class(STALE)
    # A newer choice replaces a compile that has not started; the same
    # choice again joins the one under way (the label names the choice,
    # picked names and blocks' own policies included).
    self._work.start(f'compiling under {label} · lowering {lowering}',
                     lambda _: self._costs_html(fn, label, policy, lowering, report),
                     lambda compiled: self._show_costs(generation, *compiled),
                     lambda e: self._costs_failed(generation, e),
                     group='costs', key=(label, lowering))
    # The jaxpr's estimate, in a fraction of the compile's time, until the
    # compiled figures land; a failed estimate leaves the wait as it was.
    self._work.start(f'estimating under {label}',
                     lambda _: estimate_costs(fn, *self.args, policy=policy,
                                              lowering=lowering, argnums=self.argnums,
                                              **self.step_kwargs),
                     lambda estimate: self._show_estimate(generation, label, estimate),
                     lambda e: None, group='estimate', key=(label, lowering))

  def _shown(self, report) -> str:
    """What a caption says is shown: the layout (where there are several)
    and the report's policy, with any picked names, or the blocks given
    their own policy."""
    policy = self.controls.label() if self.controls.own else report.policy
    return f'{self.layout.value} · {policy}' if self.layouts else policy

  def _render_analysis(self, report) -> None:
    digraph = split_graph(report, block=self.current_block(), expand=self._expanded)
    diagram = render_diagram(digraph)
    device = _panels.device_text(report)
    self.split_note.value = (caption_html(self._shown(report), report.lowering, device, 'split')
                             + warnings_html(report.warnings) + diagram.notes_html)
    self.diagram.svg = diagram.svg
    self._render_residuals(report)
    self.program_view.value = (caption_html(self._shown(report), report.lowering, device,
                                            'jaxprs')
                               + report_jaxprs_html(report))
    self._snapshot = dict(report=report, policy=self._shown(report), digraph=digraph)
    self._snapshot_costs = {}  # not compiled yet
    self._output.changed()

  def _render_residuals(self, report) -> None:
    caption = caption_html(self._shown(report), report.lowering, _panels.device_text(report),
                           'residuals')
    self._residuals_shown, chart = report, ''
    if self._tab_is_open('Residuals'):
      if self._residual_chart[0] is not report:
        self._residual_chart = (report, chart_img(plot_residuals_by_origin(report),
                                                  'residual bytes by origin'))
      chart = self._residual_chart[1]
    self.residual_view.value = (
        f'{caption}{warnings_html(report.warnings)}<div class="remat-residuals">'
        f'{residual_table_html(report, sort_by=self.sort_by.value)}</div>' + chart)

  def _tab_opened(self, change) -> None:
    """The charts of a tab, drawn once it is open: the residual chart of the
    report the table shows (``_render_residuals``), the comparison's."""
    if change['new'] == TABS.index('Residuals') and self._residuals_shown is not None:
      self._render_residuals(self._residuals_shown)
    elif change['new'] == TABS.index('Compare'):
      self._comparison.opened()

  def _tab_is_open(self, title: str) -> bool:
    """Whether the tab of that title (one of ``TABS``) is the one shown."""
    return self.tabs.selected_index == TABS.index(title)

  def _costs_html(self, fn, label, policy, lowering, report) -> tuple[str, dict]:
    """On a worker: compile `fn` under `policy` and under no remat; the
    Costs tab drawn with them, and what the snapshot draws of them."""
    costs = compile_costs(fn, *self.args, policy=policy, lowering=lowering,
                          argnums=self.argnums, **self.step_kwargs)
    baseline = compile_costs(fn, *self.args, policy=NO_REMAT, argnums=self.argnums,
                             **self.step_kwargs)
    # The flag and the timeline read once, drawn twice.
    figures = None if costs.failed else compiled_figures(report, costs, baseline)
    return (_panels.costs_html(label, lowering, costs, baseline, report, figures),
            dict(costs=costs, baseline=baseline, figures=figures))

  def _show_costs(self, generation, html, snapshot_costs) -> None:
    if generation != self._generation:
      return  # a newer compile is under way; the view stays marked
    self.costs_view.value = html
    self._snapshot_costs = snapshot_costs
    self._output.changed()
    self.estimate_view.value = ''
    self._compiled_generation = generation
    self.costs_tab.remove_class(STALE)

  def _show_estimate(self, generation, label, estimate) -> None:
    if generation == self._generation and self._compiled_generation != generation:
      self.estimate_view.value = _panels.estimate_html(label, estimate)

  def _costs_failed(self, generation, e) -> None:
    self._show_error(e)
    if generation == self._generation:
      self.estimate_view.value = ''
      self.costs_tab.remove_class(STALE)  # nothing is coming
      self._snapshot_costs = dict(error=f'Compile failed: {error_text(e)}')
      self._output.changed()

  # -- the search -------------------------------------------------------------------

  def _searched(self, result) -> None:
    """Show what the search found; if it fits, select its policy (once in
    the options: a built-in, or one found before, is selected, not added)
    and add it to the comparison."""
    self.search_result = result
    self.search_note.value = _panels.search_html(result)
    self._output.changed()
    if not result.fits:
      return
    option = self.controls.add(result.label, result.policy)
    self.controls.searched_sources = {option: result.to_source()}
    self.controls.select(option)
    if self.comparison is not None:
      self._comparison.run()

  def _layout_changed(self, _) -> None:
    self._expanded.clear()
    try:
      with self._settings.entered():
        first = analyze(self.f, *self.args, argnums=self.argnums, **self.kwargs)
    except Exception:  # refresh() shows the error
      first = None
    self.controls.set_blocks(first)
    self.refresh()
    self._budget.show()

  def _node_clicked(self, _) -> None:
    """A click on a closed group (a module or function) or call (scan,
    cond, jit, nested remat) opens it, a click on an opened one's cluster
    closes it; other nodes draw the same."""
    node = self.diagram.clicked
    before = set(self._expanded)
    self._expanded ^= {node}
    try:
      diagram = render_diagram(split_graph(self.current_report(), block=self.current_block(),
                                           expand=self._expanded))
    except Exception as e:
      self._expanded = before
      self._show_error(e)
      return
    if diagram.svg == self.diagram.svg:
      self._expanded = before  # not a call: nothing to open
    else:
      self.diagram.svg = diagram.svg

  # -- plumbing --------------------------------------------------------------------

  def stop(self) -> None:
    """Stop this Explorer's background work: what waits is dropped, what
    runs ends unseen (a compile under way finishes on its thread). Running
    the cell that made it again does this."""
    self._work.stop()

  def wait(self, timeout: float | None = None) -> None:
    """Block until all background work (compiles, the comparison, a search
    and what it starts) is done and shown; for scripts and tests. `timeout`
    bounds the whole wait: past it, ``TimeoutError``."""
    self._work.wait(timeout)
    self._output.publish()

  def _snapshot_html(self) -> str:
    """The static snapshot of what the Explorer shows (``snapshot_html``):
    the view's analysis, its compiled costs once compiled, the last search
    and comparison. Its diagram is an image, where a click opens nothing:
    drawn again worded so (a second `dot` run)."""
    analysis = dict(self._snapshot)
    digraph = analysis.pop('digraph', None)
    if digraph is not None:
      analysis['diagram'] = render_diagram(digraph.as_image())
    compared = None
    if self.comparison is not None:
      compared = (f'<p class="remat-caption">lowering {html_text(self._comparison.lowering)}'
                  f'</p>{self.compare_view.value}')
    search = self.search_note.value if self.search_result is not None else None
    costs = dict(self._snapshot_costs)
    error = ' · '.join(e for e in (analysis.pop('error', None), costs.pop('error', None)) if e)
    return snapshot_html(**analysis, **costs, error=error or None, search=search,
                         comparison=compared)

  def _show_tasks(self, tasks) -> None:
    self.progress.value = _panels.progress_html(tasks)

  def _show_error(self, e: Exception, context: str = '') -> None:
    message = error_text(e)
    self.error.value = _panels.error_html(f'{context}: {message}' if context else message)

  def _repr_mimebundle_(self, **kwargs):
    # Front ends that run widgets show the widget; the others (an untrusted
    # notebook, a notebook viewer, nbconvert) the static snapshot.
    return self._output.bundle(**kwargs)

  def _ipython_display_(self) -> None:
    # Shown in a notebook: the widget, then the snapshot as an output of
    # its own, which follows the Explorer (``notebook_output``).
    self._output.display()
