"""The split of each remat block as a plain graph, for diagrams.

``split_graph_of(report)`` turns each block's two jaxprs into nodes and
edges that carry everything a diagram shows, so that rendering needs
nothing from JAX: per equation its primitive, output types, FLOPs, whether
the backward pass recomputes it, its ``checkpoint_name``, its line of the
user's code and module path, and the group it belongs to in the user's
terms (``group``: the module path below the block's, such as
``('attention', 'query')``, shown as ``blocks/attention/query``, then the
user's calls inside that module; or, for a program whose parameters name
no modules, the user's functions the block calls, such as
``('_attention',)``; see ``grouping.Grouping``). A ``checkpoint_name``, and the
rounding the split puts on a residual, compute nothing: they are drawn as
part of the node that made the value, which carries the name. Residual
edges carry the index of the block residual they are
(``BlockReport.residuals``), its bytes, name and per-device shard.

Calls inside a block (``jit``, custom derivatives, nested blocks) are one
node with their equations as nodes of their own (``parent``), so a diagram
can open them. Blocks whose splits are alike (the layers of an unrolled
model) are drawn once (``GraphBlock.alike``). The values the program saves
outside every block (an un-checkpointed head's output) make one more
``GraphBlock`` (``outside``): a node per value and its producer, grouped
by module path or the user's function, and a residual edge each.

Node ids are stable: ``f<i>_e<j>`` / ``b<i>_e<j>`` is equation ``j`` of the
``i``-th drawn block's forward / backward jaxpr, ``..._i<k>`` an input,
``..._o<k>`` an output, and ``<id>_j<k>_e<j>`` an equation inside the
``k``-th jaxpr of a call; ``f_outside_r<k>`` / ``b_outside_r<k>`` the
producer and the saved value of ``RematReport.residuals[k]`` outside the
blocks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.extend.core import Literal, jaxprs_in_params

from remat_explorer.analysis.split import flops as flop_count
from remat_explorer.analysis.source.origins import CodeSite, user_site, user_site_within
from remat_explorer.analysis.split.block_split import block_split
from remat_explorer.analysis.split.grouping import Grouping, outside_group
from remat_explorer.analysis.split.report import BlockReport, RematReport, aval_text
from remat_explorer.engine import name_of_named_value

# Ops that map one array to one array of the same shape, element by element
# (binary ones qualify when their other operand is a literal): a chain of
# them can be folded into one node without hiding any data flow.
ELEMENTWISE = frozenset('''
    sin cos tan tanh asin acos atan sinh cosh asinh acosh atanh exp exp2 log
    log1p expm1 logistic erf erfc erf_inv lgamma digamma neg abs sign floor
    ceil round sqrt rsqrt cbrt square integer_pow convert_element_type
    reduce_precision copy copy_p real imag conj not is_finite stop_gradient
    add sub mul div max min pow rem add_any'''.split())

INPUT_ROLES = ('input', 'residual', 'saved', 'tangent', 'const')
MAX_CALL_EQUATIONS = 400
"""A call with more equations than this is one node that does not open."""


@dataclass(frozen=True)
class GraphNode:
  id: str
  block: int
  """Index of the block in ``SplitGraph.blocks``."""
  side: str
  """'forward' (the known jaxpr) or 'backward' (the staged one)."""
  kind: str
  """'input', 'output', 'eqn', or 'call' (an equation holding jaxprs)."""
  label: str
  """The primitive, a call's title (``scan ×8``, ``jit f``), or an input's
  or output's role in words."""
  types: str = ''
  """Output types (an input's type), e.g. ``f32[8,32]``."""
  role: str = ''
  """For inputs, one of ``INPUT_ROLES``; for outputs 'output' or
  'tangent out'."""
  flops: int = 0
  recomputed: bool = False
  """An equation the backward pass runs again instead of reading a residual."""
  name: str | None = None
  """Its ``checkpoint_name``."""
  site: CodeSite | None = None
  module_path: str = ''
  group: tuple[str, ...] = ()
  """Where it sits in the user's model or code, below the block: what a
  diagram groups by (see ``grouping.Grouping``)."""
  group_titles: tuple[str, ...] = ()
  """How each level of `group` is shown: a module by its full module path
  (``blocks/attention/query``), a function by its name."""
  group_classes: tuple[str, ...] = ()
  """For each level of `group` that is a module, its class where the call
  stack shows it (``Attention``, ``Linear``); '' for other levels."""
  parent: str | None = None
  """The call node it is inside, if any."""
  elementwise: bool = False
  """One array in, one of the same shape out, element by element."""
  equations: int = 1
  """Equations it stands for (a call's, all of them)."""


@dataclass(frozen=True)
class GraphEdge:
  src: str
  dst: str
  kind: str = 'data'
  """'data', 'residual' (forward to backward) or 'body' (call to its jaxpr)."""
  residual: int | None = None
  """For a residual edge: its index in the block's ``BlockReport.residuals``
  (outside any block: in ``RematReport.residuals``)."""
  bytes: int = 0
  name: str | None = None
  per_device_aval: str | None = None
  """In a sharded program, the shard each device keeps, e.g. ``f32[4,8]``."""
  per_device_bytes: int | None = None


@dataclass(frozen=True)
class GraphBlock:
  index: int
  name: str
  """The block's name (``BlockReport.name``)."""
  function: str
  module_path: str
  path: tuple[str, ...]
  trip_count: int | None
  policy: str
  residual_bytes: int
  recompute_flops: int
  recomputed: int
  """Equations the backward pass recomputes for one run of the block, those
  inside its calls and loops (a scan's body once) included."""
  alike: tuple[str, ...] = ()
  """Names of every block whose split this one stands for, itself first,
  when several are alike (the layers of an unrolled model)."""
  outside: bool = False
  """Not a block: the values the program computes and saves outside every
  remat block (``Residual.block`` None), each from its producer to the
  backward pass. The arguments the backward pass reads (``kind``
  'argument') are counted in `arguments`, not drawn: they are the
  program's inputs, held anyway, and the blocks that read them draw them
  as saved inputs."""
  arguments: tuple[int, int] = (0, 0)
  """For the outside block: how many arguments the backward pass reads
  outside the blocks' splits, and their bytes."""


@dataclass(frozen=True)
class SplitGraph:
  title: str
  blocks: tuple[GraphBlock, ...]
  nodes: tuple[GraphNode, ...]
  edges: tuple[GraphEdge, ...]
  notes: tuple[str, ...] = ()

  def node(self, node_id: str) -> GraphNode:
    return self._by_id[node_id]

  @property
  def _by_id(self) -> dict[str, GraphNode]:
    cache = self.__dict__.get('_nodes_by_id')
    if cache is None:
      cache = {n.id: n for n in self.nodes}
      object.__setattr__(self, '_nodes_by_id', cache)
    return cache


def split_graph_of(report: RematReport, block: str | None = None) -> SplitGraph:
  """The graph of `report`'s split blocks (or of the block named `block`);
  that of all blocks is built once per report and kept on it."""
  if block is None:
    kept = report.__dict__.get('_split_graph')
    if kept is None:
      kept = _build(report, None)
      object.__setattr__(report, '_split_graph', kept)
    return kept
  return _build(report, block)


def _build(report: RematReport, block: str | None) -> SplitGraph:
  chosen = _chosen_blocks(report, block)
  builder = _Builder(report.module_paths)
  groups = _alike_groups(chosen) if block is None else [[b] for b in chosen]
  for i, same in enumerate(groups):
    builder.add_block(i, same)
  if block is None:
    outside = [r for r in report.residuals if r.block is None]
    if any(r.kind != 'argument' for r in outside):
      builder.add_outside(len(groups), outside)
  notes = () if groups else ('no block was split by differentiation',)
  return SplitGraph(f'{report.function} · policy {report.policy}',
                    tuple(builder.blocks), tuple(builder.nodes), tuple(builder.edges),
                    notes)


def _chosen_blocks(report: RematReport, name: str | None) -> list[BlockReport]:
  if name is None:
    return [b for b in report.blocks if b.differentiated and b.known_jaxpr is not None]
  for b in report.blocks:
    if b.name == name:
      if not b.differentiated or b.known_jaxpr is None:
        raise ValueError(f'block {name!r} was not split by differentiation: no '
                         'differentiated input reaches it.')
      return [b]
  raise ValueError(f'no block named {name!r}; the report has '
                   f'{[b.name for b in report.blocks]}')


def _alike_groups(blocks: list[BlockReport]) -> list[list[BlockReport]]:
  """Blocks whose two jaxprs print the same, in program order."""
  groups: dict[tuple, list] = {}
  for b in blocks:
    key = (len(b.known_jaxpr.eqns), len(b.staged_jaxpr.eqns), b.policy)
    if key in groups and str(groups[key][0].known_jaxpr) == str(b.known_jaxpr) \
        and str(groups[key][0].staged_jaxpr) == str(b.staged_jaxpr):
      groups[key].append(b)
    else:
      groups.setdefault(key if key not in groups else (*key, id(b)), []).append(b)
  return list(groups.values())


class _Builder:

  def __init__(self, module_paths):
    self.module_paths = module_paths
    self.blocks: list[GraphBlock] = []
    self.nodes: list[GraphNode] = []
    self.edges: list[GraphEdge] = []
    self._position: dict[str, int] = {}  # node id -> index in `nodes`

  def add_block(self, i: int, same: list[BlockReport]) -> None:
    block = same[0]
    split = block_split(block)
    self.blocks.append(GraphBlock(
        i, block.name, block.function, block.module_path, block.path,
        block.trip_count, block.policy, block.residual_bytes,
        block.recompute_flops, len(block.recomputed),
        tuple(b.name for b in same) if len(same) > 1 else ()))
    grouping = Grouping(block, self.module_paths)
    first_node = len(self.nodes)
    known, staged = block.known_jaxpr, block.staged_jaxpr
    f_in, f_out = self._jaxpr(i, 'forward', f'f{i}', known, ['input'] * len(known.invars),
                              frozenset(), grouping)
    roles = ['residual'] * split.num_residuals + ['tangent'] * (
        len(staged.invars) - split.num_residuals)
    for _, s in split.saved_inputs:
      roles[s] = 'saved'
    b_in, b_out = self._jaxpr(i, 'backward', f'b{i}', staged, roles, split.recomputed,
                              grouping)
    n_out = split.num_known_outputs
    self._outputs(i, 'forward', f'f{i}', known.outvars[:n_out], f_out[:n_out], 'output')
    self._outputs(i, 'backward', f'b{i}', staged.outvars, b_out, 'tangent out')
    self._residual_edges(i, block, split, f_in, f_out, b_in)
    self.nodes[first_node:] = [
        n if not n.group else dataclasses.replace(n, **grouping.names(n.group))
        for n in self.nodes[first_node:]]

  def add_outside(self, i: int, residuals) -> None:
    """The values saved outside every block, as block `i`: per residual,
    its producer on the forward side (an equation, grouped by its module
    path or the user's function; a literal or constant as it is) and the
    saved value on the backward side, joined by a residual edge."""
    arguments = [r for r in residuals if r.kind == 'argument']
    computed = [r for r in residuals if r.kind != 'argument']
    self.blocks.append(GraphBlock(
        i, OUTSIDE_BLOCKS, '', '', (), None, '', sum(r.bytes for r in computed), 0, 0,
        outside=True, arguments=(len(arguments), sum(r.bytes for r in arguments))))
    for r in computed:
      types = aval_text(_aval(r.dtype, r.shape))
      src, dst = f'f_outside_r{r.index}', f'b_outside_r{r.index}'
      if r.kind == 'equation':
        group, titles = outside_group(r)
        self._add(GraphNode(src, i, 'forward', 'eqn', r.primitive or 'equation', types,
                            flops=r.producer_flops or 0, name=r.name, site=r.site,
                            module_path=r.module_path, group=group, group_titles=titles))
      else:
        self._add(GraphNode(src, i, 'forward', 'input', r.kind, types, role='const'))
      self._add(GraphNode(dst, i, 'backward', 'input', 'residual', types, role='residual'))
      local_aval = None
      if r.per_device_shape is not None:
        local_aval = aval_text(_aval(r.dtype, r.per_device_shape))
      self.edges.append(GraphEdge(src, dst, 'residual', r.index, r.bytes, r.name,
                                  local_aval, r.per_device_bytes))

  def _add(self, node: GraphNode) -> None:
    self._position[node.id] = len(self.nodes)
    self.nodes.append(node)

  def _fold(self, into: str, eqn, name: str | None) -> None:
    """Draw `eqn`, which only names or rounds a value, as part of the node
    that made the value: that node carries the name."""
    k = self._position[into]
    node = self.nodes[k]
    changes = {}
    if name is not None:
      changes.update(name=name, elementwise=False)
    if node.kind in ('eqn', 'call'):
      changes['equations'] = node.equations + 1
    self.nodes[k] = dataclasses.replace(node, **changes)

  # -- jaxprs ---------------------------------------------------------------------

  def _jaxpr(self, block, side, prefix, jaxpr, roles, recomputed, grouping,
             parent=None, context=None):
    env = {}
    for k, v in enumerate(jaxpr.constvars):
      env[v] = self._input(block, side, f'{prefix}_c{k}', v, 'const', parent)
    in_ids = [self._input(block, side, f'{prefix}_i{k}', v, role, parent)
              for k, (v, role) in enumerate(zip(jaxpr.invars, roles))]
    env.update(zip(jaxpr.invars, in_ids))
    for j, eqn in enumerate(jaxpr.eqns):
      nid = f'{prefix}_e{j}'
      made_by = _passes_on(eqn, env)
      if made_by is not None:
        self._fold(made_by, eqn, name_of_named_value(eqn))
        env.update((v, made_by) for v in eqn.outvars)
        continue
      self._add(self._equation(block, side, nid, eqn, j in recomputed,
                               grouping, parent, context))
      for src in dict.fromkeys(env[v] for v in eqn.invars
                               if not isinstance(v, Literal) and v in env):
        self.edges.append(GraphEdge(src, nid))
      subs = list(jaxprs_in_params(eqn.params))
      if subs and sum(len(s.eqns) for s in subs) <= MAX_CALL_EQUATIONS:
        here = eqn if user_site(eqn.source_info) is not None else context
        for k, sub in enumerate(subs):
          inner_in, _ = self._jaxpr(block, side, f'{nid}_j{k}', sub,
                                    ['input'] * len(sub.invars), frozenset(),
                                    grouping, nid, here)
          if inner_in:
            self.edges.append(GraphEdge(nid, inner_in[0], 'body'))
      env.update((v, nid) for v in eqn.outvars)
    outs = [None if isinstance(v, Literal) else env.get(v) for v in jaxpr.outvars]
    return in_ids, outs

  def _input(self, block, side, nid, v, role, parent) -> str:
    self._add(GraphNode(nid, block, side, 'input', _ROLE_TITLES[role],
                        aval_text(v.aval), role=role, parent=parent))
    return nid

  def _equation(self, block, side, nid, eqn, recomputed, grouping, parent,
                context) -> GraphNode:
    prim = eqn.primitive.name
    outs = [aval_text(v.aval) for v in eqn.outvars]
    types = ', '.join(outs[:3]) + (f', … ({len(outs)} outputs)' if len(outs) > 3 else '')
    site = user_site_within(eqn, () if context is None else (context,))
    subs = list(jaxprs_in_params(eqn.params))
    module_path, group = grouping.of(eqn, context)
    common = dict(types=types, flops=flop_count.eqn_flops(eqn), recomputed=recomputed,
                  site=site, module_path=module_path, group=group, parent=parent)
    if subs:
      return GraphNode(nid, block, side, 'call', _call_title(eqn),
                       equations=sum(_count(s) for s in subs), **common)
    name = name_of_named_value(eqn)
    operands = {v for v in eqn.invars if not isinstance(v, Literal)}
    elementwise = (prim in ELEMENTWISE and len(operands) == 1 and len(eqn.outvars) == 1
                   and getattr(next(iter(operands)).aval, 'shape', None)
                   == getattr(eqn.outvars[0].aval, 'shape', ()))
    return GraphNode(nid, block, side, 'eqn', prim, name=name,
                     elementwise=elementwise and name is None, **common)

  def _outputs(self, block, side, prefix, outvars, sources, title) -> None:
    for k, (v, src) in enumerate(zip(outvars, sources)):
      nid = f'{prefix}_o{k}'
      types = aval_text(v.aval) if not isinstance(v, Literal) else f'literal {v.val}'
      self._add(GraphNode(nid, block, side, 'output', title, types,
                          role='output' if side == 'forward' else 'tangent out'))
      if src is not None:
        self.edges.append(GraphEdge(src, nid))

  def _residual_edges(self, i, block, split, f_in, f_out, b_in) -> None:
    known, staged = block.known_jaxpr, block.staged_jaxpr
    n_out = split.num_known_outputs
    by_position = {r.position: k for k, r in enumerate(block.residuals)
                   if r.position is not None}
    for r, (v, src) in enumerate(zip(known.outvars[n_out:], f_out[n_out:])):
      if src is None:  # a literal residual: give it a node to start from
        src = f'f{i}_lit{r}'
        self._add(GraphNode(src, i, 'forward', 'input', 'literal',
                            str(getattr(v, 'val', '')), role='const'))
      self._residual_edge(src, b_in[r], block, by_position.get(r), v.aval)
    for k, (known_index, staged_index) in enumerate(split.saved_inputs):
      if known_index is None:  # read by the backward pass only
        src = f'f{i}_saved{k}'
        self._add(GraphNode(src, i, 'forward', 'input', 'block input',
                            aval_text(staged.invars[staged_index].aval), role='input'))
      else:
        src = f_in[known_index]
      self._residual_edge(src, b_in[staged_index], block,
                          by_position.get(staged_index), staged.invars[staged_index].aval)

  def _residual_edge(self, src, dst, block, index, aval) -> None:
    residual = None if index is None else block.residuals[index]
    local_aval = local_bytes = None
    if residual is not None and residual.per_device_shape is not None:
      local_aval = aval_text(aval.update(shape=residual.per_device_shape))
      local_bytes = residual.per_device_bytes
    self.edges.append(GraphEdge(
        src, dst, 'residual', index,
        residual.bytes if residual is not None else 0,
        residual.name if residual is not None else None, local_aval, local_bytes))


_ROLE_TITLES = {'input': 'input', 'residual': 'residual', 'saved': 'saved input',
                'tangent': 'tangent', 'const': 'constant'}

OUTSIDE_BLOCKS = 'outside remat blocks'
"""The name of the ``GraphBlock`` that holds the residuals saved outside
every block."""


def _passes_on(eqn, env) -> str | None:
  """For an equation that computes nothing, the node of the value it passes
  on: a ``checkpoint_name`` (the value is drawn with its name), or the
  rounding of a residual to its own dtype that the split adds."""
  if len(eqn.invars) != 1 or len(eqn.outvars) != 1 or isinstance(eqn.invars[0], Literal):
    return None
  if name_of_named_value(eqn) is None and not _rounds_to_own_dtype(eqn):
    return None
  return env.get(eqn.invars[0])


def _rounds_to_own_dtype(eqn) -> bool:
  if eqn.primitive.name != 'reduce_precision':
    return False
  try:
    info = jnp.finfo(eqn.outvars[0].aval.dtype)
  except (TypeError, ValueError, AttributeError):
    return False
  return (eqn.params.get('exponent_bits') == info.nexp
          and eqn.params.get('mantissa_bits') == info.nmant)


def _aval(dtype: str, shape) -> jax.core.ShapedArray:
  return jax.core.ShapedArray(tuple(shape), jnp.dtype(dtype))


def _call_title(eqn) -> str:
  prim, params = eqn.primitive.name, eqn.params
  if prim == 'scan':
    return f"scan ×{params.get('length')}"
  if prim == 'cond':
    return f"cond ({len(params.get('branches', ()))} branches)"
  name = params.get('name')
  return f'{prim} {name}' if isinstance(name, str) and name else prim


def _count(jaxpr) -> int:
  return sum(1 + sum(_count(s) for s in jaxprs_in_params(e.params)) for e in jaxpr.eqns)
