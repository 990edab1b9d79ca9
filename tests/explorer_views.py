"""What the Explorer's views show, read as its tests read them."""

import re


def costs_row(explorer, row: str) -> int:
  """The bytes the Costs tab shows in `row` (``temp bytes``, ...)."""
  found = re.search(rf'<td>{row}</td><td>([\d,]+) ', explorer.costs_view.value)
  assert found, explorer.costs_view.value
  return int(found.group(1).replace(',', ''))
