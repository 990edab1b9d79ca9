"""The split diagram as a drawing: nodes, edges and clusters, before any
Graphviz. ``_grouped`` builds one from the analysis's plain graph
(``analysis.split.graph.SplitGraph``); ``_summarize`` keeps a large one under a
node budget; ``split_graph`` emits it as DOT."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Node:
  id: str
  lines: list[str]
  """The first is the title, the others smaller details."""
  kind: str
  """'input', 'output', 'eqn', 'sub' (a call), 'group' (equations of one
  module or function, collapsed), 'folded' or 'elided'."""
  role: str = ''
  """For inputs: 'input', 'residual', 'saved', 'tangent' or 'const'."""
  recomputed: bool = False
  """Everything it stands for is recomputed by the backward pass."""
  name: str | None = None
  """A ``checkpoint_name`` on its value."""
  flops: int = 0
  equations: int = 1
  """Equations it stands for."""
  recomputed_equations: int = 0
  foldable: bool = False
  expanded: bool = False
  opens: bool = False
  """A click (or ``expand=``) opens it: a collapsed group or call."""
  names: list[str] = field(default_factory=list)
  """The ``checkpoint_name``s of the values it stands for."""
  details: list[str] = field(default_factory=list)
  """Lines for its tooltip: the user's source line, module path, ..."""


@dataclass
class Edge:
  src: str
  dst: str
  kind: str = 'data'
  """'data', 'residual' (forward to backward) or 'body' (to an opened call)."""
  bytes: int = 0
  count: int = 1
  name: str | None = None
  per_device: str | None = None
  """For a residual of a sharded program: the shard each device keeps."""


@dataclass
class Section:
  """One cluster of nodes in program order, with clusters inside."""
  id: str
  title: str
  nodes: dict[str, Node] = field(default_factory=dict)
  children: list['Section'] = field(default_factory=list)

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
        if merged[key].name != e.name:
          merged[key].name = None
        merged[key].per_device = None
      else:
        merged[key] = Edge(src, dst, e.kind, e.bytes, e.count, e.name, e.per_device)
    self.edges = list(merged.values())
