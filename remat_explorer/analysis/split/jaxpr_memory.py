"""Peak memory of a jaxpr, modelled without compiling it.

A liveness model of what XLA would hold, read from the jaxpr alone:

* A value is allocated when its equation runs and freed after its last use;
  the jaxpr's inputs belong to its caller.
* What XLA fuses is not materialised: a value made by an elementwise-like
  equation (arithmetic, broadcasts, slices, transposes, ...) and read only by
  such equations or reductions in the same jaxpr lives inside a fusion. A
  value read by anything else (a dot, a convolution, a loop, a call), or
  returned, is materialised.
* Views share their input's buffer (``reshape``, ``checkpoint_name``,
  ``optimization_barrier``, ...); an in-place update (``dynamic_update_slice``,
  a scatter) and an elementwise equation write over an operand of the same
  size that dies there, as XLA's buffer assignment does.
* A call (``pjit``, a remat block, ``custom_jvp_call``) adds its body's own
  peak while it runs; a ``cond`` its largest branch's. A ``scan`` allocates
  its stacked outputs and its carry when it starts (on the CPU, when the
  program does) and adds its body's peak (the body's stacked outputs
  written in place) while it runs; a ``while`` the same without stacked
  outputs.
* What the platform's backend adds or splits apart that the jaxpr does not
  say (``backend.py``: on the CPU, convolution operands copied into its
  layout, values its reductions do not fuse, cheap values repeated in their
  readers) is added as it would run.

Equations run in the jaxpr's order, which XLA's scheduler is free to change:
this is a model, not a measurement (``bench/estimates.py`` measures how far
from XLA's compiled peak it lands).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Var, jaxprs_in_params

from remat_explorer.analysis.source.origins import CALL_PRIMITIVES
from remat_explorer.analysis.split.backend import (GENERIC, Backend,
                                                   convolution_operands_to_copy,
                                                   reads_minor_broadcast)
from remat_explorer.analysis.units import aval_bytes
from remat_explorer.engine import in_backward_pass, in_recompute, scan_consts_and_carries

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
_EXPENSIVE = frozenset('''
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
_LOOPS_AND_BRANCHES = frozenset(('scan', 'while', 'cond'))
# What the operations XLA adds (``backend.py``) are, as `_kind` says: a
# layout copy fuses what makes its operand and is materialised.
ADDED_KINDS = {'layout copy': 'reduction'}
# Equations that write into their first operand where it dies.
_IN_PLACE = frozenset('''
    dynamic_update_slice scatter scatter-add scatter_add scatter-mul
    scatter_mul scatter-min scatter_min scatter-max scatter_max'''.split())


def value_bytes(atom) -> int:
  """Bytes of one value of a jaxpr."""
  return aval_bytes(atom.aval)


def _true_rank(aval) -> int:
  """How many of a value's dimensions are longer than one."""
  return sum(d != 1 for d in getattr(aval, 'shape', ()))


def _as_jaxpr(jaxpr: Jaxpr | ClosedJaxpr) -> Jaxpr:
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
  return None if body is None else _as_jaxpr(body)


# A value of the flattened program is keyed by a number, one per variable
# of each inlined call (a body called twice has two sets), or, for a copy
# XLA adds, by ('layout copy', the value it copies, the operand position).


@dataclass(slots=True)
class _Op:
  """One equation of a jaxpr with its calls inlined, reading and writing
  values by key; `in_backward`: its name stack (the calls' around it
  included) is the backward pass's, not remat's recompute. An
  operation XLA adds that the jaxpr does not have (``backend.py``) has no
  equation: `added` says what it is and `added_bytes` what it writes."""
  eqn: JaxprEqn | None
  reads: list
  writes: list
  in_backward: bool = False
  added: str = ''
  added_bytes: int = 0
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

  def output_bytes(self) -> list[int]:
    if self.added:
      return [self.added_bytes]
    return [value_bytes(v) for v in self.eqn.outvars]

  def running_bytes(self, backend: Backend) -> int:
    name = self.name
    # Fusible equations and reductions have no bodies; a scatter's combiner
    # works on scalars.
    if (self.added or self.kind != 'materialising' or name in _IN_PLACE
        or not (name in _LOOPS_AND_BRANCHES or any(jaxprs_in_params(self.eqn.params)))):
      return 0
    return _running_bytes(self.eqn, backend)


def _flatten(jaxpr: Jaxpr, env: dict, counter, ops: list, inputs: set,
             scope: str = '', scopes: dict | None = None) -> None:
  """Append `jaxpr`'s equations to `ops`, calls inlined. `env` holds the
  key of each variable of `jaxpr` bound so far (its inputs'), and gains
  the others' as they are made: fresh numbers from `counter`."""
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
          stack, where, in_backward_pass(where) and not in_recompute(where))
    _, where, in_backward = spelled
    if body is None:
      writes = [next(counter) for _ in eqn.outvars]
      env.update(zip(eqn.outvars, writes))
      ops.append(_Op(eqn, reads, writes, in_backward))
      continue
    # A literal argument is a value nothing makes: a fresh key.
    inner_env = {v: next(counter) if k is None else k for v, k in zip(body.invars, reads)}
    _flatten(body, inner_env, counter, ops, inputs, where, scopes)
    for out, result in zip(eqn.outvars, body.outvars):
      env[out] = inner_env[result] if isinstance(result, Var) else None


def _in_schedule_order(ops: list[_Op]) -> list[_Op]:
  """The equations in the order XLA's scheduler runs them, as modelled:
  everything that does not wait for the backward pass first, in program
  order. Remat's recompute outside a loop waits only for its inputs (the
  barrier that keeps XLA from merging it with the forward pass does not
  tie it to the backward pass), and XLA runs it early, keeping its results
  from then on; inside a loop body it runs at the start of each iteration.
  """
  waiting: set = set()
  early, late = [], []
  for op in ops:
    if op.is_backward() or not waiting.isdisjoint(op.reads):
      late.append(op)
      waiting.update(op.writes)
    else:
      early.append(op)
  return early + late


def _with_layout_copies(ops: list[_Op]) -> list[_Op]:
  """`ops` with the copies XLA:CPU makes of convolution operands that are
  not in its layout (``backend.py``): each made right after its operand
  (a cheap elementwise one computed again in the copy, from what it reads),
  and read by the convolution in the operand's place."""
  made_at = {k: i for i, op in enumerate(ops) for k in op.writes}
  copies: dict = {}
  after: dict[int, list[_Op]] = {}  # -1: before everything (an input)
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
                    and maker.name not in _EXPENSIVE)
        reads = [k for k in maker.reads if k is not None] if repeated else [source]
        copies[key] = _Op(None, reads, [key], maker.in_backward if maker else False,
                          added='layout copy',
                          added_bytes=value_bytes(op.eqn.invars[position]))
        after.setdefault(at, []).append(copies[key])
      op.reads[position] = key
  if not copies:
    return ops
  placed = list(after.get(-1, []))
  for i, op in enumerate(ops):
    placed += [op, *after.get(i, [])]
  return placed


class _Scope:
  """The buffers of one jaxpr, calls inlined: which values share one, which
  are materialised, and where each dies."""

  def __init__(self, jaxpr: Jaxpr, count_outputs: bool, uncounted=(),
               backend: Backend = GENERIC):
    counter = itertools.count()
    env: dict = {v: next(counter) for v in jaxpr.invars}
    inputs: set = set(env.values())
    self.ops: list[_Op] = []
    _flatten(jaxpr, env, counter, self.ops, inputs)
    if backend.convolution_layouts:
      self.ops = _with_layout_copies(self.ops)
    self.ops = _in_schedule_order(self.ops)
    self.root: dict = {}
    size: dict = {}  # root -> its bytes
    outputs = [env[v] for v in jaxpr.outvars if isinstance(v, Var)]
    self.live = self._live_ops(outputs)
    fused_reader: dict = {}  # root -> read only by fusing equations
    last_fused_read: dict = {}  # root -> the last fusing equation that reads it
    readers: dict = {}
    self.last_use: dict = {}
    self.made_by: dict = {}  # root -> the operation that writes it
    root = self.root.get
    for i, op in enumerate(self.ops):
      if not self.live[i]:
        continue
      kind = op.kind
      op.roots = {root(k, k) for k in op.reads if k is not None}
      for r in op.roots:
        self.last_use[r] = i
        fused_reader[r] = fused_reader.get(r, True) and kind != 'materialising'
        if kind != 'materialising':
          last_fused_read[r] = i
        readers[r] = readers.get(r, 0) + 1
      if op.is_view() and op.reads[0] is not None:
        for out, source in zip(op.writes, op.reads):
          if source is not None:
            self.root[out] = self.of(source)
        continue
      for out, out_bytes in zip(op.writes, op.output_bytes()):
        size[out] = out_bytes
        self.made_by[out] = op
    self.outputs = {self.of(k) for k in outputs}
    for r in self.outputs:
      self.last_use[r] = len(self.ops)
    # A value inside a fusion: made and read by fusing equations, not
    # returned; XLA repeats a cheap producer in each reader, not an
    # expensive one.
    self.materialised = {
        k: not (op.kind == 'fusible' and fused_reader.get(k, True) and k not in self.outputs
                and (readers.get(k, 0) <= 1 or op.name not in _EXPENSIVE))
        for k, op in self.made_by.items()}
    if not backend.reductions_fuse_minor_broadcasts:
      self._split_minor_broadcasts()
    # What a fused value reads must live until its last reader runs; so
    # must what a cheap value XLA repeats in its fusing readers reads, though
    # it is also made apart for the others (``backend.py``).
    for i in reversed(range(len(self.ops))):
      op = self.ops[i]
      if not self.live[i]:
        continue
      ends = [self.last_use[k] for k in op.writes
              if k not in self.root and k in self.last_use
              and not self.materialised.get(k, True)]
      if backend.repeats_cheap_values and self._repeated_in_fusions(op):
        ends += [last_fused_read[k] for k in op.writes if k in last_fused_read]
      for r in op.roots if ends else ():
        self.last_use[r] = max(self.last_use[r], *ends)
    inputs = {self.of(k) for k in inputs}
    uncounted = {self.of(env[jaxpr.outvars[i]])
                 for i in uncounted if isinstance(jaxpr.outvars[i], Var)}
    # The bytes of each buffer this scope allocates itself.
    self.bytes = {k: n for k, n in size.items()
                  if self.materialised[k] and k not in inputs and k not in uncounted
                  and (count_outputs or k not in self.outputs)}

  def _repeated_in_fusions(self, op: _Op) -> bool:
    """Whether XLA computes `op`'s value again inside each fusion that
    reads it, though a reader that does not fuse (a dot, a loop) has it made
    apart (``backend.py``): a cheap elementwise equation with one operand of
    its result's size (one broadcast to it counted by what it broadcasts),
    made by an equation XLA does not fuse. Repeating it reads no more
    than reading its result would."""
    if op.added or op.kind != 'fusible' or op.name in _EXPENSIVE or op.is_view():
      return False
    full = _true_rank(op.eqn.outvars[0].aval)
    large = []
    for k, var in zip(op.reads, op.eqn.invars):
      if k is None:
        continue
      maker = self.made_by.get(self.of(k))
      if maker is not None and not maker.added and maker.name == 'broadcast_in_dim':
        var = maker.eqn.invars[0]
      if _true_rank(var.aval) >= full:
        large.append(maker)
    return (len(large) == 1 and large[0] is not None
            and large[0].kind == 'materialising')

  def _split_minor_broadcasts(self) -> None:
    """Materialise each value a reduction would fuse that reads a broadcast
    along the minor dimension (``backend.py``)."""
    seen: set = set()  # walked already, from any reduction: same answer
    for i, op in enumerate(self.ops):
      if not self.live[i] or op.added or op.kind != 'reduction':
        continue
      fused = list(op.roots)
      while fused:
        k = fused.pop()
        if k in seen or self.materialised.get(k, True):
          continue  # made apart already: the fusion stops there
        seen.add(k)
        maker = self.made_by[k]
        if self._reads_minor_broadcast(maker):
          self.materialised[k] = True
        else:
          fused += maker.roots

  def _reads_minor_broadcast(self, op: _Op) -> bool:
    if op.added:
      return False
    makers = [self.made_by.get(self.of(k)) if k is not None else None for k in op.reads]
    return reads_minor_broadcast(
        op.eqn, [m.eqn if m is not None and not m.added else None for m in makers])

  def _live_ops(self, outputs) -> list[bool]:
    """Which equations feed an output or have effects; XLA drops the rest."""
    used = set(outputs)
    live = []
    for op in reversed(self.ops):
      live.append(op.has_effects() or not used.isdisjoint(op.writes))
      if live[-1]:
        used.update(k for k in op.reads if k is not None)
    return live[::-1]

  def of(self, k):
    return self.root.get(k, k)

  def allocated(self, k) -> int:
    """Bytes the buffer rooted at `k` takes in this scope."""
    return self.bytes.get(k, 0)


def peak_bytes(jaxpr: Jaxpr | ClosedJaxpr, *, count_outputs: bool = True,
               uncounted=(), backend: Backend = GENERIC) -> int:
  """The most bytes of values `jaxpr` makes that are live at once while it
  runs (its inputs not counted: its caller holds them); its outputs
  included unless `count_outputs` is False (the program's outputs, which XLA
  places apart); the outputs at positions `uncounted` never (a loop body's
  stacked outputs, written into the loop's buffer). `backend`: the rules of
  the platform it will run on (``backend.py``)."""
  scope = _Scope(_as_jaxpr(jaxpr), count_outputs, uncounted, backend)
  dies_at: dict[int, list] = {}
  for r, i in scope.last_use.items():
    dies_at.setdefault(i, []).append(r)
  allocated, root, last_use = scope.bytes.get, scope.root, scope.last_use
  # On the CPU every loop's state is made when the program starts (``backend.py``).
  early = _loop_state(scope) if backend.loop_state_made_first else set()
  live = sum(allocated(k, 0) for k in early)
  peak = 0
  for i, (op, is_live) in enumerate(zip(scope.ops, scope.live)):
    if not is_live:
      continue
    dying = dies_at.get(i, ())
    outs = [k for k in op.writes if k not in root and k not in early]
    new = never_read = 0
    for k in outs:
      n = allocated(k, 0)
      new += n
      if k not in last_use:
        never_read += n
    reused = _reused_bytes(op, scope, outs, dying) if new else 0
    peak = max(peak, live + new - reused + op.running_bytes(backend))
    live += new - never_read
    for r in dying:
      live -= allocated(r, 0)
  return peak


def _loop_state(scope: _Scope) -> set:
  """The buffers of every ``scan``'s carry and stacked outputs that
  something reads after it."""
  return {k for op, is_live in zip(scope.ops, scope.live)
          if is_live and op.name == 'scan' and not op.added
          for k in op.writes
          if k not in scope.root and k in scope.last_use and scope.allocated(k)}


def _reused_bytes(op: _Op, scope: _Scope, outs, dying) -> int:
  """Bytes of a dying operand an output is written over."""
  if not outs or not scope.allocated(outs[0]):
    return 0
  operands = op.roots
  if op.name in _IN_PLACE and op.reads[0] is not None:
    operand = scope.of(op.reads[0])
    return scope.allocated(operand) if operand in dying else 0
  if op.kind == 'fusible':
    size = scope.allocated(outs[0])
    return size if any(scope.allocated(r) == size for r in dying
                       if r in operands) else 0
  return 0


def _running_bytes(eqn: JaxprEqn, backend: Backend) -> int:
  """What a loop or branch holds while it runs beyond its outputs: its
  body's own peak."""
  name, params = eqn.primitive.name, eqn.params
  if name == 'scan':
    body = _as_jaxpr(params['jaxpr'])
    # The stacked outputs are written in place, a slice per iteration.
    _, num_carry = scan_consts_and_carries(params)
    return peak_bytes(body, uncounted=range(num_carry, len(body.outvars)),
                      backend=backend)
  if name == 'while':
    return max(peak_bytes(params['body_jaxpr'], backend=backend),
               peak_bytes(params['cond_jaxpr'], backend=backend))
  if name == 'cond':
    return max(peak_bytes(b, backend=backend) for b in params['branches'])
  return max((peak_bytes(b, backend=backend) for b in jaxprs_in_params(params)),
             default=0)
