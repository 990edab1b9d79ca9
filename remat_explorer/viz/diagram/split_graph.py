"""The known/staged split of each remat block, as a Graphviz diagram.

``split_diagram(report)`` lays out, for every block differentiation split,
its forward (known) half in one cluster and its backward (staged) half in
another, with one highlighted edge per residual crossing from the first to
the second. It draws the analysis's plain graph of the split
(``analysis/split/graph.py``): equations gathered into labelled
boxes by where they sit in the user's model (module path, or the user's
functions), each opened by passing its id in ``expand=`` (a click in the
Explorer), down to primitives (``_grouped``). ``split_graph`` turns the
drawing into a ``graphviz.Digraph`` (``render`` runs the ``dot`` binary on
it). All are pure functions of a ``RematReport``.

Node ids are stable: ``f<i>/attention/query`` is a group of the ``i``-th
drawn block's forward side (``b<i>...`` the backward side), ``f<i>_e<j>``
equation ``j`` of its forward jaxpr, and ``<id>_j<k>_e<j>`` an equation
inside the ``k``-th jaxpr of a call; each node's tooltip shows its id. The
values saved outside every block are in the ``f_outside`` / ``b_outside``
clusters ("outside remat blocks").
"""

from __future__ import annotations

from typing import Iterable

import graphviz

from remat_explorer.analysis import split_graph_of, RematReport
from remat_explorer.viz.diagram import _summarize
from remat_explorer.viz.diagram._graph import Diagram, Edge, Node, Section
from remat_explorer.viz.diagram._grouped import ALL, _name_list, grouped_diagram
from remat_explorer.viz.diagram.render import render_diagram
from remat_explorer.viz.diagram.viewer import svg_img_html
from remat_explorer.viz.text import format_bytes, format_flops, html_text

RESIDUAL_COLOR = '#d62728'
RECOMPUTED_FILL = '#ffc966'
NAMED_FILL = '#c7e9c0'
FILLS = {'input': '#eeeeee', 'residual': '#fde0dd', 'saved': '#fde0dd',
         'tangent': '#deebf7', 'const': '#eeeeee', 'output': '#eeeeee',
         'eqn': '#ffffff', 'sub': '#e5e0f5', 'group': '#e8f1fb', 'folded': '#ffffff',
         'elided': '#ffffff'}
SHAPES = {'input': 'oval', 'output': 'oval', 'eqn': 'box', 'sub': 'box3d',
          'group': 'box', 'folded': 'cds', 'elided': 'note'}
PARTLY_RECOMPUTED_FILL = '#fde7bd'
LEGEND_NODES = 7
"""Nodes the legend takes out of the budget."""
_MIN_NODES = 24


class SplitDigraph(graphviz.Digraph):
  """A ``graphviz.Digraph`` that a notebook shows as an image.

  ``graphviz.Digraph`` shows as ``image/svg+xml``, which JupyterLab renders
  only in a trusted notebook (a committed notebook opens as text), and it
  prints ``dot``'s warnings into the cell. This shows the SVG as an
  ``<img>`` in HTML, which the sanitizer of an untrusted notebook keeps, at
  natural size, with the warnings folded into a note. A click on an image
  opens nothing, so the image is drawn with the legend and tooltips saying
  to pass an id in ``expand=`` instead.
  """

  drawing: Diagram | None = None
  """What it draws (set by ``split_graph``), to draw again for the image."""

  def as_image(self) -> 'SplitDigraph':
    """The same drawing worded for an image, where a click opens nothing
    (the legend and tooltips name ``expand=``)."""
    return self if self.drawing is None else _emit(self.drawing, opens_on_click=False)

  def _repr_mimebundle_(self, include=None, exclude=None, **_):
    diagram = render_diagram(self.as_image())
    image = svg_img_html(diagram.svg) if diagram.svg else ''
    return {'text/html': image + diagram.notes_html, 'text/plain': repr(self)}


def split_graph(report: RematReport, *, block: str | None = None,
                max_nodes: int = 300, expand: Iterable[str] = (),
                opens_on_click: bool = True) -> SplitDigraph:
  """The split of `report`'s remat blocks as a ``graphviz.Digraph``
  (``SplitDigraph``: shown in a notebook as an image).

  The drawing of ``split_diagram(report, ...)``; the other arguments are
  its. `opens_on_click`: whether the page showing it opens a group on a
  click (the Explorer does); where it does not (the static report), the
  legend and tooltips say to pass the group's id in ``expand=`` instead.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> graph = viz.split_graph(rx.analyze(loss_fn, *args))
    >>> type(graph).__name__, 'layer' in graph.source
    ('SplitDigraph', True)
  """
  return _emit(split_diagram(report, block=block, max_nodes=max_nodes, expand=expand),
               opens_on_click)


def split_diagram(report: RematReport, *, block: str | None = None,
                  max_nodes: int = 300, expand: Iterable[str] = ()) -> Diagram:
  """The split of `report`'s remat blocks as plain nodes, edges and clusters.

  Args:
    report: from ``remat_explorer.analysis.split.analyze``.
    block: a block name (``BlockReport.name``) to draw that block only;
      default: every block that differentiation split, blocks whose splits
      are alike (unrolled layers) drawn once, and the values the program
      saves outside them.
    max_nodes: above this many nodes (once groups are opened) the diagram is
      summarized (repeated runs of equations drawn once with ×N, chains of
      elementwise ops folded, then the middle of long jaxprs elided); it
      never has many more than this.
    expand: ids of groups and calls to draw open (a group opens one level
      down: the modules or functions inside it, then primitives), or
      ``'all'`` to open everything.
  """
  graph = split_graph_of(report, block)
  if isinstance(expand, str) and expand != ALL:
    expand = (expand,)  # one id, not its letters
  diagram = grouped_diagram(graph, expand=expand if expand == ALL else frozenset(expand))
  budget = max(max_nodes, _MIN_NODES) - LEGEND_NODES
  if diagram.num_nodes() > budget:
    before = diagram.num_nodes()
    _summarize.fold_repeats(diagram)
    if diagram.num_nodes() > budget:
      _summarize.fold_chains(diagram)
      _summarize.elide(diagram, budget)
    diagram.notes.append(f'summarized: {before} nodes drawn as {diagram.num_nodes()}')
  return diagram


# -- Graphviz ------------------------------------------------------------------

def _emit(diagram: Diagram, opens_on_click: bool = True) -> SplitDigraph:
  title = html_text(diagram.title)
  notes = ''.join(f'<br/><font point-size="10">{html_text(n)}</font>' for n in diagram.notes)
  g = SplitDigraph(
      'remat_split',
      # The title at the top left, where a wide drawing is seen first (a
      # notebook's image scrolls from there; the viewer opens there).
      graph_attr=dict(label=f'<<b>{title}</b>{notes}>', labelloc='t', labeljust='l',
                      fontname='Helvetica',
                      compound='true', rankdir='TB', nodesep='0.25', ranksep='0.35'),
      node_attr=dict(shape='box', style='rounded,filled', fontname='Helvetica',
                     fontsize='10', fillcolor='white', margin='0.08,0.04'),
      edge_attr=dict(color='#555555', arrowsize='0.6', fontname='Helvetica',
                     fontsize='9'))
  for top, fill in ((diagram.forward[0], '#f3f7fd'), (diagram.backward[0], '#fdf5f0')):
    with g.subgraph(name=f'cluster_{top.id}') as c:
      c.attr(label=f'<<b>{html_text(top.title)}</b>>', style='filled', fillcolor=fill,
             color='#999999')
      for child in top.children:
        _emit_section(c, child, opens_on_click)
  for e in diagram.edges:
    g.edge(e.src, e.dst, **_edge_attrs(e))
  _legend(g, opens_on_click)
  g.drawing = diagram
  return g


def _emit_section(g: graphviz.Digraph, section: Section, opens_on_click: bool) -> None:
  with g.subgraph(name=f'cluster_{section.id}') as c:
    # The cluster's id is its group's: a click on an opened group closes it.
    closes = opens_on_click and ('/' in section.id or section.id.endswith('_body'))
    c.attr(label=f'<{html_text(section.title)}>', style='rounded,filled',
           fillcolor='#ffffff80', color='#777777', fontsize='11', id=section.id,
           tooltip=graphviz.escape(html_text(
               f'{section.id} · click to close' if closes else section.title)),
           **({'class': 'closes'} if closes else {}))
    for node in section.nodes.values():
      c.node(node.id, **_node_attrs(node, opens_on_click))
    for child in section.children:
      _emit_section(c, child, opens_on_click)


def _node_attrs(node: Node, opens_on_click: bool = True) -> dict[str, str]:
  lines = [html_text(node.lines[0])]
  if node.name is not None:
    lines.append(f'<b>“{html_text(node.name)}”</b>')
  lines += [f'<font point-size="9">{html_text(line)}</font>' for line in node.lines[1:]]
  fill = FILLS.get(node.role or node.kind, '#ffffff')
  classes = [node.kind]
  if node.name is not None:
    fill = NAMED_FILL
    classes.append('named')
  if node.recomputed:
    fill = RECOMPUTED_FILL
    classes.append('recomputed')
  elif node.recomputed_equations:
    fill = PARTLY_RECOMPUTED_FILL
    classes.append('partly-recomputed')
  if node.opens:
    classes.append('opens')
  style = 'rounded,filled' if node.kind in ('eqn', 'folded', 'group') else 'filled'
  if node.kind == 'elided':
    style = 'filled,dashed'
  elif node.kind == 'group':
    style += ',bold'
  attrs = dict(label=_stacked(lines), shape=SHAPES[node.kind],
               fillcolor=fill, style=style, id=node.id, tooltip=_tooltip(node, opens_on_click),
               **{'class': ' '.join(classes)})
  if node.expanded:
    attrs['peripheries'] = '2'
  return attrs


def _stacked(lines: list[str]) -> str:
  """An HTML-like label of `lines`, one under another with a little room
  between them: with ``<br/>``, dot sets each baseline one font size below
  the last, and an underscore, which hangs below its line, touches the
  digits and brackets of the next."""
  rows = ''.join(f'<tr><td>{line}</td></tr>' for line in lines)
  return f'<<table border="0" cellborder="0" cellspacing="0" cellpadding="1">{rows}</table>>'


def _tooltip(node: Node, opens_on_click: bool) -> str:
  """Plain-text attribute: HTML-escaped (dot keeps entities as they are in
  SVG) and backslash-escaped (dot reads escape sequences like \\N)."""
  parts = [f'id {node.id}']
  if node.opens and not node.expanded:
    parts.append('click (or pass this id in expand=) to open it' if opens_on_click
                 else 'pass this id in expand= to open it')
  if node.equations > 1:
    parts.append(f'{node.equations} equations, {format_flops(node.flops)}')
  parts += node.details
  if node.names:
    parts.append('names: ' + _name_list(node.names))
  return graphviz.escape(html_text(' · '.join(parts)))


def _edge_attrs(e: Edge) -> dict[str, str]:
  if e.kind == 'residual':
    text = format_bytes(e.bytes)
    if e.count > 1:
      text = f'{e.count} residuals · {text}'
    elif e.name:
      text = f'{e.name} · {text}'
    if e.per_device:
      text += f' · {e.per_device}'
    return dict(label=f'<{html_text(text)}>', color=RESIDUAL_COLOR, fontcolor=RESIDUAL_COLOR,
                penwidth='2.5', style='bold', constraint='true', **{'class': 'residual'})
  if e.kind == 'body':
    return dict(style='dashed', arrowhead='none', color='#7b68ee', **{'class': 'body'})
  return {}


def _legend(g: graphviz.Digraph, opens_on_click: bool) -> None:
  opens = 'click to open' if opens_on_click else 'opens with expand='
  entries = [('legend_io', 'input / output', dict(shape='oval', fillcolor=FILLS['input'])),
             ('legend_group', f'module or function ({opens})',
              dict(shape='box', style='rounded,filled,bold', fillcolor=FILLS['group'])),
             ('legend_eqn', 'equation', dict(shape='box', style='rounded,filled')),
             ('legend_recomputed', 'recomputed in backward',
              dict(fillcolor=RECOMPUTED_FILL, style='rounded,filled')),
             ('legend_named', 'checkpoint_name value', dict(fillcolor=NAMED_FILL,
                                                           style='rounded,filled')),
             ('legend_sub', 'call (scan, jit, …), collapsed', dict(shape='box3d',
                                                                  fillcolor=FILLS['sub'])),
             ('legend_folded', 'folded: chain, ×N repeats', dict(shape='cds'))]
  assert len(entries) == LEGEND_NODES
  with g.subgraph(name='cluster_legend') as c:
    c.attr(label='<<b>legend</b>>', style='rounded', color='#bbbbbb', fontsize='10')
    for nid, text, attrs in entries:
      c.node(nid, label=f'<{text}>', fontsize='9', **attrs)
    c.edge('legend_io', 'legend_group', style='invis')
    c.edge('legend_group', 'legend_eqn', style='invis')
    c.edge('legend_eqn', 'legend_recomputed', label='<residual (bytes)>',
           color=RESIDUAL_COLOR, fontcolor=RESIDUAL_COLOR, penwidth='2.5')
    c.edge('legend_recomputed', 'legend_named', style='invis')
    c.edge('legend_named', 'legend_sub', style='invis')
    c.edge('legend_sub', 'legend_folded', style='invis')
