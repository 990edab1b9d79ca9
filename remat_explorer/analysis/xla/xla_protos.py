"""The fields of XLA's protos that this project reads, by name.

jaxlib ships no Python classes for these messages, so ``protowire`` reads
their bytes; the numbers below are those of XLA's ``hlo.proto``
(``xla/service/hlo.proto``), one class per message, so that a reader says
``HloModule.COMPUTATIONS`` rather than ``3``. Only fields read anywhere
here are listed; proto3 keeps numbers stable across XLA versions.
"""


class HloModule:
  COMPUTATIONS = 3
  STACK_FRAME_INDEX = 17


class HloComputation:
  NAME = 1
  INSTRUCTIONS = 2
  IS_FUSION_COMPUTATION = 7


class HloInstruction:
  NAME = 1
  ID = 35


class StackFrameIndex:
  FILE_NAMES = 1
  FUNCTION_NAMES = 2
  FILE_LOCATIONS = 3
  STACK_FRAMES = 4


class FileLocation:
  FILE_NAME_ID = 1
  FUNCTION_NAME_ID = 2
  LINE = 3


class StackFrame:
  FILE_LOCATION_ID = 1
  PARENT_FRAME_ID = 2


class BufferAssignment:
  LOGICAL_BUFFERS = 1
  BUFFER_ALLOCATIONS = 3
  HEAP_SIMULATOR_TRACES = 4


class LogicalBuffer:
  ID = 1
  SIZE = 2
  DEFINED_AT = 3
  COLOR = 4


class HeapSimulatorTrace:
  EVENTS = 1
  BUFFER_ALLOCATION_INDEX = 3


class HeapSimulatorEvent:
  KIND = 1
  """ALLOC (0), FREE (1) or SHARE_WITH (2)."""
  BUFFER_ID = 2
  COMPUTATION_NAME = 3
  INSTRUCTION_NAME = 4
  SHARE_WITH_CANONICAL_ID = 5


class LogicalBufferLocation:
  SHAPE_INDEX = 3
  INSTRUCTION_ID = 4


class BufferAllocation:
  INDEX = 1
  SIZE = 2
  IS_THREAD_LOCAL = 3
  IS_ENTRY_COMPUTATION_PARAMETER = 5
  MAYBE_LIVE_OUT = 7
  COLOR = 8
  ASSIGNED = 9
  IS_CONSTANT = 12


class HloProto:
  """What XLA dumps of a compiled module (``xla_dump_hlo_as_proto``)."""
  HLO_MODULE = 1
  BUFFER_ASSIGNMENT = 3


class BufferAllocationAssigned:
  LOGICAL_BUFFER_ID = 1
  OFFSET = 2
  SIZE = 3
