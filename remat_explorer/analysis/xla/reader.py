"""XLA's compiled program, read once into one typed object.

Every reading of what XLA made of a training step (the memory timeline,
the peak, the executed FLOPs, the collectives) consumes a
``CompiledProgram``; nothing else asks the executable for its text or its
protos. An executable exposes three things, read here together:

* its optimized module as text (``compiled.as_text()``), parsed by ``hlo``:
  each computation's instructions in schedule order, with their shapes,
  operands, called computations, loop trip counts and op metadata;
* the same module as an ``HloModuleProto``, for what the text does not
  give by name: the instruction ids the buffer assignment refers to, and
  the table of Python stacks behind each instruction's ``stack_frame_id``;
* ``memory_analysis()``'s ``serialized_buffer_assignment_proto``
  (``buffers``); for TPUs and GPUs, which leave it empty, the one XLA
  dumped with the module (``xla_dump``), read with the dumped module's
  instruction ids. The stacks stay the executable's: the dumped module
  numbers its table of frames apart from the ids in the text.
"""

from __future__ import annotations

import dataclasses

from remat_explorer.analysis.xla.buffers import BufferAssignment, read_buffer_assignment
from remat_explorer.analysis.xla.heap_trace import HeapTrace, read_heap_trace
from remat_explorer.analysis.xla.hlo import HloModule, parse_hlo
from remat_explorer.analysis.xla.hlo_provenance import StackIndex, read_stack_index


@dataclasses.dataclass(frozen=True)
class CompiledProgram:
  module: HloModule
  """The optimized module: instructions, schedule, loops, op metadata."""
  buffers: BufferAssignment | None
  """XLA's buffer assignment; None where the executable does not expose it."""
  stacks: StackIndex | None
  """The Python stacks of the module's instructions; None where it has none."""
  heap: HeapTrace | None = None
  """XLA's heap simulation replayed (``heap_trace``): read for TPUs and GPUs,
  whose peak XLA reports from it."""


def read_compiled(compiled, memory=None, dumped: tuple[bytes, bytes] | None = None
                  ) -> CompiledProgram:
  """Read ``jax.jit(f).lower(*args).compile()``; `memory`: its
  ``memory_analysis()``, where the caller has it already; `dumped`: the
  module and buffer assignment protos XLA dumped for it (``xla_dump``),
  where the executable does not carry its buffer assignment (TPUs, GPUs)."""
  module = parse_hlo(compiled.as_text())
  proto = _module_proto(compiled)
  # The stack frame ids in the text index the executable's own table of
  # frames, never the dumped module's, which numbers them apart.
  stacks = None if proto is None else read_stack_index(proto)
  assignment = _buffer_assignment_proto(compiled, memory)
  heap = None
  if not assignment and dumped is not None:
    proto, assignment = dumped  # one module's ids, read together
    heap = read_heap_trace(assignment, module)
  if proto is None:
    return CompiledProgram(module, None, None)
  buffers = None if not assignment else read_buffer_assignment(assignment, proto)
  return CompiledProgram(module, buffers, stacks, heap)


def _module_proto(compiled) -> bytes | None:
  """The optimized ``HloModuleProto``, or None where the executable does
  not expose exactly one."""
  try:
    modules = compiled.runtime_executable().hlo_modules()
  except Exception:  # not every backend or JAX version exposes it
    return None
  return modules[0].as_serialized_hlo_module_proto() if len(modules) == 1 else None


def _buffer_assignment_proto(compiled, memory) -> bytes | None:
  try:
    memory = compiled.memory_analysis() if memory is None else memory
    return memory.serialized_buffer_assignment_proto
  except Exception:  # not every backend or JAX version exposes it
    return None
