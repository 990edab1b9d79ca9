"""XLA's buffer assignment: every buffer the compiled program allocates.

``memory_analysis().serialized_buffer_assignment_proto`` lists each
logical buffer (the instruction and tuple index that defines it) and each
allocation (its size, its kind, and the buffers placed in it at which
offsets). ``argument_size_in_bytes``, ``output_size_in_bytes`` and
``temp_size_in_bytes`` are sums of these allocations' sizes. Buffers name
their instruction by id; the ids resolve through the module's own proto.
"""

from __future__ import annotations

import dataclasses

from remat_explorer.analysis.xla import protowire as wire, xla_protos as pb

ALLOCATION_KINDS = ('parameter', 'output', 'temp', 'constant', 'thread_local')


@dataclasses.dataclass(frozen=True)
class PlacedBuffer:
  """One logical buffer as XLA placed it."""
  computation: str
  instruction: str
  """The instruction that defines it (its name in the HLO text)."""
  shape_index: tuple[int, ...]
  """Which leaf of a tuple result; () for an array result."""
  bytes: int
  allocation: int
  offset: int
  """Where in its allocation it starts: buffers of one allocation whose
  byte ranges overlap are never live at the same time."""
  logical_buffer: int = -1
  """Its id in the assignment (``HeapTrace.lifetimes`` is keyed by it)."""


@dataclasses.dataclass(frozen=True)
class Allocation:
  index: int
  bytes: int
  kind: str
  """One of ``ALLOCATION_KINDS``; a donated parameter's is ``parameter``."""
  color: int = 0
  """The memory it lies in: 0 is the device's main memory (HBM); others are
  a TPU's on-chip memory (1), semaphores and flags (2, 6), ..."""


@dataclasses.dataclass(frozen=True)
class BufferAssignment:
  allocations: dict[int, Allocation]
  buffers: tuple[PlacedBuffer, ...]

  def bytes_of(self, kind: str) -> int:
    """Bytes of the allocations of `kind` in the device's main memory."""
    return sum(a.bytes for a in self.allocations.values()
               if a.kind == kind and a.color == 0)


def read_buffer_assignment(assignment: bytes, module_proto: bytes
                           ) -> BufferAssignment | None:
  """The buffer assignment of a module, or None where some buffer's
  instruction cannot be found in `module_proto`.

  Fusion computations hold most of a module's instructions but define no
  buffer of the assignment (their fusion instruction does), so they are
  read only if some buffer's instruction is not found without them.
  """
  found = _decode(assignment, _instruction_names(module_proto, fused=False))
  return found if found is not None else _decode(
      assignment, _instruction_names(module_proto, fused=True))


def _decode(data: bytes, names: dict[int, tuple[str, str]]) -> BufferAssignment | None:
  """A ``BufferAssignmentProto``, each logical buffer's defining instruction
  named through `names` (instruction id -> (computation, instruction))."""
  defined_at = {}  # logical buffer id -> ((computation, instruction), shape index)
  allocations, placed = {}, []
  wanted = (pb.BufferAssignment.LOGICAL_BUFFERS, pb.BufferAssignment.BUFFER_ALLOCATIONS)
  for number, span in wire.fields(data, wire.whole(data), wanted):
    if number == pb.BufferAssignment.LOGICAL_BUFFERS:
      buffer_id, site = _logical_buffer(data, span, names)
      if site is None:
        return None
      defined_at[buffer_id] = site
    else:
      allocation, assigned = _allocation(data, span)
      allocations[allocation.index] = allocation
      placed += [(buffer_id, allocation.index, offset, size)
                 for buffer_id, offset, size in assigned]
  buffers = []
  for buffer_id, index, offset, size in placed:
    if buffer_id not in defined_at:
      return None
    (computation, instruction), shape_index = defined_at[buffer_id]
    buffers.append(PlacedBuffer(computation, instruction, shape_index, size, index, offset,
                                buffer_id))
  return BufferAssignment(allocations, tuple(buffers))


def _logical_buffer(data: bytes, span, names):
  """(id, ((computation, instruction), shape index)) of a
  ``LogicalBufferProto``; the site is None where its instruction is not
  among `names`."""
  buffer = wire.message(data, span, (pb.LogicalBuffer.ID, pb.LogicalBuffer.DEFINED_AT))
  location = wire.message(
      data, buffer.get(pb.LogicalBuffer.DEFINED_AT, [wire.EMPTY])[0],
      (pb.LogicalBufferLocation.SHAPE_INDEX, pb.LogicalBufferLocation.INSTRUCTION_ID))
  instruction = names.get(wire.scalar(location, pb.LogicalBufferLocation.INSTRUCTION_ID))
  shape_index = tuple(wire.packed(data, location.get(pb.LogicalBufferLocation.SHAPE_INDEX, [])))
  return (wire.scalar(buffer, pb.LogicalBuffer.ID),
          None if instruction is None else (instruction, shape_index))


def _allocation(data: bytes, span) -> tuple[Allocation, list[tuple[int, int, int]]]:
  """A ``BufferAllocationProto``: the allocation, and the (buffer id,
  offset, size) of each buffer assigned to it."""
  f = pb.BufferAllocation
  allocation = wire.message(data, span, (
      f.INDEX, f.SIZE, f.IS_THREAD_LOCAL, f.IS_ENTRY_COMPUTATION_PARAMETER,
      f.MAYBE_LIVE_OUT, f.ASSIGNED, f.IS_CONSTANT, f.COLOR))
  if wire.scalar(allocation, f.IS_ENTRY_COMPUTATION_PARAMETER):
    kind = 'parameter'
  elif wire.scalar(allocation, f.IS_CONSTANT):
    kind = 'constant'
  elif wire.scalar(allocation, f.IS_THREAD_LOCAL):
    kind = 'thread_local'
  else:
    kind = 'output' if wire.scalar(allocation, f.MAYBE_LIVE_OUT) else 'temp'
  a = pb.BufferAllocationAssigned
  assigned = []
  for entry in allocation.get(f.ASSIGNED, []):
    fields = wire.message(data, entry, (a.LOGICAL_BUFFER_ID, a.OFFSET, a.SIZE))
    assigned.append((wire.scalar(fields, a.LOGICAL_BUFFER_ID), wire.scalar(fields, a.OFFSET),
                     wire.scalar(fields, a.SIZE)))
  return (Allocation(wire.scalar(allocation, f.INDEX), wire.scalar(allocation, f.SIZE), kind,
                     wire.scalar(allocation, f.COLOR) or 0), assigned)


def _instruction_names(module_proto: bytes, fused: bool) -> dict[int, tuple[str, str]]:
  """Instruction id -> (computation name, instruction name), from an
  ``HloModuleProto``, without the fusion computations' instructions unless
  `fused`."""
  data, names = module_proto, {}
  c, i = pb.HloComputation, pb.HloInstruction
  for _, span in wire.fields(data, wire.whole(data), (pb.HloModule.COMPUTATIONS,)):
    computation = wire.message(data, span, (c.NAME, c.INSTRUCTIONS, c.IS_FUSION_COMPUTATION))
    if not fused and wire.scalar(computation, c.IS_FUSION_COMPUTATION):
      continue
    computation_name = wire.text(data, computation, c.NAME)
    for instruction in computation.get(c.INSTRUCTIONS, []):
      fields = wire.message(data, instruction, (i.NAME, i.ID))
      names[wire.scalar(fields, i.ID)] = (computation_name, wire.text(data, fields, i.NAME))
  return names
