"""The known/staged split of each remat block, as a Graphviz diagram.

``split_diagram(report)`` lays out, for every block differentiation split, its
forward (known) jaxpr in one cluster and its backward (staged) jaxpr in
another, with one highlighted edge per residual crossing from the first to
the second, as plain data (``_graph.Diagram``); ``split_graph`` turns that into
a ``graphviz.Digraph`` and ``to_svg`` renders it with the ``dot`` binary. All
three are pure functions of a ``RematReport``.

Node ids are stable: ``f<i>_e<j>`` / ``b<i>_e<j>`` is equation ``j`` of the
``i``-th drawn block's forward / backward jaxpr, ``..._i<k>`` its inputs, and
``<id>_j<k>_e<j>`` equations inside the ``k``-th jaxpr of a call; pass an id
in ``expand=`` to open a collapsed call (each node's tooltip shows its id).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable

import graphviz

from remat_explorer.analysis.report import BlockReport, RematReport
from remat_explorer.viz import _graph, _summarize
from remat_explorer.viz._blocks import aval_bytes, block_split
from remat_explorer.viz._graph import Diagram, Edge, Node, Section
from remat_explorer.viz.text import format_bytes, format_flops, html_text
from remat_explorer.engine import _jax_internals as jx

RESIDUAL_COLOR = '#d62728'
RECOMPUTED_FILL = '#ffc966'
NAMED_FILL = '#c7e9c0'
FILLS = {'input': '#eeeeee', 'residual': '#fde0dd', 'saved': '#fde0dd',
         'tangent': '#deebf7', 'const': '#eeeeee', 'output': '#eeeeee',
         'eqn': '#ffffff', 'sub': '#e5e0f5', 'folded': '#ffffff', 'elided': '#ffffff'}
SHAPES = {'input': 'oval', 'output': 'oval', 'eqn': 'box', 'sub': 'box3d',
          'folded': 'cds', 'elided': 'note'}
LEGEND_NODES = 6
"""Nodes the legend takes out of the budget."""
_MIN_NODES = 24


class SplitDigraph(graphviz.Digraph):
  """A ``graphviz.Digraph`` that a notebook shows as an image.

  ``graphviz.Digraph`` shows as ``image/svg+xml``, which JupyterLab renders
  only in a trusted notebook (a committed notebook opens as text), and it
  prints ``dot``'s warnings into the cell. This shows the SVG as an
  ``<img>`` in HTML, which the sanitizer of an untrusted notebook keeps, at
  natural size, with the warnings folded into a note.
  """

  def _repr_mimebundle_(self, include=None, exclude=None, **_):
    from remat_explorer.viz.embed import render_diagram
    from remat_explorer.viz.viewer import svg_img_html
    diagram = render_diagram(self)
    image = svg_img_html(diagram.svg) if diagram.svg else ''
    return {'text/html': image + diagram.notes_html, 'text/plain': repr(self)}


def split_graph(report: RematReport, *, block: str | None = None,
                max_nodes: int = 300, expand: Iterable[str] = ()) -> SplitDigraph:
  """The split of `report`'s remat blocks as a ``graphviz.Digraph``
  (``SplitDigraph``: shown in a notebook as an image).

  The drawing of ``split_diagram(report, ...)``; the arguments are its.
  """
  return _emit(split_diagram(report, block=block, max_nodes=max_nodes, expand=expand))


def split_diagram(report: RematReport, *, block: str | None = None,
                  max_nodes: int = 300, expand: Iterable[str] = ()) -> Diagram:
  """The split of `report`'s remat blocks as plain nodes, edges and clusters.

  Args:
    report: from ``remat_explorer.analysis.analyze``.
    block: a block name (``BlockReport.name``) to draw that block only;
      default: every block that differentiation split.
    max_nodes: above this many nodes the diagram is summarized (identical
      blocks drawn once with ×N, repeated runs of equations such as
      unrolled layers drawn once with ×N, chains of elementwise ops folded,
      then the middle of long jaxprs elided); it never has many more than
      this.
    expand: ids of collapsed call nodes (scan, cond, while, jit, nested
      checkpoints) to draw open.
  """
  blocks = _chosen_blocks(report, block)
  budget = max(max_nodes, _MIN_NODES) - LEGEND_NODES
  title = f'{report.function} · policy {report.policy}'
  diagram = Diagram(title, [Section('forward', 'forward pass (known jaxpr)')],
                    [Section('backward', 'backward pass (staged jaxpr)')])
  estimate = sum(len(b.known_jaxpr.eqns) + len(b.staged_jaxpr.eqns)
                 + len(b.known_jaxpr.invars) + len(b.staged_jaxpr.invars)
                 for b in blocks)
  if estimate > budget and len(blocks) > 1:
    groups = _summarize.dedupe_blocks(blocks)
  else:
    groups = [(b, [b]) for b in blocks]
  expand = frozenset(expand)
  for i, (b, same) in enumerate(groups):
    _add_block(diagram, i, b, same, expand)
  if not groups:
    diagram.notes.append('no block was split by differentiation')
  if diagram.num_nodes() > budget:
    before = diagram.num_nodes()
    _summarize.fold_repeats(diagram)
    if diagram.num_nodes() > budget:
      _summarize.fold_chains(diagram)
      _summarize.elide(diagram, budget)
    diagram.notes.append(f'summarized: {before} nodes drawn as {diagram.num_nodes()}')
  return diagram


def to_svg(digraph: graphviz.Digraph) -> str:
  """Render `digraph` to SVG text with Graphviz's ``dot`` binary; its
  warnings are dropped (``render_svg`` keeps them)."""
  return render_svg(digraph).svg


@dataclass(frozen=True)
class RenderedSvg:
  svg: str
  warnings: tuple[str, ...]
  """What ``dot`` wrote on stderr, one line each, duplicates dropped, e.g.
  "Warning: Unable to reclaim box space in spline routing ..." (an edge it
  routed roughly). Kept for a note rather than printed into a notebook."""


def render_svg(digraph: graphviz.Digraph) -> RenderedSvg:
  """Render `digraph` with ``dot -Tsvg``, its stderr captured.

  ``dot`` is run directly rather than through ``graphviz.pipe``, which
  writes the warnings to ``sys.stderr`` (into the notebook cell).
  """
  dot = shutil.which('dot')
  if dot is None:
    raise RuntimeError(
        'Rendering needs the Graphviz `dot` program, which was not found on '
        'PATH. Install Graphviz (`apt-get install graphviz` on Debian/Ubuntu, '
        '`brew install graphviz` on macOS, `conda install graphviz` in conda). '
        'Without it, the diagram is still available as DOT text: '
        '`digraph.source`.')
  run = subprocess.run([dot, '-Tsvg'], input=digraph.source.encode('utf-8'),
                       capture_output=True, check=False)
  stderr = run.stderr.decode('utf-8', errors='replace')
  if run.returncode != 0:
    raise RuntimeError(f'Graphviz dot failed (exit {run.returncode}): {stderr.strip()}')
  warnings = tuple(dict.fromkeys(line.strip() for line in stderr.splitlines() if line.strip()))
  return RenderedSvg(run.stdout.decode('utf-8'), warnings)


def _chosen_blocks(report: RematReport, name: str | None) -> list[BlockReport]:
  if name is None:
    return [b for b in report.blocks if b.differentiated and b.known_jaxpr is not None]
  for b in report.blocks:
    if b.name == name:
      if not b.differentiated or b.known_jaxpr is None:
        raise ValueError(
            f'block {name!r} was not split by differentiation: no differentiated '
            'input reaches it.')
      return [b]
  raise ValueError(f'no block named {name!r}; the report has '
                   f'{[b.name for b in report.blocks]}')


def _add_block(diagram: Diagram, i: int, block: BlockReport,
               same: list[BlockReport], expand: frozenset) -> None:
  known, staged = block.known_jaxpr, block.staged_jaxpr
  split = block_split(block)
  runs = f' · runs ×{block.trip_count}' if (block.trip_count or 1) > 1 else ''
  where = ' / '.join(block.path)
  head = (f'{block.name}' + (f' ({block.function})' if block.function != block.name else '')
          + (f' in {where}' if where else '') + runs)
  if len(same) > 1:
    head += f' · ×{len(same)} identical blocks: ' + _name_list([b.name for b in same])
  fwd = Section(f'f{i}', f'{head} · policy {block.policy} · saves '
                f'{format_bytes(block.residual_bytes)} per run')
  bwd = Section(f'b{i}', f'{head} · recomputes {len(split.recomputed)} eqns, '
                f'{format_flops(block.recompute_flops)} per run')
  diagram.forward[0].children.append(fwd)
  diagram.backward[0].children.append(bwd)
  edges = diagram.edges
  f_in, f_out = _graph.draw_jaxpr(fwd, edges, known, fwd.id,
                                  roles=['input'] * len(known.invars), expand=expand)
  roles = ['residual'] * split.num_residuals + ['tangent'] * (
      len(staged.invars) - split.num_residuals)
  for _, s in split.saved_inputs:
    roles[s] = 'saved'
  b_in, b_out = _graph.draw_jaxpr(bwd, edges, staged, bwd.id, roles=roles,
                                  recomputed=split.recomputed, expand=expand)
  n_out = split.num_known_outputs
  _graph.add_outputs(fwd, edges, fwd.id, known.outvars[:n_out], f_out[:n_out], 'output')
  _graph.add_outputs(bwd, edges, bwd.id, staged.outvars, b_out, 'tangent out')
  producers = {}
  for k, eqn in enumerate(known.eqns):
    producers.update((v, eqn) for v in eqn.outvars)
  for r, (v, src) in enumerate(zip(known.outvars[n_out:], f_out[n_out:])):
    if src is None:  # a literal residual: give it a node to start from
      src = f'{fwd.id}_lit{r}'
      fwd.nodes[src] = Node(src, ['literal', str(getattr(v, 'val', ''))], 'input', role='const')
    eqn = producers.get(v)
    if eqn is not None and eqn.primitive.name == 'reduce_precision':
      # The split rounds residuals after their producer (engine/split.py):
      # the name, if any, is on the value before rounding.
      eqn = producers.get(eqn.invars[0], eqn)
    name = jx.name_of_named_value(eqn) if eqn is not None else None
    edges.append(Edge(src, b_in[r], 'residual', aval_bytes(v.aval), 1, name,
                      _per_device_shard(block, v.aval, name, 'equation')))
  for k, (known_index, staged_index) in enumerate(split.saved_inputs):
    if known_index is None:  # read by the backward pass only
      src = f'{fwd.id}_saved{k}'
      fwd.nodes[src] = Node(src, ['block input', _graph.aval_text(staged.invars[staged_index])],
                            'input', role='input')
    else:
      src = f_in[known_index]
    aval = staged.invars[staged_index].aval
    edges.append(Edge(src, b_in[staged_index], 'residual', aval_bytes(aval), 1, None,
                      _per_device_shard(block, aval, None, 'argument')))


def _per_device_shard(block: BlockReport, aval, name: str | None, kind: str) -> str | None:
  """In a sharded program, the shard each device keeps of a residual of this
  type and kind (and name, if any), when the block's residuals of that
  description agree on one; else None."""
  shards = {(r.per_device_shape, r.per_device_bytes) for r in block.residuals
            if r.kind == kind and name in (None, r.name) and r.per_device_shape is not None
            and r.shape == tuple(aval.shape) and r.dtype == str(aval.dtype)}
  if len(shards) != 1:
    return None
  (local, nbytes), = shards
  return (f'{aval.update(shape=local).str_short(short_dtypes=True)} '
          f'{format_bytes(nbytes)}/device')


def _name_list(names: list[str], shown: int = 4) -> str:
  """`names` joined, the middle cut when long: a cluster's title is one line."""
  if len(names) <= shown:
    return ', '.join(names)
  return ', '.join(names[:shown - 1]) + f', … ({len(names) - shown} more), ' + names[-1]


# -- Graphviz ------------------------------------------------------------------

def _emit(diagram: Diagram) -> SplitDigraph:
  title = html_text(diagram.title)
  notes = ''.join(f'<br/><font point-size="10">{html_text(n)}</font>' for n in diagram.notes)
  g = SplitDigraph(
      'remat_split',
      graph_attr=dict(label=f'<<b>{title}</b>{notes}>', labelloc='t', fontname='Helvetica',
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
        _emit_section(c, child)
  for e in diagram.edges:
    g.edge(e.src, e.dst, **_edge_attrs(e))
  _legend(g)
  return g


def _emit_section(g: graphviz.Digraph, section: Section) -> None:
  with g.subgraph(name=f'cluster_{section.id}') as c:
    c.attr(label=f'<{html_text(section.title)}>', style='rounded,filled',
           fillcolor='#ffffff80', color='#777777', fontsize='11')
    for node in section.nodes.values():
      c.node(node.id, **_node_attrs(node))
    for child in section.children:
      _emit_section(c, child)


def _node_attrs(node: Node) -> dict[str, str]:
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
  style = 'rounded,filled' if node.kind in ('eqn', 'folded') else 'filled'
  if node.kind == 'elided':
    style = 'filled,dashed'
  attrs = dict(label=f'<{"<br/>".join(lines)}>', shape=SHAPES[node.kind],
               fillcolor=fill, style=style, id=node.id, tooltip=_tooltip(node),
               **{'class': ' '.join(classes)})
  if node.expanded:
    attrs['peripheries'] = '2'
  return attrs


def _tooltip(node: Node) -> str:
  """Plain-text attribute: HTML-escaped (dot keeps entities as they are in
  SVG) and backslash-escaped (dot reads escape sequences like \\N)."""
  parts = [f'id {node.id}']
  if node.kind == 'sub' and not node.expanded:
    parts.append('pass this id in expand= to open it')
  if len(node.eqns) == 1:
    parts.append(jx.source_info_util.summarize(node.eqns[0].source_info))
  elif node.eqns:
    parts.append(f'{len(node.eqns)} equations, {format_flops(node.flops)}')
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


def _legend(g: graphviz.Digraph) -> None:
  entries = [('legend_io', 'input / output', dict(shape='oval', fillcolor=FILLS['input'])),
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
    c.edge('legend_io', 'legend_eqn', style='invis')
    c.edge('legend_eqn', 'legend_recomputed', label='<residual (bytes)>',
           color=RESIDUAL_COLOR, fontcolor=RESIDUAL_COLOR, penwidth='2.5')
    c.edge('legend_recomputed', 'legend_named', style='invis')
    c.edge('legend_named', 'legend_sub', style='invis')
    c.edge('legend_sub', 'legend_folded', style='invis')
