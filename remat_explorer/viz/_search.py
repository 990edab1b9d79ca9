"""The Explorer's memory budget and policy search: the slider with the bytes
it stands for, the search button, and what the search found.

The slider is a fraction of the way from nothing_saveable's compiled peak to
everything_saveable's, as ``search_policy`` takes it; both are compiled in
the background when the Explorer opens (and for each lowering), the very
compiles the search then finds cached, so that the bytes show beside the
fraction. The search runs on a worker; its result goes to the Explorer
(``Explorer._searched``), which selects and compares its policy.
"""

from __future__ import annotations

import jax

from remat_explorer.analysis import compile_costs, search_policy
from remat_explorer.analysis.policy_info import describe_policy
from remat_explorer.viz import _panels

_ENDS = (jax.checkpoint_policies.nothing_saveable, jax.checkpoint_policies.everything_saveable)


class BudgetSearch:
  """The budget controls of `explorer` (its program, lowering control and
  background work)."""

  def __init__(self, explorer):
    import ipywidgets as w
    self.explorer = explorer
    self.ends: dict[str, tuple[int, int]] = {}
    """(nothing_saveable's peak, everything_saveable's) by lowering."""
    self.slider = w.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.05,
                                description='budget', readout_format='.0%')
    self.note = w.HTML()
    self.button = w.Button(description='search policy', layout=w.Layout(width='auto'))
    self.found = w.HTML()
    self.note.add_class('remat-budget')
    self.found.add_class('remat-search')
    self.slider.observe(lambda _: self.show(), names='value')
    self.button.on_click(lambda _: self.search())

  def _options(self, lowering) -> dict:
    x = self.explorer
    return dict(x.kwargs, argnums=x.argnums, lowering=lowering)

  def learn_range(self) -> None:
    """Compile the slider's ends under the current lowering, once."""
    lowering = self.explorer.lowering.value
    self.show()
    if lowering in self.ends:
      return
    x = self.explorer

    def run(progress):
      peaks = []
      for i, policy in enumerate(_ENDS):
        progress(i, len(_ENDS), describe_policy(policy))
        costs = compile_costs(x.f, *x.args, policy=policy, **self._options(lowering))
        if costs.failed:
          raise RuntimeError(f'{describe_policy(policy)} did not compile: {costs.error}')
        peaks.append(costs.peak_bytes)
      return tuple(peaks)

    def learned(peaks):
      self.ends[lowering] = peaks
      self.show()

    def failed(e):
      self.note.value = _panels.error_html(f'budget in bytes unknown: {_panels.error_text(e)}')
    x._work.start(f"compiling the budget's ends · lowering {lowering}", run, learned, failed)

  def show(self) -> None:
    self.note.value = _panels.budget_html(
        self.slider.value, self.ends.get(self.explorer.lowering.value))

  def search(self) -> None:
    x = self.explorer
    budget, lowering = self.slider.value, x.lowering.value
    within = _panels.budget_text(budget, self.ends.get(lowering))

    def run(progress):
      # The search counts its built-in policies, then prices and verifies
      # choices as long as it needs: no total there.
      return search_policy(x.f, *x.args, memory_budget=budget, progress=progress,
                           **self._options(lowering))

    def failed(e):
      self.found.value = _panels.error_html(
          f'The search within {within} failed: {_panels.error_text(e)}')
    self.found.value = ''
    x._work.start(f'searching for a policy within {within}', run, x._searched, failed)
