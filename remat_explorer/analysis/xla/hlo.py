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

Both protos are read with a small reader of protobuf's wire format
(``protowire.py``), since jaxlib ships no Python classes for them; only the
fields named below are read, so fields a later XLA adds are skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, NamedTuple, Union

from remat_explorer.analysis.units import element_bits
from remat_explorer.analysis.xla import protowire as wire
from remat_explorer.engine import in_recompute


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
    self.operands = _OPERAND.findall(self.args)

  # Read from the metadata on demand: most instructions are never asked.
  @functools.cached_property
  def op_name(self) -> str:
    """JAX's name stack, e.g. ``jit(f)/transpose(jvp())/dot_general``."""
    m = _OP_NAME.search(self.attrs)
    return m.group(1) if m else ''

  @functools.cached_property
  def source(self) -> str:
    """``file:line`` of the JAX call that produced it, if recorded."""
    file = _SOURCE_FILE.search(self.attrs)
    line = _SOURCE_LINE.search(self.attrs)
    return f'{file.group(1)}:{line.group(1)}' if file and line else ''

  def attr(self, key: str) -> str | None:
    m = re.search(rf'\b{key}=%?([\w.\-]+)', self.attrs)
    return m.group(1) if m else None

  @property
  def tuple_index(self) -> int:
    """The ``index=`` of a ``get-tuple-element``."""
    return int(_TUPLE_INDEX.search(self.attrs).group(1))

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

  def branches(self) -> list[str]:
    """A conditional's branches by index: ``branch_computations`` in order,
    or a predicate's (false, true)."""
    if m := re.search(r'branch_computations=\{([^}]*)\}', self.attrs):
      return re.findall(r'%?([\w.\-]+)', m.group(1))
    return [self.attr('false_computation'), self.attr('true_computation')]

  def all_called(self) -> list[str]:
    """Every computation named in the attributes, fusions' included."""
    if not _may_call(self.attrs):
      return []
    names = _CALLED.findall(self.attrs)
    for group in _CALLED_GROUP.findall(self.attrs):
      names += _NAME.findall(group)
    return names


# The patterns above, compiled once: the timeline asks every instruction.
# In a quoted string, a run of plain characters is possessive (a backslash
# or the closing quote ends it, so giving one back never helps a match):
# `re` then reads the run in one go rather than a character at a time.
def pass_of(op_name: str) -> str:
  """The pass an instruction belongs to, from its JAX name stack:
  ``rematted_computation`` is remat's recompute, ``transpose(...)`` the
  backward pass, any other name the forward pass."""
  if not op_name:
    return ''
  if in_recompute(op_name):
    return 'recompute'
  return 'backward' if 'transpose(' in op_name else 'forward'


_OPERAND = re.compile(r'%([\w.\-]+)')
_OP_NAME = re.compile(r'\bop_name="((?:[^"\\]++|\\.)*+)"')
_SOURCE_FILE = re.compile(r'\bsource_file="((?:[^"\\]++|\\.)*+)"')
_SOURCE_LINE = re.compile(r'\bsource_line=(\d+)')
_TUPLE_INDEX = re.compile(r'\bindex=(\d+)')
_CALLED = re.compile(r'\b(?:calls|to_apply|body|condition|true_computation|'
                     r'false_computation)=%?([\w.\-]+)')
_CALLED_GROUP = re.compile(r'\b(?:branch_computations|called_computations)'
                           r'=\{([^}]*)\}')
_NAME = re.compile(r'%?([\w.\-]+)')


def _may_call(attrs: str) -> bool:
  """False where `_CALLED` and `_CALLED_GROUP` cannot match: no key of
  theirs occurs (``computation`` covers the last four). Most instructions
  call nothing, and these substring tests are much faster than a search."""
  return ('calls=' in attrs or 'to_apply=' in attrs or 'body=' in attrs
          or 'condition=' in attrs or 'computation' in attrs)


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
  close = line.find(')', start)
  if close >= 0 and line.find('(', start, close) < 0:
    return close + 1  # the usual case: operands hold no parentheses
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
  return _leaf(*m.groups()), m.end()


@functools.lru_cache(maxsize=4096)
def _leaf(dtype: str, dims: str, layout: str | None) -> Leaf:
  """The leaf of an array type, read once per distinct type: a module
  repeats a few types thousands of times."""
  space = re.search(r'S\((\d+)\)', layout or '')
  space = int(space.group(1)) if space else 0
  n = 1
  for d in re.findall(r'\d+', dims):  # a dynamic '<=8' counts as its bound
    n *= int(d)
  return Leaf(n * element_bits(dtype) // 8, space, f'{dtype}[{dims}]S{space}')


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


def read_placement(compiled, memory=None) -> Placement | None:
  """XLA's buffer assignment of a compiled executable, or None where the
  executable does not expose it (or its ids cannot be resolved).
  `memory`: ``compiled.memory_analysis()``, where the caller has it."""
  try:
    memory = compiled.memory_analysis() if memory is None else memory
    proto = memory.serialized_buffer_assignment_proto
    modules = compiled.runtime_executable().hlo_modules()
  except Exception:  # not every backend or JAX version exposes both
    return None
  if not proto or len(modules) != 1:
    return None
  module = modules[0].as_serialized_hlo_module_proto()
  # Fusion computations hold most of a module's instructions but define no
  # buffer of the assignment (their fusion instruction does), so they are
  # read only if some buffer's instruction is not found without them.
  placement = placement_from_protos(proto, _instruction_names(module, fused=False))
  if placement is None:
    placement = placement_from_protos(proto, _instruction_names(module))
  return placement


def placement_from_protos(assignment: bytes, names: dict[int, tuple[str, str]]
                          ) -> Placement | None:
  """Decode a ``BufferAssignmentProto``, naming each logical buffer's
  defining instruction through `names` (instruction id -> (computation,
  instruction))."""
  data = assignment
  logical = {}
  allocations, placed = {}, []
  for number, value in wire.fields(data, wire.whole(data), (1, 3)):
    if number == 1:  # LogicalBufferProto: id 1, defined_at 3
      buffer = wire.message(data, value, (1, 3))
      # Its location: instruction id 4, shape index 3.
      location = wire.message(data, buffer.get(3, [wire.EMPTY])[0], (3, 4))
      instruction = names.get(wire.scalar(location, 4))
      if instruction is None:
        return None
      logical[wire.scalar(buffer, 1)] = (
          instruction, tuple(wire.packed(data, location.get(3, []))))
    elif number == 3:  # BufferAllocationProto
      allocation = wire.message(data, value, _ALLOCATION_FIELDS)
      index = wire.scalar(allocation, 1)
      allocations[index] = Allocation(index, wire.scalar(allocation, 2),
                                      _allocation_kind(allocation))
      for assigned in allocation.get(9, []):  # buffer id 1, offset 2, size 3
        a = wire.message(data, assigned, (1, 2, 3))
        placed.append((wire.scalar(a, 1), index, wire.scalar(a, 2), wire.scalar(a, 3)))
  buffers = []
  for buffer_id, index, offset, size in placed:
    if buffer_id not in logical:
      return None
    (computation, instruction), shape_index = logical[buffer_id]
    buffers.append(PlacedBuffer(computation, instruction, shape_index, size,
                                index, offset))
  return Placement(allocations, tuple(buffers))


_ALLOCATION_FIELDS = (1, 2, 3, 5, 7, 9, 12)
"""Index, size, is_thread_local, is_entry_computation_parameter,
maybe_live_out, assigned (buffers), is_constant."""


def _allocation_kind(allocation: dict) -> str:
  if wire.scalar(allocation, 5):
    return 'parameter'
  if wire.scalar(allocation, 12):
    return 'constant'
  if wire.scalar(allocation, 3):
    return 'thread_local'
  return 'output' if wire.scalar(allocation, 7) else 'temp'


def _instruction_names(module_proto: bytes, fused: bool = True
                       ) -> dict[int, tuple[str, str]]:
  """Instruction id -> (computation name, instruction name), from an
  ``HloModuleProto`` (computations: field 3; their name 1, instructions 2
  and is_fusion_computation 7; an instruction's name 1 and id 35), without
  the fusion computations' instructions unless `fused`."""
  data, names = module_proto, {}
  for _, span in wire.fields(data, wire.whole(data), (3,)):
    computation = wire.message(data, span, (1, 2, 7))
    if not fused and wire.scalar(computation, 7):
      continue
    computation_name = wire.text(data, computation, 1)
    for instruction in computation.get(2, []):
      fields = wire.message(data, instruction, (1, 35))
      names[wire.scalar(fields, 35)] = (computation_name, wire.text(data, fields, 1))
  return names
