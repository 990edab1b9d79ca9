"""The widgets' optional dependencies, checked where a widget is made.

The engine, the analysis and the static rendering (charts, tables, the
report) need neither ipywidgets nor anywidget; they come with the ``[lab]``
extra, and only the Explorer and its widgets import them.
"""

from __future__ import annotations

import importlib.util

LAB_PACKAGES = ('ipywidgets', 'anywidget')
INSTALL_HINT = "pip install 'remat_explorer[lab]'"


def require_lab(feature: str) -> None:
  """Raise a one-line ImportError naming what `feature` needs, before any
  work, when the widget packages are not installed."""
  missing = [name for name in LAB_PACKAGES if not _installed(name)]
  if missing:
    raise ImportError(f'{feature} needs {" and ".join(missing)}, which come with the '
                      f'lab extra: {INSTALL_HINT}')


def _installed(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False
