"""The memory budget as a widget: a labelled range input (anywidget), where
ipywidgets' slider has no accessible name (its handle is a ``div`` that no
label names).

``value`` is the share, from 0 to 1, between the lowest and the highest
compiled peak the Explorer knows (``_search.py`` turns it into bytes).
"""

from __future__ import annotations

from pathlib import Path

from remat_explorer.viz.widget.lab import require_lab

require_lab('The budget slider')

import anywidget  # noqa: E402
import traitlets  # noqa: E402

_CSS = """
.remat-budget-slider { display: flex; align-items: center; gap: 0.5em; font-size: 13px; }
.remat-budget-slider input[type=range] { width: 12em; }
.remat-budget-slider output { min-width: 3em; }
"""


class BudgetSlider(anywidget.AnyWidget):
  _esm = (Path(__file__).with_name('budget_slider.js')).read_text(encoding='utf-8')
  _css = _CSS
  value = traitlets.Float(0.5).tag(sync=True)
  step = traitlets.Float(0.05).tag(sync=True)
  description = traitlets.Unicode('budget').tag(sync=True)

  @traitlets.validate('value')
  def _within(self, proposal):
    value = proposal['value']
    if not 0.0 <= value <= 1.0:
      raise traitlets.TraitError(f'the budget is a share from 0 to 1, got {value!r}')
    return value
