"""The collectives of a compiled SPMD program, and which ones remat re-runs.

A sharded step communicates: the partitioner inserts all-gathers (to
assemble a sharded operand), reduce-scatters and all-reduces (to sum partial
results), all-to-alls and collective-permutes, and ``shard_map`` code calls
them itself. When the backward pass recomputes a forward value, the
collectives that value needed run again.

Counted from the optimized HLO (``compiled.as_text()``), walking the call
graph from the entry computation: an instruction in a ``while`` body counts
once per trip (XLA's ``known_trip_count``; once, with ``unknown_trip_count``
set, when XLA does not know it), in called computations, conditional
branches and async wrappers once per call. Asynchronous pairs count once
(the ``*-done``, whose shape is the result).

XLA combines collectives into one instruction with several operands (its
all-reduce, all-gather and reduce-scatter combiners) and names the result
``prefix/(name1:name2:...)``, one name per operand. Each operand is counted
as one collective with its own name: what was communicated, and for whom,
does not change when the launches are batched. ``Collective.instructions``
says how many HLO instructions carried them.

Which pass a collective belongs to is read from the JAX name stack that
reaches HLO as ``metadata={op_name=...}``, which the partitioner copies onto
the collectives it inserts for an operation:

* ``recompute``: under ``rematted_computation``, the scope in which the
  transpose of a remat block (ours, and JAX's) re-runs the forward
  operations it did not save. These are the collectives the recompute adds.
* ``backward``: other operations under ``transpose(...)``.
* ``forward``: the rest; ``unattributed`` if there is no metadata.

One correction: XLA may merge (CSE) a recomputed operation with its forward
original and keep the recompute's name (XLA's CPU pipeline does, despite
the barrier). Such a collective is read by forward operations, which a real
recompute never is, so a ``rematted_computation`` collective with a forward
reader counts as ``forward``.

Attributing by metadata names each collective and needs no second compile.
Comparing against the program compiled without remat would not isolate the
recompute: the two programs also differ in what XLA combines or shares, so
such a difference mixes the recompute with unrelated rewrites. What the
attribution cannot see: a collective that the recompute and a backward
operation share after CSE counts as the recompute's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from remat_explorer.analysis.xla.hlo import HloModule, leaves, pass_of

KINDS = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all',
         'collective-permute')
PHASES = ('forward', 'backward', 'recompute', 'unattributed')

# Async wrappers name the computation they run in each of their parts.
_FOLLOW_ONCE = {'async-update', 'async-done'}
# Instructions that pass a value on without computing on it: look through
# them for the operations that read it.
_PASS_ON = {'tuple', 'get-tuple-element', 'bitcast', 'copy', 'opt-barrier'}


@dataclass(frozen=True)
class Collective:
  """One kind of collective in one pass of the compiled step."""
  kind: str
  """One of ``KINDS``."""
  phase: str
  """One of ``PHASES``: ``recompute`` is what remat re-runs."""
  count: int
  """Executions per step, loop trip counts applied; each operand of a
  combined instruction counts as one."""
  instructions: int
  """Distinct HLO instructions that carry them."""
  bytes: int
  """Bytes of each device's results, over all executions."""


@dataclass(frozen=True)
class CollectiveSummary:
  collectives: tuple[Collective, ...]
  unknown_trip_count: bool
  """True if some collective sits in a loop XLA does not know the trip
  count of (it was counted once)."""


class _Totals:
  def __init__(self):
    self.count = defaultdict(int)
    self.bytes = defaultdict(int)
    self.instructions = defaultdict(set)

  def add(self, key, instruction: str, times: int, nbytes: int) -> None:
    self.count[key] += times
    self.bytes[key] += times * nbytes
    self.instructions[key].add(instruction)

  def collectives(self) -> tuple[Collective, ...]:
    return tuple(Collective(kind, phase, self.count[(kind, phase)],
                            len(self.instructions[(kind, phase)]),
                            self.bytes[(kind, phase)])
                 for kind in KINDS for phase in PHASES
                 if (kind, phase) in self.count)


def collectives_in(module: HloModule) -> CollectiveSummary:
  """Every collective of a compiled module (``hlo.parse_hlo``), by kind
  and pass."""
  comps, entry = module.computations, module.entry
  totals = _Totals()
  unknown = [False]

  def walk(name: str, times: int, in_unknown_loop: bool, seen: tuple) -> None:
    if name not in comps or name in seen:
      return
    readers = _Readers(comps[name])
    for ins in comps[name]:
      kind = _kind(ins.opcode)
      if kind is not None:
        for phase, nbytes in _operands(ins, readers):
          totals.add((kind, phase), f'{name}/{ins.name}', times, nbytes)
        unknown[0] |= in_unknown_loop
      if ins.opcode in _FOLLOW_ONCE:
        continue
      trips, loop_unknown = 1, False
      if ins.opcode == 'while':
        loop_unknown = ins.trip_count is None
        trips = 1 if loop_unknown else ins.trip_count
      for called in ins.all_called():
        walk(called, times * trips, in_unknown_loop or loop_unknown, (*seen, name))

  walk(entry, 1, False, ())
  return CollectiveSummary(totals.collectives(), unknown[0])


def _kind(opcode: str) -> str | None:
  """The collective an opcode performs; the ``-start`` half of an async
  pair is skipped so that the pair counts once."""
  base = opcode.removesuffix('-done')
  return base if base in KINDS else None


def _operands(ins, readers) -> list[tuple[str, int]]:
  """(phase, bytes) of each collective an instruction carries: one per
  operand of a combined instruction, else one for all of it."""
  arrays = leaves(ins.shape)
  names = combined_names(ins.op_name)
  if len(names) > 1 and len(names) == len(arrays):
    return [(_phase(name, readers.of(ins, k)), leaf.bytes)
            for k, (name, leaf) in enumerate(zip(names, arrays))]
  return [(_phase(ins.op_name, readers.of(ins)), sum(x.bytes for x in arrays))]


def combined_names(op_name: str) -> list[str]:
  """``'jit(f)/(a/dot:b/add)'`` -> ``['jit(f)/a/dot', 'jit(f)/b/add']``: the
  names XLA joins when it combines collectives; ``[op_name]`` otherwise."""
  if not op_name.endswith(')'):
    return [op_name]
  depth, start = 0, None
  for i in range(len(op_name) - 1, -1, -1):
    depth += {')': 1, '(': -1}.get(op_name[i], 0)
    if depth == 0:
      start = i
      break
  if start is None or (start and op_name[start - 1] != '/'):
    return [op_name]  # a call such as jvp(...), not a group of names
  parts, depth, last = [], 0, start + 1
  for i in range(start + 1, len(op_name) - 1):
    depth += {'(': 1, ')': -1}.get(op_name[i], 0)
    if op_name[i] == ':' and depth == 0:
      parts.append(op_name[last:i])
      last = i + 1
  parts.append(op_name[last:-1])
  prefix = op_name[:start]
  return [prefix + p for p in parts] if len(parts) > 1 else [op_name]


def _phase(op_name: str, readers) -> str:
  phase = pass_of(op_name) or 'unattributed'
  if phase == 'recompute' and any(pass_of(r.op_name) == 'forward'
                                  for r in readers):
    return 'forward'  # merged with its forward original by XLA
  return phase


class _Readers:
  """The operations of one computation that read an instruction's result
  (or one element of a tuple result), through ``_PASS_ON`` instructions."""

  def __init__(self, instrs):
    self.users = defaultdict(list)
    for ins in instrs:
      for operand in ins.operands:
        self.users[operand].append(ins)

  def of(self, ins, element: int | None = None) -> list:
    start = self.users.get(ins.name, ())
    if element is not None:
      start = [u for u in start
               if u.opcode != 'get-tuple-element' or u.tuple_index == element]
    found, stack, seen = [], list(start), set()
    while stack:
      user = stack.pop()
      if user.name in seen:
        continue
      seen.add(user.name)
      if user.opcode in _PASS_ON:
        stack.extend(self.users.get(user.name, ()))
      else:
        found.append(user)
    return found


def count(collectives, *, phase: str | None = None, kind: str | None = None) -> int:
  """Executions of the collectives of `phase` and `kind` (all if None)."""
  return sum(c.count for c in collectives
             if (phase is None or c.phase == phase) and (kind is None or c.kind == kind))
