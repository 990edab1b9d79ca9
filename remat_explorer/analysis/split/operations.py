"""The equations of a jaxpr as the liveness model of ``jaxpr_memory.py``
reads them: calls inlined into one list of operations, each reading and
writing values by key, in the order XLA's scheduler runs them, with the
operations XLA:CPU adds that the jaxpr does not have (``backend.py``:
convolution operands copied into its layout, broadcasts both passes
share), and what an elementwise equation computes, by which XLA's CSE
merges equal ones."""

from __future__ import annotations

from dataclasses import dataclass, field

from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Var

from remat_explorer.analysis.source.origins import CALL_PRIMITIVES
from remat_explorer.analysis.split.backend import convolution_operands_to_copy
from remat_explorer.analysis.units import aval_bytes
from remat_explorer.engine import in_backward_pass, in_recompute

# Equations XLA fuses with their producers and consumers: one output element
# from a few input elements.
_FUSIBLE = frozenset('''
    add add_any sub mul div rem max min neg abs sign floor ceil round square
    is_finite clamp eq ne lt le gt ge and or xor not shift_left
    shift_right_logical shift_right_arithmetic population_count clz
    exp exp2 log log1p expm1 pow sqrt rsqrt cbrt tanh sin cos
    tan atan atan2 erf erfc erf_inv logistic asin acos sinh cosh asinh acosh
    atanh lgamma digamma nextafter integer_pow select_n convert_element_type
    broadcast_in_dim transpose slice dynamic_slice concatenate pad iota rev
    copy copy_p stop_gradient real imag complex conj squeeze expand_dims
    reshape'''.split())
# Elementwise equations XLA does not repeat in each reader of their result.
EXPENSIVE = frozenset('''
    div rem exp exp2 log log1p expm1 pow sqrt rsqrt cbrt tanh sin cos tan atan
    atan2 erf erfc erf_inv logistic asin acos sinh cosh asinh acosh atanh
    lgamma digamma integer_pow'''.split())
# Equations that fuse what feeds them but whose result XLA materialises.
_REDUCTIONS = frozenset('''
    reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or
    reduce_xor argmax argmin'''.split())
# Equations whose outputs are their inputs' buffers.
_VIEWS = frozenset('''
    name reduce_precision optimization_barrier pvary sharding_constraint mesh_cast reshard
    device_put'''.split())
LOOPS_AND_BRANCHES = frozenset(('scan', 'while', 'cond'))
# What the operations XLA adds (``backend.py``) are, as `_kind` says: a
# layout copy or a shared broadcast fuses what makes its operand and is
# materialised.
ADDED_KINDS = {'layout copy': 'reduction', 'shared broadcast': 'reduction'}
# The fewest elements of a value whose broadcast XLA:CPU's fusion of a dot
# with the elementwise work on its result reads made apart (``backend.py``).
DOT_FUSION_MIN_ELEMENTS = 4096
# Equations that write into their first operand where it dies.
IN_PLACE = frozenset('''
    dynamic_update_slice scatter scatter-add scatter_add scatter-mul
    scatter_mul scatter-min scatter_min scatter-max scatter_max'''.split())


def value_bytes(atom) -> int:
  """Bytes of one value of a jaxpr."""
  return aval_bytes(atom.aval)


def as_jaxpr(jaxpr: Jaxpr | ClosedJaxpr) -> Jaxpr:
  return jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr


def _is_view(eqn: JaxprEqn) -> bool:
  name = eqn.primitive.name
  if name in _VIEWS or name in ('reshape', 'squeeze', 'expand_dims'):
    return True
  return (name == 'convert_element_type'
          and eqn.invars[0].aval.dtype == eqn.outvars[0].aval.dtype)


def _kind(eqn: JaxprEqn) -> str:
  """'fusible', 'reduction' or 'materialising'."""
  name = eqn.primitive.name
  if name in _FUSIBLE or (name in _VIEWS and name != 'optimization_barrier'):
    return 'fusible'
  if name in _REDUCTIONS:
    return 'reduction'
  return 'materialising'


def _call_body(eqn: JaxprEqn) -> Jaxpr | None:
  """The body of a call XLA inlines (``pjit``, a remat block, ...)."""
  param = CALL_PRIMITIVES.get(eqn.primitive.name)
  body = eqn.params.get(param) if param else None
  return None if body is None else as_jaxpr(body)


# A value of the flattened program is keyed by a number, one per variable
# of each inlined call (a body called twice has two sets); a value XLA adds
# by what it is: ('layout copy', the value it copies, the operand
# position), or ('shared broadcast', (the value broadcast, shape, dtype,
# whether read behind a barrier)).


@dataclass(slots=True)
class Op:
  """One equation of a jaxpr with its calls inlined, reading and writing
  values by key; `in_backward`: its name stack (the calls' around it
  included) is the backward pass's, not remat's recompute;
  `in_recompute`: it is remat's recompute. An
  operation XLA adds that the jaxpr does not have (``backend.py``) has no
  equation: `added` says what it is and `added_bytes` what it writes."""
  eqn: JaxprEqn | None
  reads: list
  writes: list
  in_backward: bool = False
  in_recompute: bool = False
  added: str = ''
  added_bytes: int = 0
  fenced: frozenset = frozenset()
  """The keys it reads through remat's optimization barrier (the inputs
  of a differentiated block that prevents CSE): values XLA cannot merge
  with the same computation outside the block."""
  name: str = field(init=False)
  kind: str = field(init=False)
  """'fusible', 'reduction' or 'materialising' (see ``_kind``)."""
  roots: frozenset | set = field(init=False, default=frozenset())
  """The buffers it reads (a view's is its source's), once `_Scope` knows."""

  def __post_init__(self):
    self.name = self.added or self.eqn.primitive.name
    self.kind = ADDED_KINDS[self.added] if self.added else _kind(self.eqn)

  def is_backward(self) -> bool:
    """A backward-pass equation that is not remat's recompute."""
    return self.in_backward and self.name != 'optimization_barrier'

  def is_view(self) -> bool:
    return not self.added and _is_view(self.eqn)

  def has_effects(self) -> bool:
    return not self.added and bool(self.eqn.effects)

  def output_bytes(self, stored_bytes=aval_bytes) -> list[int]:
    """What each output takes, `stored_bytes` of its abstract value."""
    if self.added:
      return [self.added_bytes]
    return [stored_bytes(v.aval) for v in self.eqn.outvars]


def flatten(jaxpr: Jaxpr, env: dict, counter, ops: list, inputs: set,
             scope: str = '', scopes: dict | None = None,
             fenced: frozenset = frozenset()) -> None:
  """Append `jaxpr`'s equations to `ops`, calls inlined. `env` holds the
  key of each variable of `jaxpr` bound so far (its inputs'), and gains
  the others' as they are made: fresh numbers from `counter`. `fenced`:
  the keys behind an optimization barrier around `jaxpr`."""
  for v in jaxpr.constvars:
    env[v] = next(counter)
    inputs.add(env[v])
  # Equations share name stacks: each is spelled out and read once (keyed
  # by identity, the stack kept alive here).
  scopes = {} if scopes is None else scopes
  for eqn in jaxpr.eqns:
    reads = [env[v] if isinstance(v, Var) else None for v in eqn.invars]
    body = _call_body(eqn)
    stack = eqn.source_info.name_stack
    spelled = scopes.get((id(stack), scope))
    if spelled is None:
      where = f'{scope}/{stack}'
      spelled = scopes[id(stack), scope] = (
          stack, where, in_backward_pass(where) and not in_recompute(where),
          in_recompute(where))
    _, where, in_backward, recompute = spelled
    if body is None:
      writes = [next(counter) for _ in eqn.outvars]
      env.update(zip(eqn.outvars, writes))
      ops.append(Op(eqn, reads, writes, in_backward, recompute, fenced=fenced))
      continue
    # A literal argument is a value nothing makes: a fresh key.
    inner_env = {v: next(counter) if k is None else k for v, k in zip(body.invars, reads)}
    flatten(body, inner_env, counter, ops, inputs, where, scopes,
             fenced | _behind_barrier(eqn, reads))
    for out, result in zip(eqn.outvars, body.outvars):
      env[out] = inner_env[result] if isinstance(result, Var) else None


def _behind_barrier(eqn: JaxprEqn, reads) -> frozenset:
  """The keys a call reads through an optimization barrier: a remat
  block's, once differentiated, where it prevents CSE."""
  params = eqn.params
  if 'prevent_cse' not in params or not params.get('differentiated'):
    return frozenset()
  prevent = params['prevent_cse']
  flags = prevent if isinstance(prevent, tuple) else (prevent,) * len(reads)
  return frozenset(k for k, flag in zip(reads, flags) if flag and k is not None)


def computation_key(op: Op, root):
  """What an elementwise equation computes, as a key equal for two that
  compute the same value: its primitive, parameters, operands (a value
  read through remat's barrier is another operand than the same value
  outside it) and result type; None for any other equation. `root` maps a
  key to the buffer it views. XLA's CSE on a GPU (``backend.py``)."""
  if op.added or op.kind != 'fusible' or len(op.writes) != 1 or op.has_effects():
    return None
  operands = tuple((root(k, k), k in op.fenced) if k is not None else repr(v.val)
                   for k, v in zip(op.reads, op.eqn.invars))
  out = op.eqn.outvars[0].aval
  params = tuple(sorted(op.eqn.params.items()))
  try:
    hash(params)
  except TypeError:  # a parameter that is not hashed: compared as it prints
    params = repr(params)
  return op.name, params, operands, out.shape, out.dtype


def in_schedule_order(ops: list[Op], *, depth_first: bool) -> list[Op]:
  """The equations in the order XLA:CPU's scheduler runs them, as
  modelled: everything that does not wait for the backward pass first,
  remat's recompute included, in the depth-first order of XLA's memory
  scheduler (with `depth_first`, else in program order), then the backward
  pass in program order (``backend.py``)."""
  waiting: set = set()
  late: list[Op] = []
  for op in ops:
    if op.is_backward() or not waiting.isdisjoint(op.reads):
      late.append(op)
      waiting.update(op.writes)
  late_ids = {id(op) for op in late}
  first = _depth_first(ops) if depth_first else ops
  return [op for op in first if id(op) not in late_ids] + late


def _depth_first(ops: list[Op]) -> list[Op]:
  """`ops` in the order of XLA's depth-first memory scheduler, which
  XLA:CPU schedules with: a post-order walk from what nothing reads, that
  takes the operands of each equation with the most other readers in
  their subgraph first, then the most bytes in it, then (where XLA
  compares instruction names) the one earlier in the program."""
  made_by = {k: i for i, op in enumerate(ops) for k in op.writes}
  operands = [sorted({made_by[k] for k in op.reads if k in made_by}) for op in ops]
  readers = [0] * len(ops)
  for found in operands:
    for i in found:
      readers[i] += 1
  # XLA's statistics of each subgraph, capped as it caps them.
  extra_readers, subgraph_bytes, bytes_so_far = [0] * len(ops), [0] * len(ops), 0
  for i, op in enumerate(ops):
    own = sum(op.output_bytes())
    bytes_so_far += own
    extra_readers[i] = min(max(0, readers[i] - 1) + sum(extra_readers[j] for j in operands[i]),
                           len(ops))
    subgraph_bytes[i] = min(own + sum(subgraph_bytes[j] for j in operands[i]), bytes_so_far)

  def first(i):
    return -extra_readers[i], -subgraph_bytes[i], i
  order: list[Op] = []
  seen = [False] * len(ops)
  stack = [(i, False) for i in sorted((i for i in range(len(ops)) if not readers[i]),
                                      key=first, reverse=True)]
  while stack:  # iterative: a program's chains run deeper than Python's stack
    i, walked = stack.pop()
    if walked:  # its operands are placed
      order.append(ops[i])
    elif not seen[i]:
      seen[i] = True
      stack.append((i, True))
      stack.extend((j, False) for j in sorted(operands[i], key=first, reverse=True)
                   if not seen[j])
  return order


def with_layout_copies(ops: list[Op]) -> list[Op]:
  """`ops` with the copies XLA:CPU makes of convolution operands that are
  not in its layout (``backend.py``): each made right after its operand
  (a cheap elementwise one computed again in the copy, from what it reads),
  and read by the convolution in the operand's place."""
  made_at = {k: i for i, op in enumerate(ops) for k in op.writes}
  copies: dict = {}
  after: dict[int, list[Op]] = {}  # -1: before everything (an input)
  for op in ops:
    for position in convolution_operands_to_copy(op.eqn) if not op.added else ():
      source = op.reads[position]
      if source is None:
        continue
      key = ('layout copy', source, position)
      if key not in copies:
        at = made_at.get(source, -1)
        maker = ops[at] if at >= 0 else None
        # A cheap elementwise operand is computed again inside the copy.
        repeated = (maker is not None and not maker.added and maker.kind == 'fusible'
                    and maker.name not in EXPENSIVE)
        reads = [k for k in maker.reads if k is not None] if repeated else [source]
        copies[key] = Op(None, reads, [key], maker.in_backward if maker else False,
                         maker.in_recompute if maker else False, added='layout copy',
                         added_bytes=value_bytes(op.eqn.invars[position]))
        after.setdefault(at, []).append(copies[key])
      op.reads[position] = key
  return _with_added(ops, after)


def with_shared_broadcasts(ops: list[Op], *, dot_fusions: bool) -> list[Op]:
  """`ops` with one buffer for each broadcast that both passes make of the
  same value to the same shape (``backend.py``: XLA's CSE makes them one
  value, which it makes apart), placed before its first reader and read by
  each in the broadcast's place, where an equation of broadcasts alone
  reads it or, with `dot_fusions`, one the backward pass fuses into a dot
  (``backend.py``: a broadcast a dot's fusion reads). A broadcast is a
  ``broadcast_in_dim`` or an operand an elementwise equation broadcasts to
  its result's shape; a value read through remat's optimization barrier is
  another value to CSE than the same one outside it."""
  source_of: dict = {}  # key -> the key it views
  uses: dict = {}  # (source, shape, dtype, fenced) -> [(op index, operand position)]
  made_apart: set = set()  # the keys XLA:CPU makes apart when both passes read them
  dot_outputs: set = set()
  for i, op in enumerate(ops):
    if op.added:
      continue
    if op.name == 'dot_general':
      dot_outputs.update(op.writes)
    if op.is_view():
      for out, source in zip(op.writes, op.reads):
        if source is not None:
          source_of[out] = source_of.get(source, source)
      continue
    if op.kind != 'fusible' or len(op.eqn.outvars) != 1:
      continue
    out = op.eqn.outvars[0].aval
    positions = (0,) if op.name == 'broadcast_in_dim' else range(len(op.reads))
    smaller = [aval_bytes(op.eqn.invars[p].aval) < aval_bytes(out) for p in positions]
    outer = op.name != 'broadcast_in_dim' and len(smaller) > 1 and all(smaller)
    # XLA:CPU fuses a dot with the elementwise work on its result, and such
    # a fusion reads its broadcast operands of enough elements made apart.
    dot_epilogue = dot_fusions and op.is_backward() and any(
        source_of.get(k, k) in dot_outputs for k in op.reads if k is not None)
    for position, broadcast in zip(positions, smaller):
      k = op.reads[position]
      if k is None or not broadcast:
        continue
      source = source_of.get(k, k)
      key = (source, out.shape, out.dtype, source in op.fenced or k in op.fenced)
      uses.setdefault(key, []).append((i, position))
      if outer or (dot_epilogue
                   and op.eqn.invars[position].aval.size >= DOT_FUSION_MIN_ELEMENTS):
        made_apart.add(key)
  after: dict[int, list[Op]] = {}
  for key, readers in uses.items():
    if key not in made_apart or len({ops[i].is_backward() for i, _ in readers}) < 2:
      continue
    first = ops[readers[0][0]]
    shared = Op(None, [key[0]], [('shared broadcast', key)], added='shared broadcast',
                added_bytes=value_bytes(first.eqn.outvars[0]))
    after.setdefault(readers[0][0] - 1, []).append(shared)
    for i, position in readers:
      ops[i].reads[position] = shared.writes[0]
  return _with_added(ops, after)


def _with_added(ops: list[Op], after: dict[int, list[Op]]) -> list[Op]:
  """`ops` with the operations `after` places after each index (-1:
  before the first)."""
  if not after:
    return ops
  placed = list(after.get(-1, []))
  for i, op in enumerate(ops):
    placed += [op, *after.get(i, [])]
  return placed
