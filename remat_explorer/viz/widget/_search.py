"""The Explorer's memory budget and policy search: the slider with the bytes
it stands for, the search button, and what the search found.

The slider spans every compiled peak the Explorer knows before a search:
from the lowest to the highest of nothing_saveable's, everything_saveable's,
the program as written and the program without remat (the last two may lie
outside the first two). They are compiled in the background when the
Explorer opens, and for another lowering or layout once the budget is used
there (the slider moved, a search run): four compiles nobody asked for on
every change of lowering would be minutes on a large model. They are the
very compiles the search then finds cached; once they are known the search
is given the budget in bytes, as the note beside the slider shows it. The search runs on a worker; its result goes to the Explorer
(``Explorer._searched``), which selects and compares its policy.
"""

from __future__ import annotations

import jax

from remat_explorer.analysis import NO_REMAT, compile_costs, search_policy
from remat_explorer.viz.widget import _panels

# The policies whose compiled peaks the slider spans, by label.
_ENDS = {'nothing_saveable': jax.checkpoint_policies.nothing_saveable,
         'everything_saveable': jax.checkpoint_policies.everything_saveable,
         'as written': None, 'no remat': NO_REMAT}


class BudgetSearch:
  """The budget controls of `explorer` (its program, lowering control and
  background work)."""

  def __init__(self, explorer):
    import ipywidgets as w
    self.explorer = explorer
    self.ends: dict[tuple, tuple[int, int]] = {}
    """(the lowest compiled peak known, the highest) by (layout, lowering)."""
    from remat_explorer.viz.widget.budget_slider import BudgetSlider
    self.slider = BudgetSlider(value=0.5)
    self.note = w.HTML()
    # Its own width, never less: a crowded row wraps rather than cut its label.
    self.button = w.Button(description='search policy',
                           layout=w.Layout(width='auto', flex='0 0 auto'))
    self.found = w.HTML()
    self._learning: set[tuple] = set()  # keys whose ends are being compiled
    self.note.add_class('remat-budget')
    self.found.add_class('remat-search')
    self.slider.observe(lambda _: self.learn_range(), names='value')
    self.button.on_click(lambda _: self.search())

  def _options(self, lowering) -> dict:
    x = self.explorer
    return dict(x.step_kwargs, argnums=x.argnums, lowering=lowering)

  def _key(self) -> tuple:
    x = self.explorer
    return (x.layout.value if x.layouts else None, x.lowering.value)

  def learn_range(self) -> None:
    """Compile the slider's ends under the current lowering and layout,
    once."""
    key, lowering = self._key(), self.explorer.lowering.value
    if key not in self.ends and key not in self._learning:
      self._learning.add(key)
      self._compile_ends(key, lowering)
    self.show()

  def _compile_ends(self, key, lowering) -> None:
    x = self.explorer
    fn = x.f

    def run(progress):
      peaks = []
      for i, (label, policy) in enumerate(_ENDS.items()):
        progress(i, len(_ENDS), label)
        costs = compile_costs(fn, *x.args, policy=policy, **self._options(lowering))
        if not costs.failed:  # one that fails is no end
          peaks.append(costs.peak_bytes)
      if not peaks:
        raise RuntimeError('none of ' + ', '.join(_ENDS) + ' compiled')
      return min(peaks), max(peaks)

    def learned(peaks):
      self.ends[key] = peaks
      self._learning.discard(key)
      self.show()

    def failed(e):
      self._learning.discard(key)
      self.note.value = _panels.error_html(f'budget in bytes unknown: {_panels.error_text(e)}')
    x._work.start(f"compiling the budget's ends · lowering {lowering}", run, learned, failed)

  def show(self) -> None:
    key = self._key()
    self.note.value = _panels.budget_html(self.slider.value, self.ends.get(key),
                                          compiling=key in self._learning)

  def search(self) -> None:
    x = self.explorer
    budget, lowering = self.slider.value, x.lowering.value
    within = _panels.budget_text(budget, self.ends.get(self._key()))

    ends = self.ends.get(self._key())
    # In bytes once the slider's ends are known: its range is wider than the
    # fraction search_policy takes (nothing_saveable to everything_saveable).
    memory_budget = budget if ends is None else max(1, _panels.budget_bytes(budget, ends))

    def run(progress):
      # The search counts its built-in policies, then prices and verifies
      # choices as long as it needs: no total there.
      return search_policy(x.f, *x.args, memory_budget=memory_budget, progress=progress,
                           **self._options(lowering))

    def failed(e):
      self.found.value = _panels.error_html(
          f'The search within {within} failed: {_panels.error_text(e)}')
    self.found.value = ''
    x._work.start(f'searching for a policy within {within}', run, x._searched, failed)
