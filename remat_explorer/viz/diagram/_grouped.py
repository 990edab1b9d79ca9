"""The split diagram at the level of the user's code.

``grouped_diagram`` draws the analysis's plain graph of the split
(``analysis.split.graph.SplitGraph``) with each block's equations gathered by
where they sit in the user's model (a module path below the block's, or the
user's functions the block calls): one labelled box per group, such as
"attention · 41 eqns · saves 2 residuals (3.0 MiB)", closed until its id is
in `expand` (a click in the Explorer), then open one level down, to
primitives at the bottom. Calls (``jit``, custom derivatives, nested
blocks) open the same way. The values the forward pass computes and saves are
drawn one node each on the backward side, with the residual edges that carry
them; the block inputs saved as they are, and other inputs and outputs, are
gathered per kind. Groups are titled as the graph says (a module by its
full module path) and keep their ids short (``f0/attention/query``). The
values saved outside every block are drawn in their own cluster
(``f_outside`` / ``b_outside``) the same way.
"""

from __future__ import annotations

from collections import defaultdict

from remat_explorer.analysis import GraphBlock, GraphNode, SplitGraph
from remat_explorer.viz.diagram._graph import Diagram, Edge, Node, Section
from remat_explorer.viz.text import format_bytes, format_flops

_GATHERED = {'input': 'block inputs', 'const': 'constants', 'tangent': 'cotangents in',
             'saved': 'saved inputs', 'output': 'outputs', 'tangent out': 'gradients out'}
_INPUT_ROLES = ('input', 'const', 'tangent', 'saved')


ALL = 'all'
"""``expand=ALL`` opens every group and call: the split down to primitives."""


def grouped_diagram(graph: SplitGraph, *, expand=frozenset()) -> Diagram:
  """The split as nested groups, those in `expand` (ids, or ``ALL``) open;
  an id that names no group or call of the split is a ``ValueError``."""
  diagram, drawer = _drawn(graph, expand)
  if expand != ALL and not expand <= drawer.asked:
    # Ids inside a closed group are not asked about: look everywhere.
    unknown = expand - _drawn(graph, ALL)[1].asked
    if unknown:
      known = sorted(drawer.asked)
      raise ValueError(
          f'expand= names {sorted(unknown)}, which no group or call of this split has; '
          f'those that open here: {known[:20]}{" ..." if len(known) > 20 else ""}')
  return diagram


def _drawn(graph: SplitGraph, expand) -> tuple[Diagram, '_Drawer']:
  diagram = Diagram(graph.title, [Section('forward', 'forward pass (known jaxpr)')],
                    [Section('backward', 'backward pass (staged jaxpr)')],
                    notes=list(graph.notes))
  drawer = _Drawer(graph, expand)
  for block in graph.blocks:
    for side, top in (('forward', diagram.forward[0]), ('backward', diagram.backward[0])):
      section = Section(f'{side[0]}_outside' if block.outside else f'{side[0]}{block.index}',
                        _block_title(block, side))
      top.children.append(section)
      members = [n for n in drawer.top_level[block.index, side]]
      drawer.place(section, members, depth=0)
  diagram.edges = drawer.edges()
  return diagram, drawer


class _Drawer:

  def __init__(self, graph: SplitGraph, expand):
    self.graph, self.expand = graph, expand
    self.children: dict[str, list[GraphNode]] = defaultdict(list)
    self.top_level: dict[tuple, list[GraphNode]] = defaultdict(list)
    for n in graph.nodes:
      if n.parent is None:
        self.top_level[n.block, n.side].append(n)
      else:
        self.children[n.parent].append(n)
    self.saves: dict[str, list] = defaultdict(list)  # producer -> residual edges
    self.carries: dict[str, object] = {}  # residual input -> its residual edge
    for e in graph.edges:
      if e.kind == 'residual':
        self.saves[e.src].append(e)
        self.carries[e.dst] = e
    self.shown: dict[str, str] = {}  # graph node id -> drawn node id
    self.bodies: list[Edge] = []  # from an opened call to its first node
    self.asked: set[str] = set()  # ids of the groups and calls that could open

  def opened(self, node_id: str) -> bool:
    self.asked.add(node_id)
    return self.expand == ALL or node_id in self.expand

  # -- placing nodes ------------------------------------------------------------

  def place(self, section: Section, members: list[GraphNode], depth: int) -> None:
    gathered: dict[str, list[GraphNode]] = {}
    buckets: dict[str, list[GraphNode]] = {}
    order: list[tuple[str, str]] = []
    for n in members:
      if n.kind in ('input', 'output') and n.role in _GATHERED:
        key = ('gathered', n.role)
        if n.role not in gathered:
          order.append(key)
        gathered.setdefault(n.role, []).append(n)
      elif len(n.group) > depth:
        key = ('group', n.group[depth])
        if n.group[depth] not in buckets:
          order.append(key)
        buckets.setdefault(n.group[depth], []).append(n)
      else:
        order.append(('node', n.id))
    by_id = {n.id: n for n in members}
    for kind, key in order:
      if kind == 'gathered':
        self._gathered(section, key, gathered[key])
      elif kind == 'group':
        self._group(section, key, buckets[key], depth)
      else:
        self._single(section, by_id[key])

  def _gathered(self, section: Section, role: str, nodes: list[GraphNode]) -> None:
    if len(nodes) == 1:
      self._single(section, nodes[0])
      return
    nid = f'{section.id}_{role.replace(" ", "_")}'
    is_input = role in _INPUT_ROLES
    section.nodes[nid] = Node(nid, [f'{_GATHERED[role]} ({len(nodes)})', _types(nodes)],
                              'input' if is_input else 'output',
                              role=role if is_input else '', equations=0)
    for n in nodes:
      self.shown[n.id] = nid

  def _group(self, section: Section, name: str, nodes: list[GraphNode], depth: int) -> None:
    gid = f'{section.id}/{name}'  # a section's id is its group's path
    titles = nodes[0].group_titles
    title = titles[depth] if len(titles) > depth else name
    if self.opened(gid):
      child = Section(gid, title)
      section.children.append(child)
      self.place(child, nodes, depth + 1)
      return
    inside = [d for n in nodes for d in self._descendants(n)]
    equations = sum(n.equations for n in nodes if n.kind in ('eqn', 'call'))
    recomputed = sum(n.equations for n in nodes if n.recomputed)
    flops = sum(n.flops for n in nodes)
    names = sorted({d.name for d in inside if d.name})
    lines = [title, f'{equations} eqns · {format_flops(flops)}']
    saved = [e for d in inside for e in self.saves.get(d.id, ())]
    if saved:
      lines.append(f'saves {len(saved)} residual{"s" * (len(saved) != 1)} '
                   f'({format_bytes(sum(e.bytes for e in saved))})')
    if recomputed:
      lines.append(f'recomputes {recomputed} of {equations} eqns')
    classes = {n.group_classes[depth] for n in nodes if len(n.group_classes) > depth} - {''}
    details = [f'class {", ".join(sorted(classes))}'] if classes else []
    node = Node(gid, lines, 'group', recomputed=0 < equations == recomputed, flops=flops,
                equations=equations, recomputed_equations=recomputed, opens=True,
                names=names, details=details + _where(nodes))
    section.nodes[gid] = node
    for d in inside:
      self.shown[d.id] = gid

  def _single(self, section: Section, n: GraphNode) -> None:
    kind = 'sub' if n.kind == 'call' else n.kind
    lines = [n.label, n.types]
    name = n.name
    if n.id in self.carries:  # a saved value: its name and size on the node
      name = self.carries[n.id].name
      lines[1] += f' · {format_bytes(self.carries[n.id].bytes)}'
    if n.kind == 'call':
      lines.insert(1, f'{n.equations} eqns · {format_flops(n.flops)}')
    opens = n.kind == 'call' and bool(self.children.get(n.id))
    node = Node(n.id, lines, kind, role=n.role, recomputed=n.recomputed, name=name,
                flops=n.flops, equations=n.equations if n.kind in ('eqn', 'call') else 0,
                recomputed_equations=n.equations if n.recomputed else 0,
                foldable=n.elementwise, opens=opens, details=_where([n]))
    section.nodes[n.id] = node
    self.shown[n.id] = n.id
    if not opens:
      return
    if self.opened(n.id):
      node.expanded = True
      child = Section(f'{n.id}_body', f'{n.label}: inside')
      section.children.append(child)
      for inner in self.children[n.id]:
        self._single(child, inner)
      first = next(iter(child.nodes), None)
      if first is not None:
        self.bodies.append(Edge(n.id, first, 'body'))
    else:
      for d in self._descendants(n)[1:]:
        self.shown[d.id] = n.id

  def _descendants(self, n: GraphNode) -> list[GraphNode]:
    found = [n]
    for child in self.children.get(n.id, ()):
      found += self._descendants(child)
    return found

  # -- edges -------------------------------------------------------------------------

  def edges(self) -> list[Edge]:
    merged: dict[tuple, Edge] = {}
    for e in self.graph.edges:
      if e.kind == 'body':
        continue
      src, dst = self.shown.get(e.src), self.shown.get(e.dst)
      if src is None or dst is None or src == dst:
        continue
      key = (src, dst, e.kind)
      if key in merged:
        if e.kind == 'residual':
          merged[key].count += 1
          merged[key].bytes += e.bytes
          merged[key].name = merged[key].name if merged[key].name == e.name else None
          merged[key].per_device = None
        continue
      merged[key] = Edge(src, dst, e.kind, e.bytes, 1, e.name, _per_device(e))
    return list(merged.values()) + self.bodies


def _types(nodes: list[GraphNode]) -> str:
  shown = ', '.join(n.types for n in nodes[:3])
  return shown + (f', … ({len(nodes) - 3} more)' if len(nodes) > 3 else '')


def _where(nodes: list[GraphNode]) -> list[str]:
  sites = list(dict.fromkeys(str(n.site) for n in nodes if n.site is not None))
  paths = list(dict.fromkeys(n.module_path for n in nodes if n.module_path))
  details = []
  if paths:
    details.append('module ' + ', '.join(paths[:3]) + (' …' if len(paths) > 3 else ''))
  if sites:
    details.append(', '.join(sites[:3]) + (f' and {len(sites) - 3} more lines'
                                            if len(sites) > 3 else ''))
  return details


def _block_title(block: GraphBlock, side: str) -> str:
  if block.outside:
    count, size = block.arguments
    arguments = (f' · the backward pass also reads {count} argument{"s" * (count != 1)} '
                 f'({format_bytes(size)})' if count else '')
    return (f'{block.name} · saves {format_bytes(block.residual_bytes)}{arguments}'
            if side == 'forward' else f'{block.name} · reads what the forward pass saved')
  runs = f' · runs ×{block.trip_count}' if (block.trip_count or 1) > 1 else ''
  where = ' / '.join(block.path)
  head = (block.name + (f' ({block.module_path})' if block.module_path else '')
          + (f' in {where}' if where else '') + runs)
  if block.alike:
    head += f' · ×{len(block.alike)} alike blocks: ' + _name_list(list(block.alike))
  if side == 'forward':
    return (f'{head} · policy {block.policy} · saves '
            f'{format_bytes(block.residual_bytes)} per run')
  return (f'{head} · recomputes {block.recomputed} eqns, '
          f'{format_flops(block.recompute_flops)} per run')


def _name_list(names: list[str], shown: int = 4) -> str:
  """`names` joined, the middle cut when long: a cluster's title is one line."""
  if len(names) <= shown:
    return ', '.join(names)
  return ', '.join(names[:shown - 1]) + f', … ({len(names) - shown} more), ' + names[-1]


def _per_device(e) -> str | None:
  """The shard of a residual each device keeps, e.g. ``f32[8,16] 512 B/device``."""
  if e.per_device_aval is None:
    return None
  return f'{e.per_device_aval} {format_bytes(e.per_device_bytes)}/device'
