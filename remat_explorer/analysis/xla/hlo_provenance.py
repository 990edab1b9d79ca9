"""Where a buffer of the compiled program comes from, as the program itself
records it.

JAX lowers every equation with its name stack (``op_name``) and the Python
stack that bound it. XLA keeps both through its passes: the name stack as
each instruction's ``op_name``, the Python stack as a ``stack_frame_id``
into a table of frames the module carries (``stack_frame_index`` of the
``HloModuleProto``; older XLA wrote ``source_file``/``source_line`` on the
instruction instead). Parameters carry the name JAX gave the argument
(``op_name="leaves[4]"``).

* ``read_stack_index``: that table, from the module's proto (read once with
  the rest of the program, ``reader.read_compiled``).
* ``ModuleProvenance.computing_instruction``: the instruction that computed the value a
  buffer holds. A buffer is often defined by bookkeeping: a ``while`` (a
  value a loop stacks is written into its state by a
  ``dynamic-update-slice`` in the body), a fusion (whose metadata is its
  root's), a bitcast or copy. This looks through them to the operation
  that computed the value, whose stack is the user's code that asked for
  it.
"""

from __future__ import annotations

import functools
import re
from remat_explorer.analysis.xla import protowire as wire, xla_protos as pb
from remat_explorer.analysis.xla.hlo import HloModule, Instruction, root

Frame = tuple[str, int, str]
"""(file, line, function), as JAX's tracebacks record them."""

_STACK_FRAME_ID = re.compile(r'\bstack_frame_id=(\d+)')


class StackIndex:
  """The Python stacks of a module's instructions, by ``stack_frame_id``."""

  def __init__(self, files, functions, locations, frames):
    self._files, self._functions = files, functions
    self._locations = locations  # (file id, function id, line), 1-based ids
    self._frames = frames  # (location id, parent frame id or 0)
    self.frames = functools.lru_cache(maxsize=None)(self._stack)

  def _stack(self, frame_id: int) -> tuple[Frame, ...]:
    """The stack of `frame_id`, outermost first; () for 0 or an unknown id."""
    stack: list[Frame] = []
    seen = set()
    while 0 < frame_id <= len(self._frames) and frame_id not in seen:
      seen.add(frame_id)
      location, parent = self._frames[frame_id - 1]
      if 0 < location <= len(self._locations):
        file, function, line = self._locations[location - 1]
        stack.append((_entry(self._files, file), line, _entry(self._functions, function)))
      frame_id = parent
    return tuple(reversed(stack))


def _entry(names: list[str], number: int) -> str:
  return names[number - 1] if 0 < number <= len(names) else ''


def read_stack_index(module_proto: bytes) -> StackIndex | None:
  """The ``StackFrameIndexProto`` of an ``HloModuleProto``; None where the
  module has none."""
  data = module_proto
  spans = [v for _, v in wire.fields(data, wire.whole(data), (pb.HloModule.STACK_FRAME_INDEX,))]
  if not spans:
    return None
  f, loc, fr = pb.StackFrameIndex, pb.FileLocation, pb.StackFrame
  index = wire.message(data, spans[0], (f.FILE_NAMES, f.FUNCTION_NAMES, f.FILE_LOCATIONS,
                                        f.STACK_FRAMES))
  strings = lambda number: [data[s:e].decode('utf-8', 'replace')
                            for s, e in index.get(number, [])]
  locations = []
  for span in index.get(f.FILE_LOCATIONS, []):
    location = wire.message(data, span, (loc.FILE_NAME_ID, loc.FUNCTION_NAME_ID, loc.LINE))
    locations.append((wire.scalar(location, loc.FILE_NAME_ID),
                      wire.scalar(location, loc.FUNCTION_NAME_ID),
                      wire.scalar(location, loc.LINE)))
  frames = []
  for span in index.get(f.STACK_FRAMES, []):
    frame = wire.message(data, span, (fr.FILE_LOCATION_ID, fr.PARENT_FRAME_ID))
    frames.append((wire.scalar(frame, fr.FILE_LOCATION_ID), wire.scalar(frame, fr.PARENT_FRAME_ID)))
  return StackIndex(strings(f.FILE_NAMES), strings(f.FUNCTION_NAMES), locations, frames)


def stack_of(instruction: Instruction, index: StackIndex | None) -> tuple[Frame, ...]:
  """The Python stack JAX recorded for `instruction`, outermost first."""
  if index is not None and (m := _STACK_FRAME_ID.search(instruction.attrs)):
    return index.frames(int(m.group(1)))
  if instruction.source:  # older XLA: the innermost frame only
    file, _, line = instruction.source.rpartition(':')
    return ((file, int(line), ''),)
  return ()


# Instructions that pass a value on unchanged (or only retyped).
_MOVES = frozenset({'bitcast', 'copy', 'reduce-precision', 'reshape', 'convert',
                    'copy-start', 'copy-done', 'opt-barrier', 'domain'})


class ModuleProvenance:
  """A module's instructions, looked up by name, with their stacks."""

  def __init__(self, module: HloModule, stacks: StackIndex | None = None):
    self.module, self.stacks = module, stacks
    self._by_name: dict[str, dict[str, Instruction]] = {}
    self._callers: dict[str, tuple[str, Instruction]] | None = None
    self._bodies: set | None = None

  def instruction(self, comp: str, name: str) -> Instruction | None:
    if comp not in self._by_name:
      self._by_name[comp] = {x.name: x for x in self.module.computations.get(comp, [])}
    return self._by_name[comp].get(name)

  def stack(self, instruction: Instruction) -> tuple[Frame, ...]:
    return stack_of(instruction, self.stacks)

  def computing_instruction(self, instruction: str, shape_index: tuple[int, ...] = (),
                            computation: str | None = None) -> Instruction | None:
    """The instruction that computed the value of leaf `shape_index` of
    `instruction` (in `computation`, the entry by default), looking through
    loops, fusions and moves; None where `instruction` is not found."""
    where = (computation or self.module.entry, instruction, tuple(shape_index))
    found = None
    for _ in range(256):  # a bound keeps a malformed module finite
      comp, name, index = where
      ins = self.instruction(comp, name)
      if ins is None:
        return found
      found = ins
      step = self._step_back(comp, ins, index)
      if step is None:
        return ins
      where = step
    return found

  def _step_back(self, comp, ins, index):
    """Where the value of leaf `index` of `ins` comes from, one step back,
    or None where `ins` computes it."""
    code, computations = ins.opcode, self.module.computations
    if code == 'get-tuple-element':
      carried = self._carry_made_by_last_step(comp, ins)
      if carried is not None:
        return comp, carried, index
      return comp, ins.operands[0], (ins.tuple_index, *index)
    if code == 'tuple' and index:
      return comp, ins.operands[index[0]], index[1:]
    if code in _MOVES and ins.operands:
      return comp, ins.operands[0], index
    if code == 'dynamic-update-slice':  # the update is what the buffer gains
      return comp, ins.operands[1], index
    if code == 'while':
      body = ins.attr('body') or ''
      last = root(computations.get(body, []))
      if last is None:
        return None
      if last.opcode == 'tuple' and index:
        inner = last.operands[index[0]]
        if self._is_state(body, inner):
          return None  # state the body passes on: the loop's own
        return body, inner, index[1:]
      return body, last.name, index
    if code == 'fusion':
      fused = ins.attr('calls') or ''
      last = root(computations.get(fused, []))
      return None if last is None else (fused, last.name, index)
    if code == 'parameter' and comp != self.module.entry:
      return self._fusion_operand(comp, ins, index)
    return None

  def _carry_made_by_last_step(self, body, element) -> str | None:
    """A loop body's state element as an iteration receives it was made by
    the iteration before: what the body returns as that element (None
    where `element` is not the body's state, or the body passes it on)."""
    if self._bodies is None:
      self._bodies = {x.attr('body') for xs in self.module.computations.values()
                      for x in xs if x.opcode == 'while'}
    state = self.instruction(body, element.operands[0])
    if body not in self._bodies or state is None or state.opcode != 'parameter':
      return None
    last = root(self.module.computations.get(body, []))
    if last is None or last.opcode != 'tuple' or element.tuple_index >= len(last.operands):
      return None
    returned = last.operands[element.tuple_index]
    return None if self._is_state(body, returned) else returned

  def _fusion_operand(self, fused, parameter, index):
    """A fused computation's parameter is an operand of the fusion calling it."""
    if self._callers is None:
      self._callers = {}
      for comp, instructions in self.module.computations.items():
        for x in instructions:
          if x.opcode == 'fusion' and (called := x.attr('calls')):
            self._callers.setdefault(called, (comp, x))
    caller = self._callers.get(fused)
    if caller is None:
      return None
    comp, fusion = caller
    number = int(parameter.args)
    return None if number >= len(fusion.operands) else (comp, fusion.operands[number], index)

  def _is_state(self, body, name) -> bool:
    """Whether `name` in a loop body is (a view of) the body's parameter."""
    ins = self.instruction(body, name)
    while ins is not None and ins.opcode in _MOVES | {'get-tuple-element'}:
      ins = self.instruction(body, ins.operands[0])
    return ins is not None and ins.opcode == 'parameter'
