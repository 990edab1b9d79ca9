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
  ``optimization_barrier``, ...), and so does arithmetic XLA's simplifier
  removes (``x - zeros``, ``x * ones``: an RMS norm's mean); an in-place
  update (``dynamic_update_slice``, a scatter) and an elementwise equation
  write over an operand of the same size that dies there, as XLA's buffer
  assignment does.
* A call (``pjit``, a remat block, ``custom_jvp_call``) adds its body's own
  peak while it runs; a ``cond`` its largest branch's. A ``scan`` allocates
  its stacked outputs and its carry when it starts (on the CPU, when the
  program does) and adds its body's peak (the body's stacked outputs
  written in place) while it runs; a ``while`` the same without stacked
  outputs.
* What the platform's backend adds or splits apart that the jaxpr does not
  say (``backend.py``: on the CPU, convolution operands copied into its
  layout, values its reductions do not fuse, cheap values repeated in their
  readers, values both passes read; on a GPU, values remat's barrier reads
  and equal values merged) is added as it would run.

Equations run in the jaxpr's order (on the CPU, the forward pass with
remat's recompute moved into it, in the depth-first order of XLA's
scheduler; on a GPU, cheap values only the backward pass reads
made just before it reads them: ``backend.py``), which XLA's scheduler is
free to change:
this is a model, not a measurement (``bench/estimates.py`` measures how far
from XLA's compiled peak it lands).
"""

from __future__ import annotations

import itertools

import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var, jaxprs_in_params

from remat_explorer.analysis.split.backend import GENERIC, Backend, reads_minor_broadcast
from remat_explorer.analysis.split.operations import (EXPENSIVE, IN_PLACE, LOOPS_AND_BRANCHES,
                                                      Op, as_jaxpr, computation_key, flatten,
                                                      in_schedule_order, value_bytes,
                                                      with_layout_copies, with_shared_broadcasts)
from remat_explorer.engine import scan_consts_and_carries

# Equations that give a value every element of which is their operand's one
# number, where that is a literal (``jnp.zeros``: a broadcast 0.0).
_SHAPERS = frozenset('broadcast_in_dim reshape squeeze expand_dims convert_element_type'.split())
# Arithmetic that returns an operand unchanged when the other is all zeros
# or all ones: {equation: (that number, positions of the operand that may be it)}.
_IDENTITIES = {'add': (0.0, (0, 1)), 'add_any': (0.0, (0, 1)), 'sub': (0.0, (1,)),
               'mul': (1.0, (0, 1)), 'div': (1.0, (1,))}


def _true_rank(aval) -> int:
  """How many of a value's dimensions are longer than one."""
  return sum(d != 1 for d in getattr(aval, 'shape', ()))


class _Scope:
  """The buffers of one jaxpr, calls inlined: which values share one, which
  are materialised, and where each dies."""

  def __init__(self, jaxpr: Jaxpr, count_outputs: bool, uncounted=(),
               backend: Backend = GENERIC, sliced=()):
    counter = itertools.count()
    env: dict = {v: next(counter) for v in jaxpr.invars}
    sliced = {env[jaxpr.invars[i]]: backend.stored_bytes(jaxpr.invars[i].aval) for i in sliced}
    inputs: set = set(env.values())
    self.ops: list[Op] = []
    flatten(jaxpr, env, counter, self.ops, inputs)
    if backend.convolution_layouts:
      self.ops = with_layout_copies(self.ops)
    if backend.materialises_values_both_passes_read:
      self.ops = with_shared_broadcasts(
          self.ops, dot_fusions=backend.dot_fusions_read_broadcasts_apart)
    if backend.runs_recompute_early:
      self.ops = in_schedule_order(self.ops, depth_first=backend.forward_in_depth_first_order)
    self.root: dict = {}
    size: dict = {}  # root -> its bytes
    outputs = [env[v] for v in jaxpr.outvars if isinstance(v, Var)]
    self.live = self._live_ops(outputs)
    fused_reader: dict = {}  # root -> read only by fusing equations
    last_fused_read: dict = {}  # root -> the last fusing equation that reads it
    readers: dict = {}
    passes: dict = {}  # root -> {whether a reader is the backward pass's}
    self.constants: dict = {}  # key -> the one number all its elements are
    self.last_use: dict = {}
    first_use: dict = {}  # root -> the first equation that reads it
    self.made_by: dict = {}  # root -> the operation that writes it
    computed: dict = {}  # what an elementwise equation computes -> its value
    root = self.root.get
    backward_side = (self._recompute_read_only_backward(outputs)
                     if backend.fuses_recompute_into_backward else set())
    for i, op in enumerate(self.ops):
      if not self.live[i]:
        continue
      kind = op.kind
      op.roots = {root(k, k) for k in op.reads if k is not None}
      backward = op.is_backward() or i in backward_side
      for r in op.roots:
        self.last_use[r] = i
        first_use.setdefault(r, i)
        fuses = kind != 'materialising' or (
            backend.fuses_gather_operands and op.name == 'gather' and op.reads[0] is not None
            and root(op.reads[0], op.reads[0]) == r)
        fused_reader[r] = fused_reader.get(r, True) and fuses
        if kind != 'materialising':
          last_fused_read[r] = i
        readers[r] = readers.get(r, 0) + 1
        passes.setdefault(r, set()).add(backward)
      self._note_constant(op)
      unchanged = self._operand_returned(op)
      if unchanged is not None:  # XLA's simplifier removes it: a view
        self.root[op.writes[0]] = self.of(unchanged)
        continue
      if op.is_view() and op.reads[0] is not None:
        for out, source in zip(op.writes, op.reads):
          if source is not None:
            self.root[out] = self.of(source)
        continue
      if backend.merges_equal_values:  # XLA's CSE (``backend.py``)
        same = computation_key(op, root)
        if same is not None and same in computed:
          self.root[op.writes[0]] = self.of(computed[same])
          continue
        if same is not None:
          computed[same] = op.writes[0]
      for out, out_bytes in zip(op.writes, op.output_bytes(backend.stored_bytes)):
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
                and (readers.get(k, 0) <= 1 or op.name not in EXPENSIVE))
        for k, op in self.made_by.items()}
    # Values remat's backward block reads through its optimization barrier
    # (``backend.py``).
    self.read_through_barriers = {self.of(k) for i, op in enumerate(self.ops)
                                  if self.live[i] for k in op.fenced.intersection(op.reads)}
    if backend.materialises_values_read_through_barriers:
      for k in self.read_through_barriers.intersection(self.made_by):
        self.materialised[k] = True
    # Of those, the cheap ones only the backward pass reads are made just
    # before it reads them (``backend.py``): root -> that equation's index.
    self.made_late: dict = {}
    if backend.makes_cheap_barrier_reads_late:
      self.made_late = self._cheap_barrier_reads(first_use)
    # Values both passes read that XLA makes apart rather than repeat
    # (``backend.py``).
    if backend.materialises_values_both_passes_read:
      for k, op in self.made_by.items():
        if (len(passes.get(k, ())) == 2 and op.kind == 'fusible'
            and _reads_more_than_it_writes(op)
            and not (backend.repeats_cheap_values and self._repeated_in_fusions(op))):
          self.materialised[k] = True
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
    # A loop body's slice of its stacked inputs that remat's backward block
    # reads through its barrier, other than by a matmul, is a buffer of the
    # body's (``backend.py``).
    self.slices_read_through_barriers = set()
    if backend.materialises_slices_read_through_barriers and sliced:
      for i, op in enumerate(self.ops):
        for k in op.fenced.intersection(op.reads) if self.live[i] else ():
          if self.of(k) in sliced and op.name != 'dot_general':
            self.bytes[self.of(k)] = sliced[self.of(k)]
            self.slices_read_through_barriers.add(self.of(k))

  def _recompute_read_only_backward(self, outputs) -> set:
    """Indices of remat's recompute equations whose values, through fusing
    equations, reach only the backward pass: not a recompute equation XLA
    does not fuse (a matmul), nor the program's outputs. XLA fuses them
    into the backward pass's fusions (``backend.py``)."""
    forward_reads = set(outputs)  # keys read by forward work
    found = set()
    for i in reversed(range(len(self.ops))):
      op = self.ops[i]
      if not self.live[i] or op.is_backward():
        continue
      if (op.in_recompute and op.kind != 'materialising'
          and forward_reads.isdisjoint(op.writes)):
        found.add(i)
        continue
      forward_reads.update(k for k in op.reads if k is not None)
    return found

  def _cheap_barrier_reads(self, first_use) -> dict:
    """Values remat's backward block reads through its barrier that the
    backward pass reads first, each computed by cheap elementwise work
    (``_cheap_inputs``, ``backend.py``): {root: the index of its first
    reader}. What they are computed from is kept until then."""
    late = {}
    for k in self.read_through_barriers.intersection(self.made_by):
      op, first = self.made_by[k], first_use.get(k)
      if first is None or op.in_backward or not self.ops[first].in_backward:
        continue
      inputs = self._cheap_inputs(op)
      if inputs is not None:
        late[k] = first
        for r in inputs:
          self.last_use[r] = max(self.last_use[r], first)
    return late

  def _cheap_inputs(self, op: Op):
    """The materialised values `op` is computed from, through the
    unmaterialised values it reads, where all of it is cheap elementwise
    work (``integer_pow`` is multiplications to XLA) on the step's
    arguments or on values the backward pass reads anyway, none made by a
    transcendental of `op`'s shape (XLA:GPU computes such a reader in the
    transcendental's own fusion, as another of its outputs); else None."""
    shape = op.eqn.outvars[0].aval.shape
    cone, seen, inputs = [op], set(), []
    while cone:
      o = cone.pop()
      if o.added or o.kind != 'fusible' or (o.name in EXPENSIVE and o.name != 'integer_pow'):
        return None
      for r in o.roots - seen:
        seen.add(r)
        maker = self.made_by.get(r)
        if maker is not None and not self.materialised.get(r, True):
          cone.append(maker)
        elif maker is not None and (
            maker.added or not self._kept_for_the_backward_pass(r)
            or (maker.name in EXPENSIVE and maker.eqn.outvars[0].aval.shape == shape)):
          return None
        else:
          inputs.append(r)
    return inputs

  def _kept_for_the_backward_pass(self, k) -> bool:
    """Whether the value rooted at `k` lives into the backward pass: read
    last there, or returned (kept to the end)."""
    return k in self.outputs or self.ops[self.last_use[k]].in_backward

  def _note_constant(self, op: Op) -> None:
    """Record `op`'s value if every element of it is one literal number."""
    if op.added or op.name not in _SHAPERS or len(op.writes) != 1:
      return
    value = self._constant(op, 0)
    if value is not None:
      self.constants[op.writes[0]] = value

  def _constant(self, op: Op, position: int) -> float | None:
    """The one number every element of `op`'s operand at `position` is, if
    known: a literal, or a value made of one."""
    operand = op.eqn.invars[position]
    if isinstance(operand, Literal):
      value = np.asarray(operand.val)
      return float(value.reshape(())) if value.size == 1 else None
    return self.constants.get(op.reads[position])

  def _operand_returned(self, op: Op):
    """The key of the operand `op` returns unchanged (``x - zeros``,
    ``x * ones``), or None."""
    if op.added or op.name not in _IDENTITIES:
      return None
    neutral, positions = _IDENTITIES[op.name]
    out = op.eqn.outvars[0].aval
    for position in positions:
      other = 1 - position
      k = op.reads[other]
      if (self._constant(op, position) == neutral and k is not None
          and op.eqn.invars[other].aval.shape == out.shape
          and op.eqn.invars[other].aval.dtype == out.dtype):
        return k
    return None

  def _repeated_in_fusions(self, op: Op) -> bool:
    """Whether XLA computes `op`'s value again inside each fusion that
    reads it, though a reader that does not fuse (a dot, a loop) has it made
    apart (``backend.py``): a cheap elementwise equation with one operand of
    its result's size (one broadcast to it counted by what it broadcasts),
    made by an equation XLA does not fuse. Repeating it reads no more
    than reading its result would."""
    if op.added or op.kind != 'fusible' or op.name in EXPENSIVE or op.is_view():
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

  def _reads_minor_broadcast(self, op: Op) -> bool:
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
               uncounted=(), backend: Backend = GENERIC, sliced=()) -> int:
  """The most bytes of values `jaxpr` makes that are live at once while it
  runs (its inputs not counted: its caller holds them); its outputs
  included unless `count_outputs` is False (the program's outputs, which XLA
  places apart); the outputs at positions `uncounted` never (a loop body's
  stacked outputs, written into the loop's buffer). `sliced`: the
  positions of a loop body's inputs that are slices of the loop's stacked
  inputs, which the body holds itself where the platform makes them apart.
  `backend`: the rules of the platform it will run on (``backend.py``)."""
  scope = _Scope(as_jaxpr(jaxpr), count_outputs, uncounted, backend, sliced)
  dies_at: dict[int, list] = {}
  for r, i in scope.last_use.items():
    dies_at.setdefault(i, []).append(r)
  allocated, root, last_use = scope.bytes.get, scope.root, scope.last_use
  # On the CPU every loop's state is made when the program starts (``backend.py``).
  early = _loop_state(scope) if backend.loop_state_made_first else set()
  early |= scope.slices_read_through_barriers
  # Made just before their first reader rather than where the jaxpr makes them.
  made_late: dict[int, list] = {}
  for k, i in scope.made_late.items():
    made_late.setdefault(i, []).append(k)
  live = sum(allocated(k, 0) for k in early)
  peak = 0
  for i, (op, is_live) in enumerate(zip(scope.ops, scope.live)):
    if not is_live:
      continue
    dying = dies_at.get(i, ())
    live += sum(allocated(k, 0) for k in made_late.get(i, ()))
    outs = [k for k in op.writes if k not in root and k not in early
            and k not in scope.made_late]
    new = never_read = 0
    for k in outs:
      n = allocated(k, 0)
      new += n
      if k not in last_use:
        never_read += n
    reused = _reused_bytes(op, scope, outs, dying, backend) if new else 0
    peak = max(peak, live + new - reused + _op_running_bytes(op, backend))
    live += new - never_read
    for r in dying:
      live -= allocated(r, 0)
  return peak


def _reads_more_than_it_writes(op: Op) -> bool:
  """Whether `op`'s distinct operands hold more bytes than its result:
  XLA repeats an equation that reads no more than it writes in every
  fusion that reads it, wherever those are."""
  if op.added:
    return False
  operands = {v for v in op.eqn.invars if isinstance(v, Var)}
  return sum(map(value_bytes, operands)) > sum(map(value_bytes, op.eqn.outvars))


def _loop_state(scope: _Scope) -> set:
  """The buffers of every ``scan``'s carry and stacked outputs that
  something reads after it."""
  return {k for op, is_live in zip(scope.ops, scope.live)
          if is_live and op.name == 'scan' and not op.added
          for k in op.writes
          if k not in scope.root and k in scope.last_use and scope.allocated(k)}


def _reused_bytes(op: Op, scope: _Scope, outs, dying, backend: Backend) -> int:
  """Bytes of a dying operand an output is written over."""
  if not outs or not scope.allocated(outs[0]):
    return 0
  operands = op.roots
  if op.name in IN_PLACE and op.reads[0] is not None:
    operand = scope.of(op.reads[0])
    return scope.allocated(operand) if operand in dying else 0
  if op.kind == 'fusible':
    size = scope.allocated(outs[0])
    kept = scope.read_through_barriers if backend.writes_apart_from_barrier_reads else ()
    return size if any(scope.allocated(r) == size for r in dying
                       if r in operands and r not in kept) else 0
  return 0


def _op_running_bytes(op: Op, backend: Backend) -> int:
  """What `op` holds while it runs beyond its outputs: a loop's, branch's
  or call's body's own peak. Fusible equations and reductions have no
  bodies; a scatter's combiner works on scalars."""
  if (op.added or op.kind != 'materialising' or op.name in IN_PLACE
      or not (op.name in LOOPS_AND_BRANCHES or any(jaxprs_in_params(op.eqn.params)))):
    return 0
  return _running_bytes(op.eqn, backend)


def _running_bytes(eqn: JaxprEqn, backend: Backend) -> int:
  """What a loop or branch holds while it runs beyond its outputs: its
  body's own peak."""
  name, params = eqn.primitive.name, eqn.params
  if name == 'scan':
    body = as_jaxpr(params['jaxpr'])
    # The stacked outputs are written in place, a slice per iteration.
    num_consts, num_carry = scan_consts_and_carries(params)
    return peak_bytes(body, uncounted=range(num_carry, len(body.outvars)),
                      backend=backend, sliced=range(num_consts + num_carry, len(body.invars)))
  if name == 'while':
    return max(peak_bytes(params['body_jaxpr'], backend=backend),
               peak_bytes(params['cond_jaxpr'], backend=backend))
  if name == 'cond':
    return max(peak_bytes(b, backend=backend) for b in params['branches'])
  return max((peak_bytes(b, backend=backend) for b in jaxprs_in_params(params)),
             default=0)
