"""A saved notebook made ready to share: widget views without saved state
give way to the text beside them.

A notebook saved from a JupyterLab whose "Save Jupyter widget state in
notebooks" setting is off (its default) keeps each widget's view
(``application/vnd.jupyter.widget-view+json``) but not the widget's state.
Reopened, JupyterLab picks the view, finds no model to draw it from and
says "Error displaying widget: model not found", never falling back to the
output's other data. Dropping those views leaves each output with what
stands alone: its ``text/plain`` (an Explorer's says that its snapshot,
the output after it, stands for it). Views whose state the notebook holds
are kept: JupyterLab draws them from it.

Works on the notebook's JSON as saved (nbformat 4): nothing is executed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json'
WIDGET_STATE = 'application/vnd.jupyter.widget-state+json'


@dataclass(frozen=True)
class SharedNotebook:
  """What ``share_notebook`` did to one notebook."""
  dropped: int
  """Widget views dropped: their state was not saved."""
  kept: int
  """Widget views kept: JupyterLab draws them from the saved state."""
  bare: int
  """Dropped views whose output had nothing else to show but its
  ``text/plain`` (a widget other than an Explorer)."""


def saved_widget_ids(notebook: dict) -> set[str]:
  """The model ids whose state `notebook` holds in its metadata."""
  saved = notebook.get('metadata', {}).get('widgets', {}).get(WIDGET_STATE, {})
  return set(saved.get('state', {}))


def drop_unsaved_widget_views(notebook: dict) -> SharedNotebook:
  """Remove, in place, every widget view of `notebook`'s outputs whose
  model's state it does not hold."""
  saved = saved_widget_ids(notebook)
  dropped = kept = bare = 0
  for cell in notebook.get('cells', ()):
    for output in cell.get('outputs', ()):
      data = output.get('data')
      if not isinstance(data, dict) or WIDGET_VIEW not in data:
        continue
      view = data[WIDGET_VIEW]
      if isinstance(view, dict) and view.get('model_id') in saved:
        kept += 1
        continue
      del data[WIDGET_VIEW]
      dropped += 1
      bare += not any(kind != 'text/plain' for kind in data)
  return SharedNotebook(dropped=dropped, kept=kept, bare=bare)


def share_notebook(path: str | Path, out: str | Path | None = None) -> SharedNotebook:
  """Read the notebook at `path`, drop its widget views whose state was not
  saved (``drop_unsaved_widget_views``) and write it to `out` (default:
  in place). The notebook's signature, if any, no longer matches, so it
  opens untrusted until trusted again: its snapshots show either way."""
  path = Path(path)
  text = path.read_text(encoding='utf-8')
  try:
    notebook = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'{str(path)!r} is not a notebook (not JSON: {e})') from None
  if not isinstance(notebook, dict) or notebook.get('nbformat') != 4:
    raise ValueError(f'{str(path)!r} is not a notebook in nbformat 4')
  done = drop_unsaved_widget_views(notebook)
  # As Jupyter writes notebooks: one-space indent, UTF-8, a final newline.
  Path(out or path).write_text(
      json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=True) + '\n',
      encoding='utf-8')
  return done
