"""The Explorer's outputs in a notebook: its widget, then its snapshot.

A cell that shows an Explorer gets two outputs. The first is the widget's
view (``application/vnd.jupyter.widget-view+json``), for front ends that
run widgets. The second is the static snapshot (``viz.html.snapshot``) as
``text/html``, for those that do not: an untrusted notebook, a notebook
viewer, nbconvert, JupyterLab reopening a notebook saved without widget
state. A notebook saved at any time holds the snapshot of what was on
screen then: the policy shown, its compiled costs once compiled, the last
comparison and search.

The snapshot can follow the Explorer because it is an output of its own
(shown with a display id): updating the widget's output would make
JupyterLab build the widget's view anew, its diagram's pan and zoom lost
and the page jumping. While a view of the widget is on the page, the
snapshot hides itself: it carries a style rule that matches only where
an element of its Explorer's widget is in the same notebook (``:has``),
so it shows wherever the widget does not draw. It is drawn again a moment after the Explorer
last changed (a policy switch changes it twice within a second: the
analysis, then the compiled costs), on a thread of its own, so that
drawing it (a second ``dot`` run, its diagram as an image) never slows
the widget; it is sent from the kernel's thread, as widgets' changes are
(``_work``). ``Explorer.wait`` draws and sends what is pending.
"""

from __future__ import annotations

import threading
import weakref

SETTLE_SECONDS = 1.0
"""How long the snapshot waits after the Explorer's last change before it
is drawn and sent."""

_shown: 'weakref.WeakSet' = weakref.WeakSet()
"""The outputs of Explorers displayed in this kernel, for `wait_for_shown`."""


def _display(bundle: dict, display_id: bool = False):
  """IPython's ``display`` of a raw mime bundle (a handle with a display id)."""
  from IPython.display import display
  return display(bundle, raw=True, display_id=display_id)


class ExplorerOutput:
  """The outputs of one Explorer: `widget`'s view, and the snapshot of
  what `explorer` shows (its ``_snapshot_html``)."""

  def __init__(self, explorer, widget):
    self._explorer = weakref.ref(explorer)
    self._widget = widget
    # The mark the snapshot looks for on the page: this widget's root.
    self.mark = f'remat-explorer-of-{widget.model_id}'
    widget.add_class(self.mark)
    self.html = ''
    self._changes = 1  # what the Explorer showed, counted; drawn: `_drawn`
    self._drawn = 0
    self._sent = 0
    self._handles = []
    self._lock = threading.Lock()
    self._timer: threading.Timer | None = None

  def view_bundle(self, **kwargs) -> dict:
    """The widget's view, with a line of text where it cannot show."""
    bundle = dict(self._widget._repr_mimebundle_(**kwargs))
    bundle['text/plain'] = 'remat Explorer (its static snapshot is the next output)'
    return bundle

  def bundle(self, **kwargs) -> dict:
    """One output holding both (``_repr_mimebundle_``): for front ends that
    ask an object for its representation rather than display it."""
    return {**self._widget._repr_mimebundle_(**kwargs), 'text/html': self.snapshot()}

  def display(self) -> None:
    _display(self.view_bundle())
    html = self.snapshot()
    with self._lock:
      self._sent = max(self._sent, self._drawn)
    self._handles.append(_display({'text/html': html}, display_id=True))
    _shown.add(self)

  def changed(self) -> None:
    """What the Explorer shows changed: the snapshot follows once it has
    settled (see the module)."""
    with self._lock:
      self._changes += 1
      if not self._handles:  # not displayed: drawn when asked for
        return
      if self._timer is not None:
        self._timer.cancel()
      self._timer = threading.Timer(SETTLE_SECONDS, self._settled)
      self._timer.daemon = True
      self._timer.start()

  def _settled(self) -> None:
    """On the timer's thread: draw the snapshot, then send it from the
    kernel's thread (messages sent from others may never reach the front
    end)."""
    explorer = self._explorer()
    if explorer is not None:
      self.snapshot()
      explorer._work.post(self._send)

  def snapshot(self) -> str:
    """The snapshot of what the Explorer shows now, drawn if it changed.
    Drawn outside the lock, so that a change meanwhile never waits for it;
    of two drawings that cross, the later change's is kept."""
    with self._lock:
      change = self._changes
      if change == self._drawn:
        return self.html
    explorer = self._explorer()
    if explorer is None:
      return self.html
    hidden = f'remat-snapshot-of-{self._widget.model_id}'
    # JupyterLab shows several notebooks in one page (another may hold a
    # copy of this one, its widget drawn): there, the widget is looked for
    # in the snapshot's own notebook, and the output's row goes, prompt
    # included. Other front ends show one notebook a page.
    style = (f'<style>.jp-Notebook:has(.{self.mark}) .jp-OutputArea-child:has(.{hidden}), '
             f'body:not(:has(.jp-Notebook)):has(.{self.mark}) .{hidden} '
             '{ display: none; }</style>')
    html = f'<div class="{hidden}">{style}{explorer._snapshot_html()}</div>'
    with self._lock:
      if change > self._drawn:
        self._drawn, self.html = change, html
      return self.html

  def publish(self) -> None:
    """Draw the snapshot if it changed and send it to the outputs, even if
    sent before (``Explorer.wait``: what an executor saves is what it
    received while a cell ran, and a message sent between cells never
    reached it); on the kernel's thread."""
    if self._handles:
      self.snapshot()
      self._send(again=True)

  def _send(self, again: bool = False) -> None:
    """Send the snapshot drawn last, unless the outputs hold it already
    (or `again`)."""
    with self._lock:
      if self._drawn == self._sent and not again:
        return
      html, self._sent = self.html, self._drawn
    for handle in self._handles:
      handle.update({'text/html': html}, raw=True)

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
  """Wait until every Explorer displayed in this kernel has done its work
  and sent its snapshot, then send its widgets' state again: for executors
  that save the notebook (nbclient records only what a kernel sends on
  behalf of the cell it runs, and work that landed between cells went out
  on behalf of the cell that displayed it). `timeout` is each Explorer's."""
  for output in list(_shown):
    explorer = output._explorer()
    if explorer is not None:
      explorer.wait(timeout)  # its snapshot sent too
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
