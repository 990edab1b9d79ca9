"""The Explorer's Compare tab: the button that compiles every policy (or
every layout, each as written) under the lowering shown, the table and
chart of what they cost, and the toggle that shows one of its rows in every
tab. The comparison runs on a worker; a search's policy joins it.
"""

from __future__ import annotations

from remat_explorer.analysis import compare
from remat_explorer.viz.widget import _panels
from remat_explorer.viz.widget._panels import OUTDATED, STALE


class ComparisonTab:
  """The Compare tab of `explorer` (its program, controls and background
  work)."""

  def __init__(self, explorer):
    import ipywidgets as w
    self.explorer = explorer
    self.comparison = None
    # The Pareto chart and memory by policy are drawn while the tab is open,
    # or once it is opened: a search joining the comparison with another tab
    # open redrew both unseen. What they mark (the row shown, the search).
    self._charts: str | None = None
    self._chart_choice: tuple = (None, None)
    self.lowering = None
    """The lowering the comparison shown was compiled under."""
    self.button = w.Button(
        description='compare all layouts' if explorer.layouts else 'compare all policies',
        layout=w.Layout(width='auto'))  # as wide as its text: never cut
    self.view = w.HTML('<p>Press “compare all policies” to compile the '
                       'gradient under every policy.</p>')
    self.pick = w.ToggleButtons(options=[], description='show',
                                tooltip='show this row in every tab',
                                style={'button_width': 'auto'})
    self._picking = False
    self.button.on_click(lambda _: self.run())
    self.pick.observe(self._picked, names='value')

  def run(self) -> None:
    """Compile every row under the lowering shown: the built-in policies and
    every choice tried (with the search's policy where it fits), or every
    layout as written."""
    x = self.explorer
    lowering, searched = x.lowering.value, x.search_result
    if x.layouts:  # each layout as written
      subject, policies, selected = x.layouts, None, x.layout.value
    else:
      subject, selected = x.f, x.controls.label()
      policies = x.controls.comparison_rows()  # the built-ins and every choice tried
      if searched is not None and searched.fits:  # the searched policy is a row too
        if not any(p is not None and p == searched.policy for p in policies.values()):
          policies[searched.label] = searched.policy
    self.view.add_class(STALE)

    def run(progress):
      comparison = compare(subject, *x.args, policies=policies, lowering=lowering,
                           argnums=x.argnums, progress=progress, **x.step_kwargs)
      # The charts are drawn here only if the tab is open (else once it is).
      charts = (_panels.comparison_charts_html(comparison, selected, searched)
                if self.is_open() else None)
      return comparison, (selected, searched), charts

    def show(result):
      self.comparison, self._chart_choice, self._charts = result
      self.lowering = lowering
      if self.is_open():  # perhaps opened while the comparison ran
        self.opened()
      else:
        self._show_view()
      self.view.remove_class(STALE)
      self.mark()
      x._output.changed()
      self._set_options([r.label for r in self.comparison.rows if not r.failed])

    def failed(e):
      x._show_error(e)
      self.view.remove_class(STALE)
    what = 'layouts' if x.layouts else 'policies'
    x._work.start(f'comparing {what} · lowering {lowering}', run, show, failed,
                  group='comparison',
                  key=(lowering, tuple(policies or ()), selected, id(searched)))

  def is_open(self) -> bool:
    return self.explorer._tab_is_open('Compare')

  def opened(self) -> None:
    """The tab is open: the comparison with its charts, drawn if they were
    not."""
    if self.comparison is None:
      return
    if self._charts is None:
      self._charts = _panels.comparison_charts_html(self.comparison, *self._chart_choice)
    self._show_view()

  def _show_view(self) -> None:
    self.view.value = (_panels.comparison_tables_html(self.comparison)
                       + (self._charts or ''))

  def mark(self) -> None:
    """Mark the comparison out of date while the lowering differs from its."""
    outdated = self.comparison is not None and self.lowering != self.explorer.lowering.value
    (self.view.add_class if outdated else self.view.remove_class)(OUTDATED)

  def _set_options(self, labels) -> None:
    # Setting the options selects one: that is no pick of the user's.
    x = self.explorer
    self._picking = True
    try:
      self.pick.options = labels
      shown = x.layout.value if x.layouts else x.controls.label()
      self.pick.value = shown if shown in labels else None
    finally:
      self._picking = False

  def _picked(self, change) -> None:
    label, x = change['new'], self.explorer
    if self._picking or not label:
      return
    if x.layouts:  # a row is a layout, as written
      x.layout.value = label
      x.controls.select(x.policy.options[0])
      return
    if label in x.policies:
      x.controls.select(label)
    elif self.comparison is not None:
      x.controls.select(label, self.comparison.row(label).policy)
