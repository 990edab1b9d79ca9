"""The compiled program, read once: its HLO and XLA's buffer assignment.

Two readings of one executable, shared by the memory timeline
(``timeline.py``) and the collectives (``collectives.py``):

* ``parse_hlo(compiled.as_text())``: the scheduled HLO module as text gives
  each computation's instructions in the order they run, with their result
  shapes (leaf sizes and memory spaces), operands, called computations and
  the metadata JAX attaches (``op_name``, the name stack; ``source_file``
  and ``source_line``).
* ``read_placement(compiled)``: XLA's buffer assignment (the
  ``serialized_buffer_assignment_proto`` of ``memory_analysis()``, keyed by
  the instruction ids of the module's own proto): every logical buffer XLA
  allocates, its size, the allocation it lives in and its offset there.
  ``argument_size_in_bytes``, ``output_size_in_bytes`` and
  ``temp_size_in_bytes`` are sums of these allocations' sizes.

Both protos are read with a small reader of protobuf's wire format, since
jaxlib ships no Python classes for them; only the fields named below are
read, so fields a later XLA adds are skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, NamedTuple, Union


# -- HLO text -------------------------------------------------------------------

class Leaf(NamedTuple):
  """One array of an instruction's result."""
  bytes: int
  memory_space: int
  """0 for device memory; ``S(n)`` in the layout gives n (5: pinned host)."""
  type: str
  """Dtype, dims and memory space: results of equal type may share storage."""


Shape = Union[Leaf, list]
"""A leaf, or a list of shapes for a tuple result."""


@dataclasses.dataclass
class Instruction:
  name: str
  shape: Shape
  opcode: str
  args: str
  """The text between the opcode's parentheses."""
  attrs: str
  """The text after them: attributes and metadata."""
  is_root: bool

  def __post_init__(self):
    self.operands = re.findall(r'%([\w.\-]+)', self.args)

  # Read from the metadata on demand: most instructions are never asked.
  @functools.cached_property
  def op_name(self) -> str:
    """JAX's name stack, e.g. ``jit(f)/transpose(jvp())/dot_general``."""
    m = re.search(r'\bop_name="((?:[^"\\]|\\.)*)"', self.attrs)
    return m.group(1) if m else ''

  @functools.cached_property
  def source(self) -> str:
    """``file:line`` of the JAX call that produced it, if recorded."""
    file = re.search(r'\bsource_file="((?:[^"\\]|\\.)*)"', self.attrs)
    line = re.search(r'\bsource_line=(\d+)', self.attrs)
    return f'{file.group(1)}:{line.group(1)}' if file and line else ''

  def attr(self, key: str) -> str | None:
    m = re.search(rf'\b{key}=%?([\w.\-]+)', self.attrs)
    return m.group(1) if m else None

  @property
  def tuple_index(self) -> int:
    """The ``index=`` of a ``get-tuple-element``."""
    return int(re.search(r'\bindex=(\d+)', self.attrs).group(1))

  def called(self) -> list[str]:
    """Computations run as part of this instruction: not fusions' and not
    the scalar ones of reduce, sort, scatter, ..., which are loop bodies."""
    keys = {'while': 'body|condition', 'call': 'to_apply',
            'conditional': 'true_computation|false_computation'}
    if self.opcode not in keys:
      return []
    names = re.findall(rf'\b(?:{keys[self.opcode]})=%?([\w.\-]+)', self.attrs)
    if m := re.search(r'branch_computations=\{([^}]*)\}', self.attrs):
      names += re.findall(r'%?([\w.\-]+)', m.group(1))
    return names

  def all_called(self) -> list[str]:
    """Every computation named in the attributes, fusions' included."""
    names = re.findall(r'\b(?:calls|to_apply|body|condition|true_computation|'
                       r'false_computation)=%?([\w.\-]+)', self.attrs)
    for group in re.findall(r'\b(?:branch_computations|called_computations)'
                            r'=\{([^}]*)\}', self.attrs):
      names += re.findall(r'%?([\w.\-]+)', group)
    return names


Donation = tuple[list[int], int, list[int]]
"""(output index, parameter number, index in that parameter) of an
``input_output_alias``: the parameter's buffer is reused for the output."""


@dataclasses.dataclass(frozen=True)
class HloModule:
  computations: dict[str, list[Instruction]]
  """Each computation's instructions, in schedule order."""
  entry: str
  donations: tuple[Donation, ...] = ()

  @property
  def entry_instructions(self) -> list[Instruction]:
    return self.computations[self.entry]


def root(instructions: list[Instruction]) -> Instruction | None:
  return next((x for x in instructions if x.is_root),
              instructions[-1] if instructions else None)


def leaves(value: Any) -> list:
  """The leaves of a (possibly nested) list: a shape's arrays, in order."""
  if isinstance(value, list):
    return [x for v in value for x in leaves(v)]
  return [value]


def at(value: Any, path: list[int]) -> Any:
  """The element of a nested list at `path`, or None past its end."""
  for k in path:
    value = value[k] if isinstance(value, list) and k < len(value) else None
  return value


_HEADER = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*->.*\{\s*$')
_INSTR = re.compile(r'^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*')
_OPCODE = re.compile(r'\s*([\w\-]+)\(')
_ARRAY = re.compile(r'(\w+)\[([^\]]*)\](\{[^}]*\})?')
_SEPARATORS = re.compile(r'(\s|,|/\*.*?\*/)*')
_PARENS = re.compile(r'[()]')


def parse_hlo(text: str) -> HloModule:
  """The computations of an HLO module's text, its entry and its donations."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = '', None
  for line in text.splitlines():
    if current is None:
      if m := _HEADER.match(line):
        current = computations.setdefault(m.group(2), [])
        entry = m.group(2) if m.group(1) else entry
    elif line.strip() == '}':
      current = None
    elif m := _INSTR.match(line):
      current.append(_parse_instruction(line, m))
  if not entry:
    raise ValueError('no ENTRY computation in the HLO text')
  return HloModule(computations, entry, tuple(_donations(text)))


def _donations(text: str) -> list[Donation]:
  m = re.search(r'input_output_alias=\{(.*?\))\s*\}', text.split('\n', 1)[0])
  found = re.findall(r'\{([\d,\s]*)\}:\s*\((\d+),\s*\{([\d,\s]*)\}',
                     m.group(1) if m else '')
  path = lambda s: [int(k) for k in re.findall(r'\d+', s)]
  return [(path(out), int(num), path(index)) for out, num, index in found]


def _parse_instruction(line: str, m: re.Match) -> Instruction:
  shape, i = _parse_shape(line, m.end())
  if not (op := _OPCODE.match(line, i)):
    raise ValueError(f'cannot parse HLO instruction: {line.strip()}')
  j = _after_closing_paren(line, op.end())
  return Instruction(m.group(2), shape, op.group(1), line[op.end():j - 1],
                     line[j:], bool(m.group(1)))


def _after_closing_paren(line: str, start: int) -> int:
  """The position after the ``)`` closing a ``(`` just before `start`."""
  depth = 1
  for m in _PARENS.finditer(line, start):
    depth += 1 if m.group() == '(' else -1
    if not depth:
      return m.end()
  raise ValueError(f'unbalanced parentheses in HLO instruction: {line.strip()}')


def _parse_shape(text: str, i: int) -> tuple[Shape, int]:
  if text[i] == '(':
    elements: list[Shape] = []
    i += 1
    while text[i := _SEPARATORS.match(text, i).end()] != ')':
      element, i = _parse_shape(text, i)
      elements.append(element)
    return elements, i + 1
  if not (m := _ARRAY.match(text, i)):
    raise ValueError(f'cannot parse HLO shape at: {text[i:i + 40]!r}')
  dtype, dims, layout = m.groups()
  space = re.search(r'S\((\d+)\)', layout or '')
  space = int(space.group(1)) if space else 0
  n = 1
  for d in re.findall(r'\d+', dims):  # a dynamic '<=8' counts as its bound
    n *= int(d)
  return Leaf(n * _dtype_bits(dtype) // 8, space, f'{dtype}[{dims}]S{space}'), m.end()


@functools.lru_cache(maxsize=None)
def _dtype_bits(dtype: str) -> int:
  if dtype == 'pred':
    return 8
  m = re.search(r'\d+', dtype)  # f32, bf16, s4, c64, f8e4m3fn, ...
  return int(m.group()) if m else 0  # token[] holds no data


# -- XLA's buffer assignment -----------------------------------------------------

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


@dataclasses.dataclass(frozen=True)
class Allocation:
  index: int
  bytes: int
  kind: str
  """One of ``ALLOCATION_KINDS``; a donated parameter's is ``parameter``."""


@dataclasses.dataclass(frozen=True)
class Placement:
  allocations: dict[int, Allocation]
  buffers: tuple[PlacedBuffer, ...]

  def bytes_of(self, kind: str) -> int:
    return sum(a.bytes for a in self.allocations.values() if a.kind == kind)


def read_placement(compiled) -> Placement | None:
  """XLA's buffer assignment of a compiled executable, or None where the
  executable does not expose it (or its ids cannot be resolved)."""
  try:
    proto = compiled.memory_analysis().serialized_buffer_assignment_proto
    modules = compiled.runtime_executable().hlo_modules()
  except Exception:  # not every backend or JAX version exposes both
    return None
  if not proto or len(modules) != 1:
    return None
  names = _instruction_names(modules[0].as_serialized_hlo_module_proto())
  return placement_from_protos(proto, names)


def placement_from_protos(assignment: bytes, names: dict[int, tuple[str, str]]
                          ) -> Placement | None:
  """Decode a ``BufferAssignmentProto``, naming each logical buffer's
  defining instruction through `names` (instruction id -> (computation,
  instruction))."""
  logical = {}
  allocations, placed = {}, []
  for number, value in _fields(assignment):
    if number == 1:  # LogicalBufferProto
      buffer = _message(value)
      location = _message(buffer.get(3, [b''])[0])
      instruction = names.get(_one(location, 4))
      if instruction is None:
        return None
      logical[_one(buffer, 1)] = (instruction, tuple(_packed(location.get(3, []))))
    elif number == 3:  # BufferAllocationProto
      allocation = _message(value)
      index = _one(allocation, 1)
      allocations[index] = Allocation(index, _one(allocation, 2),
                                      _allocation_kind(allocation))
      for assigned in allocation.get(9, []):
        a = _message(assigned)
        placed.append((_one(a, 1), index, _one(a, 2), _one(a, 3)))
  buffers = []
  for buffer_id, index, offset, size in placed:
    if buffer_id not in logical:
      return None
    (computation, instruction), shape_index = logical[buffer_id]
    buffers.append(PlacedBuffer(computation, instruction, shape_index, size,
                                index, offset))
  return Placement(allocations, tuple(buffers))


def _allocation_kind(allocation: dict) -> str:
  if _one(allocation, 5):
    return 'parameter'
  if _one(allocation, 12):
    return 'constant'
  if _one(allocation, 3):
    return 'thread_local'
  return 'output' if _one(allocation, 7) else 'temp'


def _instruction_names(module_proto: bytes) -> dict[int, tuple[str, str]]:
  """Instruction id -> (computation name, instruction name), from an
  ``HloModuleProto`` (computations: field 3; their name 1 and instructions
  2; an instruction's name 1 and id 35)."""
  names = {}
  for number, value in _fields(module_proto):
    if number != 3:
      continue
    computation = _message(value)
    computation_name = computation.get(1, [b''])[0].decode()
    for instruction in computation.get(2, []):
      fields = _message(instruction)
      names[_one(fields, 35)] = (computation_name, fields.get(1, [b''])[0].decode())
  return names


# -- protobuf's wire format ---------------------------------------------------------

def _varint(data: bytes, i: int) -> tuple[int, int]:
  result = shift = 0
  while True:
    byte = data[i]
    i += 1
    result |= (byte & 0x7F) << shift
    shift += 7
    if byte < 0x80:
      return result, i


def _fields(data: bytes):
  """(field number, value) pairs: ints for varints, bytes otherwise."""
  i = 0
  while i < len(data):
    key, i = _varint(data, i)
    number, wire_type = key >> 3, key & 7
    if wire_type == 0:
      value, i = _varint(data, i)
    elif wire_type == 2:
      size, i = _varint(data, i)
      value, i = data[i:i + size], i + size
    elif wire_type in (1, 5):
      size = 8 if wire_type == 1 else 4
      value, i = data[i:i + size], i + size
    else:
      raise ValueError(f'unsupported protobuf wire type {wire_type}')
    yield number, value


def _message(data: bytes) -> dict[int, list]:
  out: dict[int, list] = {}
  for number, value in _fields(data):
    out.setdefault(number, []).append(value)
  return out


def _one(message: dict[int, list], number: int) -> int:
  """A scalar field; proto3 leaves zeros (and False) out."""
  return message.get(number, [0])[-1]


def _packed(values: list) -> list[int]:
  """A repeated int field, packed (one bytes value) or not (ints)."""
  out = []
  for value in values:
    if isinstance(value, int):
      out.append(value)
      continue
    i = 0
    while i < len(value):
      v, i = _varint(value, i)
      out.append(v)
  return out
