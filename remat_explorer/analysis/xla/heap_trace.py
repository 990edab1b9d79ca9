"""XLA's own account of a program's memory: its heap simulation, replayed.

XLA places a program's temporaries by simulating its heap along the
schedule, and keeps the simulation in the buffer assignment: a trace of
events per heap (a buffer allocated, freed, or sharing another's storage).
XLA's peak for GPUs and TPUs (``peak_memory_in_bytes``) is read from these
traces much as XLA's memory viewer reads them: replay a trace, shared
storage counted once, and add the device memory that lives for the whole
program outside the traces (parameters, outputs, constants), each
allocation once.

Which trace: XLA:GPU keeps one. XLA:TPU keeps one per memory (device
memory, on-chip memory, flags), and its figure follows the trace whose
replay peaks highest: device memory's in a program of any size, on-chip
memory's in a small one that fits there (checked against XLA's own figure
for both in ``tests/test_targets.py``). So the replay takes the highest.

The replay is mapped onto the entry computation's schedule: an event's
instruction gives its step (a called computation's, the step that calls
it), and each step holds the highest heap its events reach. The same
mapping gives each entry buffer the steps the heap holds it
(``HeapTrace.lifetimes``), which the memory timeline takes in place of
its liveness model's.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses

from remat_explorer.analysis.xla import protowire as wire, xla_protos as pb
from remat_explorer.analysis.xla.hlo import HloModule

_ALLOC, _FREE, _SHARE = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class HeapTrace:
  peak_bytes: int
  """XLA's peak: the highest replayed heap plus ``indefinite_bytes``."""
  indefinite_bytes: int
  """Device memory no trace accounts for, held for the whole program."""
  step_bytes: tuple[int, ...]
  """At each step of the entry computation, the highest heap its events
  reach (or the heap it inherits), plus ``indefinite_bytes``."""
  color: int = 0
  """The memory of the trace followed: 0 for device memory (HBM), 1 for a
  TPU's on-chip memory (VMEM), whose heap XLA:TPU's figure follows when it
  is the higher (a program small enough to live on chip)."""
  lifetimes: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
  """Logical buffer id -> the first and last entry step the followed trace
  holds its storage (inclusive); a buffer that takes over another's
  storage holds it from the step it does, and the other until the step
  before (the storage is counted once, as the heap counts it)."""


def read_heap_trace(assignment: bytes, module: HloModule) -> HeapTrace | None:
  """The replayed heap of a ``BufferAssignmentProto``, or None where it
  holds no trace."""
  buffers = _logical_buffers(assignment)
  allocations, owner = _allocations(assignment)
  traces = [_events(assignment, span) for _, span in wire.fields(
      assignment, wire.whole(assignment), (pb.BufferAssignment.HEAP_SIMULATOR_TRACES,))]
  if not traces:
    return None
  replays = [_replay(events, buffers) for events in traces]
  highest = max(range(len(traces)), key=lambda i: max(replays[i], default=0))
  indefinite = _indefinite(buffers, allocations, owner, traces)
  steps = _steps_of(traces[highest], module)
  step_bytes = [0] * len(module.entry_instructions)
  level, current = 0, 0
  for step, heap in zip(steps, replays[highest]):
    while current < step:  # steps without events keep the level
      current += 1
      step_bytes[current] = max(step_bytes[current], level)
    step_bytes[step] = max(step_bytes[step], heap)
    level = heap
  for later in range(current + 1, len(step_bytes)):
    step_bytes[later] = level
  peak = max(replays[highest], default=0) + indefinite
  colors = collections.Counter(buffers[event[1]][1] for event in traces[highest])
  return HeapTrace(peak, indefinite, tuple(b + indefinite for b in step_bytes),
                   colors.most_common(1)[0][0] if colors else 0,
                   _lifetimes(traces[highest], steps, module.entry))


def _logical_buffers(data: bytes) -> dict[int, tuple[int, int]]:
  """Logical buffer id -> (bytes, memory color)."""
  f = pb.LogicalBuffer
  out = {}
  for _, span in wire.fields(data, wire.whole(data), (pb.BufferAssignment.LOGICAL_BUFFERS,)):
    m = wire.message(data, span, (f.ID, f.SIZE, f.COLOR))
    out[wire.scalar(m, f.ID)] = (wire.scalar(m, f.SIZE), wire.scalar(m, f.COLOR))
  return out


def _allocations(data: bytes) -> tuple[dict[int, tuple[int, bool]], dict[int, int]]:
  """(allocation index -> (bytes, whether it lives for the whole program),
  logical buffer -> allocation). A parameter, an output or a constant
  lives for the whole program; a temporary or thread-local one does not."""
  f, a = pb.BufferAllocation, pb.BufferAllocationAssigned
  allocations, owner = {}, {}
  for _, span in wire.fields(data, wire.whole(data), (pb.BufferAssignment.BUFFER_ALLOCATIONS,)):
    m = wire.message(data, span, (f.INDEX, f.SIZE, f.ASSIGNED, f.IS_ENTRY_COMPUTATION_PARAMETER,
                                  f.MAYBE_LIVE_OUT, f.IS_CONSTANT))
    index = wire.scalar(m, f.INDEX)
    whole = any(wire.scalar(m, k) for k in (f.IS_ENTRY_COMPUTATION_PARAMETER,
                                            f.MAYBE_LIVE_OUT, f.IS_CONSTANT))
    allocations[index] = (wire.scalar(m, f.SIZE), whole)
    for entry in m.get(f.ASSIGNED, []):
      owner[wire.scalar(wire.message(data, entry, (a.LOGICAL_BUFFER_ID,)),
                        a.LOGICAL_BUFFER_ID)] = index
  return allocations, owner


def _events(data: bytes, span) -> list[tuple[int, int, int, str, str]]:
  """A trace's events: (kind, buffer, canonical buffer, computation, instruction)."""
  e = pb.HeapSimulatorEvent
  out = []
  for event in wire.message(data, span, (pb.HeapSimulatorTrace.EVENTS,)).get(
      pb.HeapSimulatorTrace.EVENTS, []):
    m = wire.message(data, event, (e.KIND, e.BUFFER_ID, e.SHARE_WITH_CANONICAL_ID,
                                   e.COMPUTATION_NAME, e.INSTRUCTION_NAME))
    out.append((wire.scalar(m, e.KIND), wire.scalar(m, e.BUFFER_ID),
                wire.scalar(m, e.SHARE_WITH_CANONICAL_ID),
                wire.text(data, m, e.COMPUTATION_NAME), wire.text(data, m, e.INSTRUCTION_NAME)))
  return out


def _replay(events, buffers) -> list[int]:
  """The heap after each event. A buffer sharing another's storage holds
  it too: the storage is freed with the last of them, and counted again if
  a sharer takes it after the canonical buffer was freed."""
  heap, out, holders, canonical = 0, [], {}, {}
  for kind, buffer, shared, _, _ in events:
    if kind == _ALLOC:
      holders[buffer] = 1
      heap += buffers[buffer][0]
    elif kind == _FREE:
      storage = canonical.get(buffer, buffer)
      holders[storage] = holders.get(storage, 1) - 1
      if holders[storage] == 0:
        heap -= buffers[storage][0]
    elif kind == _SHARE:
      canonical[buffer] = shared
      holders[shared] = holders.get(shared, 0) + 1
      if holders[shared] == 1:
        heap += buffers[shared][0]
    out.append(heap)
  return out


def _lifetimes(events, steps, entry: str) -> dict[int, tuple[int, int]]:
  """Each entry buffer's first and last step holding storage in the trace
  (``HeapTrace.lifetimes``). A called computation's events are left out:
  its buffers run within one step, and one sharing an entry buffer's
  storage (a loop body's state) does not end the entry buffer's hold."""
  start: dict[int, int] = {}
  end: dict[int, int] = {}
  holder: dict[int, int] = {}  # storage -> the buffer holding it last
  for (kind, buffer, shared, computation, _), step in zip(events, steps):
    if computation != entry:
      continue
    if kind == _FREE:  # unless it handed its storage over before
      end.setdefault(buffer, step)
      continue
    start[buffer] = step
    storage = buffer if kind == _ALLOC else shared
    previous = holder.get(storage)
    if previous is not None and end.get(previous, step) >= step:  # handed over
      end[previous] = step - 1
    holder[storage] = buffer
  last = steps[-1] if steps else 0
  return {b: (s, end.get(b, last)) for b, s in start.items()}


def _indefinite(buffers, allocations, owner, traces) -> int:
  """Device memory (color 0) outside every trace that lives for the whole
  program: each parameter, output or constant allocation holding such a
  buffer, once. (A temporary allocation no trace covers, such as device
  memory's when a TPU's trace of on-chip memory is the one followed, is not
  in XLA's figure.)"""
  traced = {event[1] for events in traces for event in events}
  held = {owner.get(b) for b in traced}
  total = 0
  for buffer, (_, color) in buffers.items():
    allocation = owner.get(buffer)
    if buffer in traced or color != 0 or allocation is None or allocation in held:
      continue
    if allocations[allocation][1]:
      total += allocations[allocation][0]
    held.add(allocation)
  return total


def _steps_of(events, module: HloModule) -> list[int]:
  """The entry step of each event. An entry buffer's allocation, or its
  taking over another's storage (a loop's state, an in-place update), is
  at its instruction's step; a called computation's, at the next step
  from the one reached so far that runs it (a computation several steps
  call, such as a reduction's, belongs to the one running now); a free
  names the buffer's own instruction, not the one that frees it, so it
  happens at the step reached so far."""
  entry = {ins.name: step for step, ins in enumerate(module.entry_instructions)}
  called = {name: sorted(at) for name, at in module.steps_running().items()}
  steps, step = [], 0
  for kind, _, _, computation, instruction in events:
    if kind != _FREE:
      if computation == module.entry:
        found = entry.get(instruction)
      else:
        at = called.get(computation, [])
        later = bisect.bisect_left(at, step)
        found = at[min(later, len(at) - 1)] if at else None
      if found is not None:
        step = max(step, found)
    steps.append(step)
  return steps
