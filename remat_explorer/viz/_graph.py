"""The split diagram as plain nodes and edges, before any Graphviz.

``draw_jaxpr`` turns jaxprs into ``Section``s (one per drawn jaxpr, each a
cluster) of ``Node``s and ``Edge``s. Above a node budget the diagram is then
summarized, in this order: identical blocks drawn once (``dedupe_blocks``),
repeated runs of equations, such as the layers of an unrolled model, drawn
once with ×N (``fold_repeats``), chains of elementwise ops folded
(``fold_chains``), and what still does not fit elided into "⋯ N more" nodes
from the middle of a program, so that its inputs and outputs stay in view
(``elide``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from jax.extend.core import Literal, jaxprs_in_params

from remat_explorer.analysis.flops import eqn_flops
from remat_explorer.engine import _jax_internals as jx
from remat_explorer.viz._blocks import aval_text
from remat_explorer.viz.text import format_flops

# Ops that map one array to one array of the same shape, element by element
# (binary ones qualify when their other operand is a literal).
_ELEMENTWISE = frozenset('''
    sin cos tan tanh asin acos atan sinh cosh asinh acosh atanh exp exp2 log
    log1p expm1 logistic erf erfc erf_inv lgamma digamma neg abs sign floor
    ceil round sqrt rsqrt cbrt square integer_pow convert_element_type
    reduce_precision copy copy_p real imag conj not is_finite stop_gradient
    add sub mul div max min pow rem add_any'''.split())


@dataclass
class Node:
  id: str
  lines: list[str]
  kind: str
  """'input', 'output', 'eqn', 'sub' (an equation holding jaxprs), 'folded'
  or 'elided'."""
  role: str = ''
  """For inputs: 'input', 'residual', 'saved', 'tangent' or 'const'."""
  recomputed: bool = False
  name: str | None = None
  eqns: list = field(default_factory=list)
  """The equations this node stands for (several once folded or elided)."""
  foldable: bool = False
  expanded: bool = False
  recomputed_count: int = 0
  names: list[str] = field(default_factory=list)
  """The ``checkpoint_name``s of the values a folded node stands for."""

  @property
  def flops(self) -> int:
    return sum(eqn_flops(e) for e in self.eqns)


@dataclass
class Edge:
  src: str
  dst: str
  kind: str = 'data'
  """'data', 'residual' (forward to backward) or 'body' (to an expanded
  sub-jaxpr)."""
  bytes: int = 0
  count: int = 1
  name: str | None = None
  per_device: str | None = None
  """For a residual of a sharded program: the shard each device keeps."""


@dataclass
class Section:
  """One drawn jaxpr: a cluster of nodes in program order."""
  id: str
  title: str
  nodes: dict[str, Node] = field(default_factory=dict)
  children: list[Section] = field(default_factory=list)

  def walk(self):
    yield self
    for child in self.children:
      yield from child.walk()


@dataclass
class Diagram:
  title: str
  forward: list[Section]
  backward: list[Section]
  edges: list[Edge] = field(default_factory=list)
  notes: list[str] = field(default_factory=list)

  def sections(self) -> list[Section]:
    return [s for top in self.forward + self.backward for s in top.walk()]

  def num_nodes(self) -> int:
    return sum(len(s.nodes) for s in self.sections())

  def redirect(self, moved: dict[str, str]) -> None:
    """Point edges at the nodes that absorbed others, merging duplicates."""
    merged: dict[tuple, Edge] = {}
    for e in self.edges:
      src, dst = moved.get(e.src, e.src), moved.get(e.dst, e.dst)
      if src == dst:
        continue
      key = (src, dst, e.kind)
      if key in merged:
        merged[key].count += e.count
        merged[key].bytes += e.bytes
        merged[key].name = merged[key].per_device = None
      else:
        merged[key] = Edge(src, dst, e.kind, e.bytes, e.count, e.name, e.per_device)
    self.edges = list(merged.values())


# -- building ------------------------------------------------------------------

_ROLE_TITLES = {'input': 'input', 'residual': 'residual', 'saved': 'saved input',
                'tangent': 'tangent', 'const': 'constant'}


def draw_jaxpr(section: Section, edges: list[Edge], jaxpr, prefix: str, *,
               roles, recomputed=frozenset(), expand=frozenset()) -> tuple[list, list]:
  """Add `jaxpr`'s inputs and equations to `section`, data flow to `edges`.

  Returns the node ids of its invars and of the producer of each outvar
  (None for a literal).
  """
  env: dict = {}
  for i, v in enumerate(jaxpr.constvars):
    env[v] = _input(section, f'{prefix}_c{i}', v, 'const')
  in_ids = [_input(section, f'{prefix}_i{i}', v, role)
            for i, (v, role) in enumerate(zip(jaxpr.invars, roles))]
  env.update(zip(jaxpr.invars, in_ids))
  for j, eqn in enumerate(jaxpr.eqns):
    nid = f'{prefix}_e{j}'
    node = section.nodes[nid] = _eqn_node(nid, eqn, j in recomputed)
    for src in dict.fromkeys(env[v] for v in eqn.invars
                             if not isinstance(v, Literal) and v in env):
      edges.append(Edge(src, nid))
    if node.kind == 'sub' and nid in expand:
      node.expanded = True
      for k, sub in enumerate(jaxprs_in_params(eqn.params)):
        child = Section(f'{nid}_j{k}', f'{node.lines[0]}: jaxpr {k}')
        section.children.append(child)
        sub_in, _ = draw_jaxpr(child, edges, sub, child.id,
                               roles=['input'] * len(sub.invars), expand=expand)
        first = sub_in[0] if sub_in else next(iter(child.nodes), None)
        if first is not None:
          edges.append(Edge(nid, first, 'body'))
    env.update((v, nid) for v in eqn.outvars)
  outs = [None if isinstance(v, Literal) else env.get(v) for v in jaxpr.outvars]
  return in_ids, outs


def add_outputs(section: Section, edges: list[Edge], prefix: str, outvars,
                sources, title: str) -> None:
  for k, (v, src) in enumerate(zip(outvars, sources)):
    nid = f'{prefix}_o{k}'
    label = aval_text(v) if not isinstance(v, Literal) else f'literal {v.val}'
    section.nodes[nid] = Node(nid, [title, label], 'output')
    if src is not None:
      edges.append(Edge(src, nid))


def _input(section: Section, nid: str, v, role: str) -> str:
  section.nodes[nid] = Node(nid, [_ROLE_TITLES[role], aval_text(v)], 'input', role=role)
  return nid


def _eqn_node(nid: str, eqn, recomputed: bool) -> Node:
  prim = eqn.primitive.name
  outs = [aval_text(v) for v in eqn.outvars]
  out_text = ', '.join(outs[:3]) + (f', … ({len(outs)} outputs)' if len(outs) > 3 else '')
  subs = list(jaxprs_in_params(eqn.params))
  if subs:
    title = _call_title(eqn)
    count = sum(_count_eqns(s) for s in subs)
    lines = [title, f'{count} eqns · {format_flops(eqn_flops(eqn))}', out_text]
    return Node(nid, lines, 'sub', recomputed=recomputed, eqns=[eqn])
  name = jx.name_of_named_value(eqn)
  variables = {v for v in eqn.invars if not isinstance(v, Literal)}
  foldable = (prim in _ELEMENTWISE and len(variables) == 1 and len(eqn.outvars) == 1
              and getattr(next(iter(variables)).aval, 'shape', None)
              == getattr(eqn.outvars[0].aval, 'shape', ()))
  return Node(nid, [prim, out_text], 'eqn', recomputed=recomputed, name=name,
              eqns=[eqn], foldable=foldable and name is None)


def _call_title(eqn) -> str:
  prim, params = eqn.primitive.name, eqn.params
  if prim == 'scan':
    return f"scan ×{params.get('length')}"
  if prim == 'cond':
    return f"cond ({len(params.get('branches', ()))} branches)"
  name = params.get('name')
  return f'{prim} {name}' if isinstance(name, str) and name else prim


def _count_eqns(jaxpr) -> int:
  return sum(1 + sum(_count_eqns(s) for s in jaxprs_in_params(e.params))
             for e in jaxpr.eqns)


# -- summarizing ---------------------------------------------------------------

def fold_repeats(diagram: Diagram, *, min_repeats: int = 3,
                 max_period: int = 512) -> None:
  """Fold each run of equations that repeats with a period into one node.

  An unrolled model's layers are the same few equations over and over:
  drawn once with ×N they keep the picture's shape where eliding would cut
  most of it. Equations match when their primitive, output types and
  recompute status do (``checkpoint_name``s may differ: each layer's names
  are listed in the folded node's tooltip).
  """
  moved = {}
  for section in diagram.sections():
    nodes = list(section.nodes.values())
    body = [n for n in nodes if n.kind in ('eqn', 'sub')]
    runs = _periodic_runs([_signature(n) for n in body], min_repeats, max_period)
    if not runs:
      continue
    first_of_run = {}
    for start, period, repeats in runs:
      segment = body[start:start + period * repeats]
      stand_in = _repeat_node(f'{section.id}_rep{start}', segment, period, repeats)
      first_of_run[segment[0].id] = stand_in
      moved.update((n.id, stand_in.id) for n in segment)
    new_nodes = {}
    for node in nodes:
      if node.id in first_of_run:
        stand_in = first_of_run[node.id]
        new_nodes[stand_in.id] = stand_in
      elif node.id not in moved:
        new_nodes[node.id] = node
    section.nodes = new_nodes
  if moved:
    diagram.redirect(moved)


def _signature(node: Node) -> tuple:
  return (node.kind, node.lines[0] if node.kind == 'eqn' else tuple(node.lines),
          node.lines[-1], node.recomputed, node.name is not None)


def _periodic_runs(signatures: list, min_repeats: int,
                   max_period: int) -> list[tuple[int, int, int]]:
  """Non-overlapping ``(start, period, repeats)`` runs of `signatures` that
  repeat at least `min_repeats` times, the ones covering most taken first."""
  if len(signatures) < 2 * min_repeats:
    return []
  codes = {}
  seq = np.array([codes.setdefault(s, len(codes)) for s in signatures])
  candidates = []
  for period in range(1, min(max_period, len(seq) // min_repeats) + 1):
    same = np.concatenate([[False], seq[period:] == seq[:-period], [False]])
    edges = np.flatnonzero(np.diff(same.astype(np.int8)))
    for start, stop in zip(edges[::2], edges[1::2]):
      # seq[start:stop + period] repeats with this period.
      repeats = (stop - start + period) // period
      if repeats >= min_repeats:
        candidates.append((repeats * period, period, int(start), int(repeats)))
  candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
  taken, covered = [], np.zeros(len(seq), dtype=bool)
  for length, period, start, repeats in candidates:
    if not covered[start:start + length].any():
      covered[start:start + length] = True
      taken.append((start, period, repeats))
  return sorted(taken)


def _repeat_node(nid: str, segment: list[Node], period: int, repeats: int) -> Node:
  one = [n.lines[0] for n in segment[:period]]
  shown = ' → '.join(one) if period <= 4 else ' → '.join(one[:3]) + f' → … ({period} ops)'
  recomputed = sum(len(n.eqns) for n in segment if n.recomputed)
  names = [n.name for n in segment if n.name is not None]
  total = sum(len(n.eqns) for n in segment)
  lines = [f'{shown} ×{repeats}', segment[period - 1].lines[-1]]
  if 0 < recomputed < total:
    lines.append(f'{recomputed} of {total} recomputed')
  return Node(nid, lines, 'folded', recomputed=recomputed == total,
              eqns=[e for n in segment for e in n.eqns], recomputed_count=recomputed,
              names=names)


def fold_chains(diagram: Diagram) -> None:
  """Fold each chain of elementwise one-in-one-out ops into one node.

  A value inside a chain has exactly one consumer (the next op), so folding
  hides no data flow; residual producers and named values end chains.
  """
  out_degree, in_data = defaultdict(int), defaultdict(list)
  for e in diagram.edges:
    out_degree[e.src] += 1
    if e.kind == 'data':
      in_data[e.dst].append(e.src)
  moved = {}
  for section in diagram.sections():
    chains, current = [], []
    for node in section.nodes.values():
      if not (node.kind == 'eqn' and node.foldable):
        current = []
        continue
      prev = current[-1] if current else None
      if (prev is not None and in_data[node.id] == [prev.id]
          and out_degree[prev.id] == 1 and prev.recomputed == node.recomputed):
        current.append(node)
      else:
        current = [node]
        chains.append(current)
    for chain in (c for c in chains if len(c) > 1):
      head = chain[0]
      head.kind, head.lines = 'folded', [_chain_label(chain), chain[-1].lines[-1]]
      head.eqns = [e for n in chain for e in n.eqns]
      for n in chain[1:]:
        moved[n.id] = head.id
        del section.nodes[n.id]
  if moved:
    diagram.redirect(moved)


def _chain_label(chain: list[Node]) -> str:
  prims = [n.lines[0] for n in chain]
  for period in range(1, min(6, len(prims)) + 1):
    if len(prims) % period == 0 and prims == prims[:period] * (len(prims) // period):
      repeats = len(prims) // period
      return ' → '.join(prims[:period]) + (f' ×{repeats}' if repeats > 1 else '')
  return ' → '.join(prims[:3]) + ' → … → ' + prims[-1] + f' ({len(prims)} ops)'


def elide(diagram: Diagram, budget: int) -> None:
  """Elide nodes until the diagram has at most about `budget` nodes.

  Each section gets a share by water-filling (small sections keep all their
  nodes); a section over its share keeps some inputs, some outputs, and the
  head and tail of its equations, the rest merged into "⋯ N more" nodes.
  """
  sections = [s for s in diagram.sections() if s.nodes]
  if sum(len(s.nodes) for s in sections) <= budget:
    return
  shares, left = {}, max(budget, len(sections))
  for i, s in enumerate(sorted(sections, key=lambda s: len(s.nodes))):
    shares[s.id] = min(len(s.nodes), max(1, left // (len(sections) - i)))
    left -= shares[s.id]
  moved = {}
  for s in sections:
    if len(s.nodes) > shares[s.id]:
      moved.update(_elide_section(s, shares[s.id]))
  diagram.redirect(moved)


def _elide_section(section: Section, share: int) -> dict[str, str]:
  nodes = list(section.nodes.values())
  if share < 4:
    segments = [('body', [], nodes, [])]
  else:
    groups = {'input': [n for n in nodes if n.kind == 'input'],
              'output': [n for n in nodes if n.kind == 'output']}
    body = [n for n in nodes if n.kind not in groups]
    segments, left = {}, share
    for kind, fraction in (('input', 4), ('output', 8)):
      group = groups[kind]
      keep = len(group) if len(group) <= share // fraction else max(0, share // fraction - 1)
      left -= keep + (keep < len(group))
      segments[kind] = (kind, group[:keep], group[keep:], [])
    if len(body) <= left:
      segments['body'] = ('body', body, [], [])
    else:
      keep = max(0, left - 1)
      head, tail = (keep + 1) // 2, keep // 2
      segments['body'] = ('body', body[:head], body[head:len(body) - tail],
                          body[len(body) - tail:])
    segments = [segments[k] for k in ('input', 'body', 'output')]
  new_nodes, moved = {}, {}
  for kind, head, gone, tail in segments:
    new_nodes.update((n.id, n) for n in head)
    if gone:
      stand_in = _stand_in(section, kind, gone)
      new_nodes[stand_in.id] = stand_in
      moved.update((n.id, stand_in.id) for n in gone)
    new_nodes.update((n.id, n) for n in tail)
  section.nodes = new_nodes
  return moved


def _stand_in(section: Section, kind: str, gone: list[Node]) -> Node:
  nid = f'{section.id}_more_{kind}'
  what = {'input': 'inputs', 'output': 'outputs', 'body': 'equations'}[kind]
  eqns = [e for n in gone for e in n.eqns]
  lines = [f'⋯ {len(eqns) if kind == "body" else len(gone)} more {what}']
  recomputed = sum(len(n.eqns) for n in gone if n.recomputed)
  if kind == 'body':
    lines.append(format_flops(sum(eqn_flops(e) for e in eqns)))
    if recomputed:
      lines.append(f'{recomputed} recomputed')
  return Node(nid, lines, 'elided', eqns=eqns, recomputed_count=recomputed)


def dedupe_blocks(blocks: list) -> list[tuple[object, list]]:
  """Group blocks whose known and staged jaxprs print the same."""
  groups: dict[tuple, list] = {}
  for b in blocks:
    key = (len(b.known_jaxpr.eqns), len(b.staged_jaxpr.eqns))
    groups.setdefault(key, []).append(b)
  out = []
  for same_size in groups.values():
    by_text: dict[tuple, list] = {}
    for b in same_size:
      text = (str(b.known_jaxpr), str(b.staged_jaxpr)) if len(same_size) > 1 else ()
      by_text.setdefault(text, []).append(b)
    out.extend((g[0], g) for g in by_text.values())
  order = {id(b): i for i, b in enumerate(blocks)}
  return sorted(out, key=lambda pair: order[id(pair[0])])
