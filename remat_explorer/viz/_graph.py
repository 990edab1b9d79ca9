"""The split diagram as plain nodes and edges, before any Graphviz.

``draw_jaxpr`` turns jaxprs into ``Section``s (one per drawn jaxpr, each a
cluster) of ``Node``s and ``Edge``s; ``_summarize`` keeps a large diagram
under a node budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
