"""XLA's optimized module as text, parsed: what each computation runs.

``parse_hlo(compiled.as_text())`` gives each computation's instructions in
the order they run, with their result shapes (leaf sizes and memory
spaces), operands, called computations, loop trip counts and the metadata
JAX attaches (``op_name``, the name stack; ``stack_frame_id``, or
``source_file`` and ``source_line`` on older XLA), and keeps each
computation's text so that one can be measured alone (``as_entry``).
``reader.read_compiled`` reads it with the module's protos.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, NamedTuple, Union

from remat_explorer.analysis.units import element_bits
from remat_explorer.engine import in_backward_pass, in_recompute


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
    self.trip_count: int | None = None
    """How often a ``while`` loop runs: XLA's ``known_trip_count`` where its
    backend config has one, else what ``_inferred_trip_count`` reads from
    the loop's counter (XLA:TPU's loops carry no such config)."""
    if self.opcode == 'while' and (m := _TRIP_COUNT.search(self.attrs)):
      self.trip_count = int(m.group(1))

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
  def is_matmul(self) -> bool:
    """A ``dot`` or ``convolution``, or what a GPU backend makes of one: a
    cuBLAS or cuDNN call, a Triton GEMM fusion."""
    return (self.opcode in ('dot', 'convolution')
            or (self.opcode == 'custom-call' and _LIBRARY_MATMUL.search(self.attrs) is not None)
            or '"__triton_gemm"' in self.attrs)

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
  return 'backward' if in_backward_pass(op_name) else 'forward'


_OPERAND = re.compile(r'%([\w.\-]+)')
_OP_NAME = re.compile(r'\bop_name="((?:[^"\\]++|\\.)*+)"')
_SOURCE_FILE = re.compile(r'\bsource_file="((?:[^"\\]++|\\.)*+)"')
_SOURCE_LINE = re.compile(r'\bsource_line=(\d+)')
_TUPLE_INDEX = re.compile(r'\bindex=(\d+)')
_LIBRARY_MATMUL = re.compile(r'custom_call_target="__(cublas|cudnn)')
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
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
  text: str = ''
  """The module's text, as XLA printed it."""
  spans: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
  """Each computation's lines in ``text`` (first, past the last)."""

  @property
  def entry_instructions(self) -> list[Instruction]:
    return self.computations[self.entry]

  def matmul_count(self) -> int:
    """Matmuls in every computation of the module, fused ones included."""
    return sum(i.is_matmul for instructions in self.computations.values()
               for i in instructions)

  def reachable(self, name: str) -> set[str]:
    """Computation `name` and every computation it calls, fusions' included."""
    seen, todo = set(), [name]
    while todo:
      c = todo.pop()
      if c not in seen:
        seen.add(c)
        for instruction in self.computations.get(c, []):
          todo.extend(instruction.all_called())
    return seen

  @functools.cached_property
  def _running(self) -> dict[str, set[int]]:
    running: dict[str, set[int]] = {}
    calls: dict[str, list[str]] = {}  # what each computation's instructions call
    for step, ins in enumerate(self.entry_instructions):
      stack, seen = list(ins.all_called()), set()
      while stack:
        name = stack.pop()
        if name in seen or name not in self.computations:
          continue
        seen.add(name)
        running.setdefault(name, set()).add(step)
        if name not in calls:
          calls[name] = [c for inner in self.computations[name]
                         for c in inner.all_called()]
        stack.extend(calls[name])
    return running

  def steps_running(self) -> dict[str, set[int]]:
    """For each computation, the entry steps that run it (directly or
    through the computations they call)."""
    return self._running

  def as_entry(self, name: str) -> str:
    """The module's text with computation `name` as its entry and only what
    it calls: a module of its own that XLA can parse and measure."""
    lines = self.text.splitlines()
    first = min((start for start, _ in self.spans.values()), default=len(lines))
    out = [lines[0].split(',')[0]]  # `HloModule name`, no entry layout
    out += lines[1:first]  # tables before the first computation (files, frames)
    for computation in sorted(self.reachable(name), key=lambda c: self.spans[c][0]):
      start, stop = self.spans[computation]
      header = _HEADER.match(lines[start])
      line = lines[start][len(header.group(1)):] if header.group(1) else lines[start]
      out.append('ENTRY ' + line if computation == name else line)
      out += lines[start + 1:stop]
    return '\n'.join(out) + '\n'


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
  spans: dict[str, tuple[int, int]] = {}
  entry, current, name, start = '', None, '', 0
  for number, line in enumerate(text.splitlines()):
    if current is None:
      if m := _HEADER.match(line):
        name, start = m.group(2), number
        current = computations.setdefault(name, [])
        entry = name if m.group(1) else entry
    elif line.strip() == '}':
      spans[name] = (start, number + 1)
      current = None
    elif m := _INSTR.match(line):
      current.append(_parse_instruction(line, m))
  if not entry:
    raise ValueError('no ENTRY computation in the HLO text')
  for instructions in computations.values():
    for loop in instructions:
      if loop.opcode == 'while' and loop.trip_count is None:
        loop.trip_count = _inferred_trip_count(computations, instructions, loop)
  return HloModule(computations, entry, tuple(_donations(text)), text, spans)


# -- trip counts of loops without XLA's ---------------------------------------------
# A loop that ``scan`` or ``fori_loop`` lowers to counts with one element of its
# state: set to a constant before the loop, compared with a constant by its
# condition, and stepped by a constant in its body. XLA's own analysis
# (``ComputeWhileLoopTripCount``) reads the same pattern; XLA:TPU leaves its
# result out of the text, so it is read again here, through the copies and
# bitcasts XLA puts between those instructions. Anything else is unknown.

_PASS_THROUGH = ('copy', 'bitcast', 'reshape')


def _inferred_trip_count(computations, caller: list[Instruction],
                         loop: Instruction) -> int | None:
  condition = computations.get(loop.attr('condition') or '', [])
  body = computations.get(loop.attr('body') or '', [])
  compare = root(condition)
  if compare is None or compare.opcode != 'compare' or len(compare.operands) != 2:
    return None
  direction = re.search(r'\bdirection=(\w+)', compare.attrs)
  in_condition = {i.name: i for i in condition}
  left, right = (_through(in_condition, name) for name in compare.operands)
  index, bound = _state_index(left), _integer(right)
  direction = direction.group(1) if direction else ''
  if index is None:  # the bound on the left: flip the comparison
    index, bound = _state_index(right), _integer(left)
    direction = {'LT': 'GT', 'GT': 'LT', 'LE': 'GE', 'GE': 'LE'}.get(direction, direction)
  if index is None or bound is None or len(loop.operands) != 1:
    return None
  in_caller = {i.name: i for i in caller}
  start = _integer(_element(in_caller, loop.operands[0], index))
  in_body = {i.name: i for i in body}
  step = _step(in_body, _element(in_body, root(body).name if body else '', index), index)
  if start is None or step is None or step == 0:
    return None
  span = {'LT': bound - start, 'LE': bound + 1 - start,
          'GT': start - bound, 'GE': start + 1 - bound}.get(direction)
  if span is None or (step > 0) != (direction in ('LT', 'LE')):
    return None
  return max(0, -(-span // abs(step)))


def _through(instructions: dict, name: str) -> Instruction | None:
  """The instruction `name` is, looking through copies and bitcasts."""
  ins = instructions.get(name)
  while ins is not None and ins.opcode in _PASS_THROUGH and ins.operands:
    ins = instructions.get(ins.operands[0])
  return ins


def _state_index(ins: Instruction | None) -> int | None:
  """k where `ins` is element k of the loop's state (its parameter)."""
  if ins is None or ins.opcode != 'get-tuple-element':
    return None
  return ins.tuple_index


def _integer(ins: Instruction | None) -> int | None:
  """The value of an integer scalar constant."""
  if ins is None or ins.opcode != 'constant' or not isinstance(ins.shape, Leaf):
    return None
  try:
    return int(ins.args.strip())
  except ValueError:
    return None


def _element(instructions: dict, name: str, index: int) -> Instruction | None:
  """Element `index` of the tuple `name` builds."""
  built = _through(instructions, name)
  if built is None or built.opcode != 'tuple' or index >= len(built.operands):
    return None
  return _through(instructions, built.operands[index])


def _step(body: dict, update: Instruction | None, index: int) -> int | None:
  """The constant the body adds to state element `index` (negative where it
  subtracts), or None where the update is not such a step."""
  if update is None or update.opcode not in ('add', 'subtract') or len(update.operands) != 2:
    return None
  a, b = (_through(body, name) for name in update.operands)
  if _state_index(a) == index and (k := _integer(b)) is not None:
    return k if update.opcode == 'add' else -k
  if update.opcode == 'add' and _state_index(b) == index and (k := _integer(a)) is not None:
    return k
  return None


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


# A lowered program's matmuls: StableHLO's ops (a compiled one's are
# ``Instruction.is_matmul``). The pattern starts with its literal, which
# `re` finds fast; the word boundary before it is checked on each hit (a \b
# in front would make `re` try every position).
_LOWERED_MATMUL = re.compile(r'stablehlo\.(dot_general|dot|convolution)\b')
_WORD_CHAR = re.compile(r'\w')


def count_matmuls_lowered(stablehlo_text: str) -> int:
  """Matmuls (dots and convolutions) in a lowered program's StableHLO text."""
  return sum(1 for m in _LOWERED_MATMUL.finditer(stablehlo_text)
             if not (m.start() and _WORD_CHAR.match(stablehlo_text, m.start() - 1)))
