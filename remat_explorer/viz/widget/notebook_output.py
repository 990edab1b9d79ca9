"""The Explorer's output in a notebook: its widget, with a static snapshot.

One output carries both: the widget's view (``application/vnd.jupyter.
widget-view+json``) for front ends that run widgets, and the snapshot
(``viz.html.snapshot``) as ``text/html`` for those that do not: an
untrusted notebook, a notebook viewer, nbconvert. What a saved notebook
shows without widgets is that ``text/html`` as it was last sent.

The output is displayed with a display id, so that the snapshot can follow
the Explorer (the compiled costs land seconds after the cell has shown it).
It is updated only while no front end shows a live view of the widget:
updating an output re-renders it, and JupyterLab then builds the widget's
view anew (its diagram's pan and zoom lost, the page jumping). A front end
that runs widgets counts its views on the widget (``_view_count``), so
executors (nbclient, ``make notebooks``) and front ends without widgets get
every update, and a live widget is never rebuilt under the user; what a
user saves from a live session is the snapshot of when the cell ran, which
says so when its costs were still compiling.
"""

from __future__ import annotations

import weakref

_shown: 'weakref.WeakSet' = weakref.WeakSet()
"""The outputs of Explorers displayed in this kernel, for `wait_for_shown`."""


class ExplorerOutput:
  """The output of one Explorer: `widget`'s view and the snapshot `html`."""

  def __init__(self, explorer, widget):
    self._explorer = weakref.ref(explorer)
    self._widget = widget
    # Ask the front end to count its live views of the widget (ipywidgets
    # leaves it uncounted, None, by default).
    widget._view_count = 0
    self.html = ''
    self._handles = []

  def bundle(self, **kwargs) -> dict:
    bundle = dict(self._widget._repr_mimebundle_(**kwargs))
    bundle['text/html'] = self.html
    return bundle

  def display(self) -> None:
    from IPython.display import display
    self._handles.append(display(self.bundle(), raw=True, display_id=True))
    _shown.add(self)

  @property
  def live(self) -> bool:
    """Whether a front end shows a live view of the widget (the snapshot
    is then kept, not sent)."""
    return bool(self._widget._view_count)

  def set_html(self, html: str) -> None:
    """The snapshot is now `html`; the outputs follow unless a live view
    shows the widget (see the module)."""
    if html != self.html:
      self.html = html
      self.publish()

  def publish(self) -> None:
    """Send the snapshot to the outputs again, unless a live view shows
    the widget."""
    if self.live:
      return
    for handle in self._handles:
      handle.update(self.bundle(), raw=True)

  def publish_widget_state(self) -> None:
    """Send the state of every widget of the Explorer again."""
    for widget in _widget_tree(self._widget):
      widget.send_state()


def _widget_tree(root) -> list:
  """`root` and every widget its traits hold (children, layouts, styles)."""
  from ipywidgets import Widget
  found, todo = {}, [root]
  while todo:
    widget = todo.pop()
    if widget.model_id in found:
      continue
    found[widget.model_id] = widget
    for name in widget.keys:
      value = getattr(widget, name, None)
      values = value if isinstance(value, (list, tuple)) else [value]
      todo += [v for v in values if isinstance(v, Widget)]
  return list(found.values())


def wait_for_shown(timeout: float | None = None) -> None:
  """Wait until every Explorer displayed in this kernel has done its work,
  then send its snapshot and its widgets' state again: for executors that
  save the notebook (nbclient records only what a kernel sends on behalf
  of the cell it runs, and work that landed between cells went out on
  behalf of the cell that displayed it). `timeout` is each Explorer's."""
  for output in list(_shown):
    explorer = output._explorer()
    if explorer is not None:
      explorer.wait(timeout)
      output.publish()
      output.publish_widget_state()


# The Explorer each notebook cell made last: running the cell again stops
# the earlier one's work, which nothing shows any more.
_by_cell: dict[str, weakref.ref] = {}


def _current_cell() -> str | None:
  """The id of the notebook cell being run (JupyterLab and Notebook send
  it with each execution), or None outside a notebook."""
  try:
    from IPython import get_ipython
    parent = get_ipython().kernel.get_parent('shell')
  except (ImportError, AttributeError, TypeError):  # no kernel, or an old one
    return None
  return ((parent or {}).get('metadata') or {}).get('cellId')


def replace_in_cell(explorer) -> None:
  """Note `explorer` as its cell's; stop the one the cell made before."""
  cell = _current_cell()
  if cell is None:
    return
  earlier = _by_cell.get(cell)
  earlier = earlier() if earlier is not None else None
  if earlier is not None and earlier is not explorer:
    earlier.stop()
  _by_cell[cell] = weakref.ref(explorer)
