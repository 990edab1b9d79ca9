"""When each buffer of a scheduled HLO computation is live.

Modelled on XLA's rules, from the HLO alone (``hlo.parse_hlo``): one buffer
per shape leaf of each instruction, live from its step to its last use;
``get-tuple-element``, ``tuple``, ``bitcast``, ``opt-barrier``,
``add-dependency``, ``domain`` and ``*-done`` only alias. Fusions count their
output only; constants (in the executable) are left out; parameters live
throughout. A ``while`` updates its state in place (passed-through elements
stay the operand's buffer) and adds, at its step, the peak of its body's
and condition's own temporaries as one ``<name>/temps`` buffer (so do
``call`` and ``conditional``). In-place reuse as XLA does it: an output
takes over a same-typed operand that dies there, for
``dynamic-update-slice``/``scatter`` (operand 0) and fusions rooted in one,
elementwise ops, and loop fusions that read the operand only elementwise.
Live-out buffers are allocated before the run, so they count from step 0
(``<name>/reserved`` until written) and hold the temporaries that fit and
die before that write, one at a time, largest first, as XLA parks them.
Donated parameters (``input_output_alias``) hand their storage to the output.

Where XLA's buffer assignment is known (``timeline.py`` passes it in), two
buffers it placed on overlapping bytes of one allocation are never live at
once, and the earlier one's range is cut to end before the later begins:
XLA's placement settles what the rules above only approximate.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterable, Sequence

from remat_explorer.analysis.xla.hlo import (Donation, HloModule, Instruction, Leaf,
                                         at, leaves, root)

_ALIASES = {'bitcast', 'opt-barrier', 'add-dependency', 'domain'}
_IN_PLACE = {'dynamic-update-slice', 'scatter'}
_ELEMENTWISE = set("""abs add and atan2 cbrt ceil clamp compare complex convert
  cosine divide erf exponential exponential-minus-one floor imag is-finite log
  log-plus-one logistic maximum minimum multiply negate not or popcnt power real
  reduce-precision remainder round-nearest-afz round-nearest-even rsqrt select
  shift-left shift-right-arithmetic shift-right-logical sign sine sqrt subtract
  tan tanh xor""".split())


@dataclasses.dataclass
class LiveBuffer:
  """A buffer of the computation and its live range (steps, inclusive)."""
  name: str
  """The defining instruction, with ``{i,j}`` for a tuple leaf."""
  instruction: str
  shape_index: tuple[int, ...]
  leaf: Leaf
  start: int
  op_name: str
  source: str = ''
  is_parameter: bool = False
  is_output: bool = False
  kind: str = 'value'
  """'value'; 'temps' (the peak of the computations one step runs);
  'reserved' (output storage not yet written)."""
  output_index: int | None = None
  """For an output, its position among the computation's output leaves."""
  uses: list[int] = dataclasses.field(default_factory=list)
  reusable: list[int] = dataclasses.field(default_factory=list)  # operands
  end: int = -1


Placed = dict[str, dict[tuple[str, tuple], tuple[int, int, int]]]
"""Per computation: (instruction, shape index) -> (allocation, offset,
bytes) of the buffers XLA placed in temporary allocations."""


def live_ranges(module: HloModule, placed: Placed | None = None,
                in_output_storage: set | None = None
                ) -> tuple[list[Instruction], list[LiveBuffer]]:
  """The entry computation's schedule and its buffers with live ranges,
  cut where XLA's placement (`placed`) shows two were not live at once.
  `in_output_storage`: the (instruction, shape index) of the temporaries
  XLA placed in an output's allocation, where known; only those are held
  in output storage not yet written (else any that fits, as XLA:CPU
  parks them)."""
  graph = _Graph(module.computations, module.entry, {}, placed or {},
                 module.donations, in_output_storage)
  return graph.instrs, graph.buffers()


def peak_temporaries(module: HloModule, instruction: Instruction,
                     placed: Placed | None = None
                     ) -> tuple[str, list[LiveBuffer]] | None:
  """What the ``<name>/temps`` buffer of `instruction` (a ``while``,
  ``call`` or ``conditional``) holds: (the computation it runs whose
  temporaries peak highest, the buffers live at that peak), nested loops'
  own temporaries as ``/temps`` buffers; None where it runs none."""
  peaks: dict[str, int] = {}
  best = None
  for comp in instruction.called():
    if comp not in module.computations:
      continue
    graph = _Graph(module.computations, comp, peaks, placed or {})
    held = [b for n, b in enumerate(graph.bufs)
            if not (b.is_parameter or n in graph.outputs or b.leaf.memory_space)]
    held += [b for b in graph.buffers() if b.kind == 'temps']
    live = live_bytes(len(graph.instrs), [(b.start, b.end, b.leaf.bytes) for b in held])
    step = max(range(len(live)), key=live.__getitem__, default=0)
    top = live[step] if live else 0
    if best is None or top > best[0]:
      best = (top, comp, [b for b in held if b.start <= step <= b.end])
  return None if best is None else best[1:]


def live_bytes(steps: int, ranges: Iterable[tuple[int, int, int]]) -> list[int]:
  """Bytes live at each of `steps` steps, given (start, end, bytes) ranges."""
  delta = [0] * (steps + 1)
  for start, end, nbytes in ranges:
    delta[start] += nbytes
    delta[end + 1] -= nbytes
  return list(itertools.accumulate(delta[:steps]))


def cut_where_placement_forbids(buffers: Sequence[LiveBuffer],
                                placed: dict[tuple[str, tuple], tuple[int, int, int]]
                                ) -> None:
  """End a buffer before a later one that XLA placed on overlapping bytes
  of the same allocation begins (`placed`: (instruction, shape index) ->
  (allocation, offset, bytes))."""
  by_allocation: dict[int, list] = {}
  for b in buffers:
    where = placed.get((b.instruction, b.shape_index))
    if where is not None and b.kind == 'value' and not b.is_parameter:
      allocation, offset, size = where
      by_allocation.setdefault(allocation, []).append((b.start, offset, offset + size, b))
  for found in by_allocation.values():
    found.sort(key=lambda x: x[0])
    active: list = []
    for start, low, high, b in found:
      active = [a for a in active if a[3].end >= start]
      for _, a_low, a_high, a in active:
        if a.start < start <= a.end and a_low < high and low < a_high:
          a.end = start - 1
      active = [a for a in active if a[3].end >= start] + [(start, low, high, b)]


class _Graph:
  """The buffers of one computation and their live ranges."""

  def __init__(self, comps: dict[str, list[Instruction]], name: str,
               peaks: dict[str, int], placed: Placed,
               donations: Sequence[Donation] = (), in_output_storage: set | None = None):
    self.comps, self.instrs, self.peaks = comps, comps[name], peaks
    self.placed, self.in_output_storage = placed, in_output_storage
    instrs = self.instrs
    self.bufs: list[LiveBuffer] = []
    self.extra: dict[int, int] = {}  # step -> peak of the computations it runs
    values: dict[str, Any] = {}
    for i, ins in enumerate(instrs):
      ops = [values.get(o) for o in ins.operands]
      values[ins.name] = self._define(i, ins, ops)
    last = root(instrs)
    found = leaves(values[last.name]) if last else []
    self.outputs = {b for b in found if b is not None}
    for k, n in reversed(list(enumerate(found))):  # the first position it fills
      if n is not None:
        self.bufs[n].is_output = True
        self.bufs[n].output_index = k
    self.took_over: dict[int, int] = {}  # buffer -> the one it took storage of
    self._assign_ends()
    params = {int(x.args): values[x.name] for x in instrs
              if x.opcode == 'parameter'}
    for out, num, index in donations:
      self._donate(at(values[last.name], out), at(params.get(num), index))
    if placed.get(name):
      cut_where_placement_forbids(self.bufs, placed[name])

  def _fresh(self, i: int, ins: Instruction, shape, index: tuple = (),
             **kw) -> Any:
    if isinstance(shape, list):
      return [self._fresh(i, ins, s, (*index, k), **kw) for k, s in enumerate(shape)]
    name = f"{ins.name}{{{','.join(map(str, index))}}}" if index else ins.name
    self.bufs.append(LiveBuffer(name, ins.name, index, shape, i, ins.op_name,
                                ins.source, **kw))
    return len(self.bufs) - 1

  def _define(self, i: int, ins: Instruction, ops: list) -> Any:
    code = ins.opcode
    if code == 'parameter':
      return self._fresh(0, ins, ins.shape, is_parameter=True)
    if code == 'constant':
      return [None] * len(ins.shape) if isinstance(ins.shape, list) else None
    if code == 'get-tuple-element':
      return ops[0][ins.tuple_index]
    if code == 'tuple':
      return ops
    if code in _ALIASES:
      return ops[0]
    for b in leaves(ops):
      if b is not None:
        self.bufs[b].uses.append(i)
    if code.endswith('-done'):  # the result slot of the matching *-start
      first = ops[0]
      return first[code != 'copy-done'] if isinstance(first, list) else first
    if peak := max((self._peak(c) for c in ins.called() if c in self.comps),
                   default=0):
      self.extra[i] = peak
    if code == 'while':
      return self._while(i, ins, ops[0])
    if code.endswith('-start') and isinstance(ins.shape, list) and ops:
      # copy-start: (destination, source, context); others: (operands, result..)
      src = int(code == 'copy-start')
      return [(ops[0] if len(ops) == 1 else ops) if k == src
              else self._fresh(i, ins, s, (k,))
              for k, s in enumerate(ins.shape)]
    value = self._fresh(i, ins, ins.shape)
    for k, b in enumerate(leaves(value)):
      self.bufs[b].reusable = self._reusable(ins, k, ops)
    return value

  def _while(self, i: int, ins: Instruction, state: Any) -> Any:
    body = self.comps.get(ins.attr('body') or '', [])
    is_tuple = isinstance(ins.shape, list)
    value = []
    for k, element in enumerate(state if is_tuple else [state]):
      if is_tuple and _passes_through(body, k):
        value.append(element)  # the same buffer, never written by the loop
        continue
      new = self._fresh(i, ins, ins.shape[k] if is_tuple else ins.shape,
                        (k,) if is_tuple else ())
      for n, old in zip(leaves(new), leaves(element)):
        self.bufs[n].reusable = [] if old is None else [old]
      value.append(new)
    return value if is_tuple else value[0]

  def _reusable(self, ins: Instruction, k: int, ops: list) -> list[int]:
    """Operand buffers whose storage output leaf `k` may take over."""
    if ins.opcode in _IN_PLACE:
      nums = [0]
    elif ins.opcode in _ELEMENTWISE:
      nums = list(range(len(ops)))
    else:
      nums = self._fusion_reusable(ins, k) if ins.opcode == 'fusion' else []
    out = leaves(ins.shape)[k]
    return [op for n in nums if n < len(ops) and isinstance(op := ops[n], int)
            and self.bufs[op].leaf.type == out.type]

  def _fusion_reusable(self, ins: Instruction, k: int) -> list[int]:
    body = self.comps.get(ins.attr('calls') or '', [])
    by_name = {x.name: x for x in body}
    numbers = {x.name: int(x.args) for x in body if x.opcode == 'parameter'}
    last = root(body)
    if last is not None and last.opcode == 'tuple':
      last = by_name.get(last.operands[k])
    if last is not None and last.opcode in _IN_PLACE:
      src = by_name.get(last.operands[0])
      while src is not None and src.opcode == 'bitcast':
        src = by_name.get(src.operands[0])
      return [numbers[src.name]] if src and src.name in numbers else []
    if 'kind=kLoop' not in ins.attrs:
      return []
    users: dict[str, set[str]] = {}
    for x in body:
      for o in x.operands:
        users.setdefault(o, set()).add(x.opcode)
    return [n for p, n in numbers.items()
            if users.get(p, {''}) <= _ELEMENTWISE]

  def _assign_ends(self) -> None:
    last = len(self.instrs) - 1
    for n, b in enumerate(self.bufs):
      held = b.is_parameter or n in self.outputs
      b.end = last if held else max(b.uses, default=b.start)
    taken: set[int] = set()
    for n, b in enumerate(self.bufs):
      for o in b.reusable:
        old = self.bufs[o]
        if (o not in taken and o not in self.outputs and not old.is_parameter
            and old.end == b.start > old.start):
          old.end = b.start - 1  # from here on `b` owns the storage
          self.took_over[n] = o
          taken.add(o)
          break

  def _donate(self, out: Any, param: Any) -> None:
    """Lets output `out` (and the buffers it took over) use `param`'s storage
    once the parameter is last read."""
    if not isinstance(out, int) or not isinstance(param, int) or out == param:
      return
    while out in self.took_over:
      out = self.took_over[out]
    p, first = self.bufs[param], self.bufs[out].start
    if max(p.uses, default=0) <= first and not self.bufs[out].is_parameter:
      p.end = first - 1
      self.took_over[out] = param

  def _peak(self, comp: str) -> int:
    """Peak bytes of `comp`'s own temporaries (not its parameters or root)."""
    if comp not in self.peaks:
      g = _Graph(self.comps, comp, self.peaks, self.placed)
      temps = [(b.start, b.end, b.leaf.bytes) for n, b in enumerate(g.bufs)
               if not (b.is_parameter or n in g.outputs or b.leaf.memory_space)]
      temps += [(i, i, extra) for i, extra in g.extra.items()]
      self.peaks[comp] = max(live_bytes(len(g.instrs), temps), default=0)
    return self.peaks[comp]

  def _reserved(self) -> list[LiveBuffer]:
    """Output storage not yet written nor lent to a temporary, by step."""
    stores, chained = [], set(self.outputs)
    for o in sorted(self.outputs):
      if self.bufs[o].is_parameter or self.bufs[o].leaf.memory_space:
        continue
      first = o
      while first in self.took_over:
        first = self.took_over[first]
        chained.add(first)
      if self.bufs[first].is_parameter:  # a donated parameter's storage
        continue
      stores.append((self.bufs[first].start, self.bufs[o].leaf.bytes, self.bufs[o]))
    stores.sort(key=lambda s: s[1])
    temps = [b for n, b in enumerate(self.bufs) if n not in chained
             and not b.is_parameter and not b.leaf.memory_space]
    # Bytes of each store lent to temporaries, by step. XLA:CPU parks one
    # temporary at a time in a store, any that fits; where XLA's placement
    # says which temporaries it put in output storage, those share it.
    placed_there = self.in_output_storage
    lent = [[0] * first for first, _, _ in stores]
    for t in sorted(temps, key=lambda b: (-b.leaf.bytes, b.start)):
      if placed_there is not None and (t.instruction, t.shape_index) not in placed_there:
        continue
      for (first, size, _), taken in zip(stores, lent):
        if t.end >= first or t.leaf.bytes > size:
          continue
        span = taken[t.start:t.end + 1]
        if (max(span, default=0) + t.leaf.bytes <= size if placed_there is not None
            else not any(span)):
          taken[t.start:t.end + 1] = [n + t.leaf.bytes for n in span]
          break
    out = []
    for (first, size, output), taken in zip(stores, lent):
      for start, end, held in _runs([size - n for n in taken]):
        if held:
          out.append(LiveBuffer(f'{output.name}/reserved', output.instruction,
                                output.shape_index, output.leaf._replace(bytes=held),
                                start, '', kind='reserved', end=end))
    return out

  def buffers(self) -> list[LiveBuffer]:
    out = list(self.bufs)
    for i, extra in sorted(self.extra.items()):
      ins = self.instrs[i]
      out.append(LiveBuffer(f'{ins.name}/temps', ins.name, (), Leaf(extra, 0, ''),
                            i, ins.op_name, ins.source, kind='temps', end=i))
    return out + self._reserved()


def _runs(values: list[int]) -> list[tuple[int, int, int]]:
  """(first, last, value) of each run of equal `values`."""
  runs = [list(run) for _, run in itertools.groupby(enumerate(values), key=lambda iv: iv[1])]
  return [(run[0][0], run[-1][0], run[0][1]) for run in runs]


def _passes_through(body: list[Instruction], k: int) -> bool:
  """Whether a while body returns element `k` of its state unchanged."""
  last, by_name = root(body), {x.name: x for x in body}
  if last is None or last.opcode != 'tuple' or k >= len(last.operands):
    return False
  src = by_name.get(last.operands[k])
  if src is None or src.opcode != 'get-tuple-element' or src.tuple_index != k:
    return False
  return getattr(by_name.get(src.operands[0]), 'opcode', '') == 'parameter'
