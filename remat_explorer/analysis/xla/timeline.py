"""Memory along a compiled program's schedule, with the residuals marked.

Two curves over the entry computation's schedule (``compiled.as_text()``
lists it in run order):

* ``placed_bytes``: on TPUs and GPUs, XLA's own heap simulation along the
  schedule (``heap_trace.py``), whose peak is XLA's reported peak; on the
  CPU, what XLA's buffer assignment (``buffers.py``) occupies at each step: every parameter and output allocation, and for
  each temporary allocation the top (offset + size) of the highest buffer
  live there (one run by the step, for the buffers of a loop body or other
  called computation). Its peak is XLA's own allocation, ``argument +
  output + temp - alias`` bytes of ``memory_analysis()``; the gap below it
  at other steps is what the placement leaves unused there.
* ``live_bytes``: the bytes of the buffers live at each step, from the
  liveness model of ``liveness.py`` (kept consistent with XLA's placement).
  Its peak is the largest set of buffers live at once, never above the
  placed peak (fragmentation makes up the difference). On TPUs and GPUs
  each entry buffer XLA's heap simulation traces is live at the steps the
  simulation holds it, and only the temporaries XLA placed in an output's
  allocation are held in its storage before it is written: the two
  curves meet wherever the model of a loop body's temporaries does not
  enter.

``peak_bytes`` is the placed peak where XLA's buffer assignment is known
(the live peak otherwise, e.g. for HLO text alone), and ``peak_step`` the
busiest step at that height, or within 0.1% of it.

Residuals: JAX's name stack reaches HLO as ``metadata={op_name=...}``; under
``jax.jit(jax.grad(f))`` forward ops read ``jit(f)/jvp()/...`` and backward
ops ``jit(f)/transpose(jvp())/...``. A residual is a buffer that a forward
instruction defines (not a parameter) and a backward one reads; state that a
forward ``while`` writes counts as its own. Not seen: values XLA's CSE merged
into their recomputation (which keeps the backward name), or moved by copies
without metadata. Non-device memory (``S(n)``, n > 0: host offload) is listed
but not counted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from remat_explorer.engine import in_backward_pass
from remat_explorer.analysis.xla.buffers import BufferAssignment
from remat_explorer.analysis.xla.heap_trace import HeapTrace
from remat_explorer.analysis.xla.hlo import HloModule, pass_of
from remat_explorer.analysis.xla.hlo_provenance import ModuleProvenance, StackIndex
from remat_explorer.analysis.xla.reader import CompiledProgram
from remat_explorer.analysis.xla.liveness import (LiveBuffer, live_bytes, live_ranges,
                                              peak_temporaries)
from remat_explorer.analysis.split.report import plain_data


@dataclasses.dataclass(frozen=True)
class Buffer:
  """One buffer, live from step ``start`` to step ``end`` inclusive."""
  name: str
  """The defining instruction, with ``{i}`` for a tuple leaf; ``/temps``:
  the peak of the temporaries of what one step runs (a loop body);
  ``/reserved``: output storage not yet written."""
  bytes: int
  start: int
  end: int
  op_name: str
  is_residual: bool
  is_parameter: bool
  is_output: bool
  memory_space: int = 0
  """0 is device memory, the only one counted."""
  source: str = ''
  """``file:line`` of the JAX call that defined it, from HLO metadata."""
  frames: tuple = ()
  """The Python stack, outermost first, that JAX recorded for the
  instruction that computed the value it holds (looking through the loop
  that stacks it, fusions and copies: ``hlo_provenance``)."""
  computed_by: str = ''
  """That instruction's ``op_name`` (JAX's name stack and primitive)."""
  parts: tuple = ()
  """For ``/temps``: the buffers the computation it runs holds at its
  peak (a loop body's per-iteration scratch, nested loops' ``/temps``)."""
  opcode: str = ''
  """The defining instruction's opcode (``while`` for a loop's state)."""
  output_index: int | None = None
  """For an output, its position among the program's output leaves."""


@dataclasses.dataclass(frozen=True)
class MemoryTimeline:
  """Device bytes at each step of a program's schedule.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> timeline = rx.compile_costs(f, w, x).timeline
    >>> len(timeline.live_bytes) == len(timeline.steps), max(timeline.live_bytes) <= timeline.peak_bytes
    (True, True)
  """
  steps: tuple[str, ...]
  live_bytes: tuple[int, ...]
  buffers: tuple[Buffer, ...]
  peak_bytes: int
  peak_step: int
  placed_bytes: tuple[int, ...] | None = None
  """Bytes XLA's placement occupies at each step (see the module); None
  where the buffer assignment is not known."""
  step_passes: tuple[str, ...] = ()
  """The pass of each step's instruction (see ``passes``)."""
  peak_memory: str = 'device'
  """The memory whose heap the placed curve follows: 'device', or
  'on-chip' where a TPU's on-chip memory (VMEM) holds the higher heap and
  XLA's peak is that heap's (a program small enough to live on chip)."""

  def live_at(self, step: int | str) -> list[Buffer]:
    """Buffers live at `step`, an index or an instruction name."""
    i = self.steps.index(step) if isinstance(step, str) else step
    return [b for b in self.buffers if b.start <= i <= b.end]

  def residuals_at(self, step: int | str) -> list[Buffer]:
    """The residual buffers live at `step` in device memory: the one
    definition of "residuals at a point of the schedule" that the charts,
    the peak table and ``residuals_at_peak`` use."""
    return [b for b in self.live_at(step)
            if b.is_residual and b.memory_space == 0]

  def residual_bytes_at(self, step: int | str) -> int:
    return sum(b.bytes for b in self.residuals_at(step))

  def residual_bytes_by_step(self) -> list[int]:
    """``residual_bytes_at`` of every step, in one pass."""
    return live_bytes(len(self.steps), [(b.start, b.end, b.bytes) for b in self.buffers
                                        if b.is_residual and b.memory_space == 0])

  def passes(self) -> list[tuple[int, int, str]]:
    """The schedule in runs of one pass, ``(first step, last step, pass)``,
    the pass read from each instruction's JAX name stack: 'forward',
    'backward', 'recompute' (remat's, inside the backward pass), or ''
    (no metadata: parameters, copies XLA added)."""
    runs: list[list] = []
    for step, name in enumerate(self.step_passes):
      if runs and (runs[-1][2] == name or not name):
        runs[-1][1] = step
      else:
        runs.append([step, step, name])
    return [tuple(r) for r in runs]

  @property
  def height(self) -> tuple[int, ...]:
    """The curve whose peak is ``peak_bytes``: ``placed_bytes`` where
    known, else ``live_bytes``."""
    return self.live_bytes if self.placed_bytes is None else self.placed_bytes

  def to_dict(self) -> dict[str, Any]:
    """The timeline as plain, JSON-serializable data."""
    return {'steps': list(self.steps), 'live_bytes': list(self.live_bytes),
            'step_passes': list(self.step_passes),
            'placed_bytes': None if self.placed_bytes is None else list(self.placed_bytes),
            'buffers': plain_data(self.buffers),
            'peak_bytes': self.peak_bytes, 'peak_step': self.peak_step,
            'peak_memory': self.peak_memory}


PEAK_TOLERANCE = 1e-3
"""How far below the placed peak a step may be and still be the peak's step:
where it holds more than the steps at the very top."""


def memory_timeline(program: CompiledProgram) -> MemoryTimeline:
  """The timeline of a compiled program (``reader.read_compiled``)."""
  return timeline_of(program.module, program.buffers, program.stacks, program.heap)


def timeline_of(module: HloModule, placement: BufferAssignment | None = None,
                stacks: StackIndex | None = None,
                heap: HeapTrace | None = None) -> MemoryTimeline:
  """The timeline of a parsed HLO module, placed as `placement` says;
  `stacks`: the module's stack frames, where known; `heap`: XLA's heap
  simulation, where read (TPUs, GPUs): the placed curve is then XLA's heap
  along the schedule, whose peak is XLA's reported peak."""
  placed_at = _placed_temp_buffers(placement)
  instrs, found = live_ranges(module, placed_at, _in_output_storage(module, placement, heap))
  if heap is not None:
    placed = list(heap.step_bytes)
    _live_as_the_heap_holds(found, module, placement, heap)
  else:
    placed = None if placement is None else _placed_bytes(module, placement, found)
  origins = _Origins(ModuleProvenance(module, stacks), placed_at)
  buffers = [origins.described(_buffer(b, instrs), b) for b in found]
  live = _live(len(instrs), buffers)
  if placed is not None:
    buffers = _bound_loop_temporaries(buffers, live, placed)
    live = _live(len(instrs), buffers)
  buffers = tuple(buffers)
  height = placed if placed is not None else live
  top = max(height, default=0)
  # The busiest step at the peak's height: where the most is in use. A
  # placement reaches its top again wherever a buffer placed high is live,
  # though the heap below it may be nearly empty by then (a backward loop's
  # scratch placed where forward buffers were), so every step within
  # PEAK_TOLERANCE of the top is a candidate.
  peak_step = max((i for i, h in enumerate(height) if h >= (1 - PEAK_TOLERANCE) * top),
                  key=lambda i: (live[i], height[i]), default=0)
  return MemoryTimeline(tuple(i.name for i in instrs), tuple(live), buffers,
                        top, peak_step, None if placed is None else tuple(placed),
                        tuple(pass_of(i.op_name) for i in instrs),
                        'on-chip' if heap is not None and heap.color else 'device')


def _in_output_storage(module: HloModule, placement: BufferAssignment | None,
                       heap: HeapTrace | None) -> set | None:
  """Where XLA's heap simulation holds the temporaries (TPUs, GPUs): the
  entry buffers XLA placed in an output's allocation, the only ones held
  in output storage not yet written; None elsewhere."""
  if heap is None or placement is None:
    return None
  return {(p.instruction, p.shape_index) for p in _entry_buffers(module, placement)
          if placement.allocations[p.allocation].kind == 'output'}


def _live_as_the_heap_holds(found: list[LiveBuffer], module: HloModule,
                            placement: BufferAssignment | None, heap: HeapTrace) -> None:
  """Give each buffer of the entry computation that XLA's heap simulation
  traces the steps the simulation holds it, in place of the liveness
  model's: the buffers live at a step then add up to XLA's heap there
  (a loop's temporaries, parameters and outputs, which the trace leaves
  out, keep the model's)."""
  if placement is None or not heap.lifetimes:
    return
  held = {(p.instruction, p.shape_index): heap.lifetimes[p.logical_buffer]
          for p in _entry_buffers(module, placement) if p.logical_buffer in heap.lifetimes}
  for b in found:
    steps = held.get((b.instruction, b.shape_index))
    if steps is not None and b.kind == 'value' and not b.is_parameter:
      b.start, b.end = steps


def _entry_buffers(module: HloModule, placement: BufferAssignment):
  """The buffers XLA placed for the entry computation's values."""
  return (p for p in placement.buffers if p.computation == module.entry)


def _live(steps: int, buffers) -> list[int]:
  return live_bytes(steps, [(b.start, b.end, b.bytes) for b in buffers
                            if not b.memory_space])


def _bound_loop_temporaries(buffers: list[Buffer], live, placed) -> list[Buffer]:
  """A loop body's temporaries are one modelled number (``/temps``), the
  weakest part of the liveness model; where it makes a step hold more than
  XLA placed there, which cannot be, it is lowered to fit."""
  out = []
  for b in buffers:
    excess = live[b.start] - placed[b.start]
    if b.name.endswith('/temps') and excess > 0:
      b = dataclasses.replace(b, bytes=max(b.bytes - excess, 0))
    out.append(b)
  return out


def _buffer(b: LiveBuffer, instrs) -> Buffer:
  if b.kind != 'value' or not instrs:
    return Buffer(b.name, b.leaf.bytes, b.start, b.end, b.op_name, False, False,
                  False, b.leaf.memory_space, b.source)
  forward = b.op_name and not in_backward_pass(b.op_name)
  read_back = any(in_backward_pass(instrs[u].op_name) for u in b.uses)
  return Buffer(b.name, b.leaf.bytes, b.start, b.end, b.op_name,
                bool(forward and read_back and not b.is_parameter),
                b.is_parameter, b.is_output, b.leaf.memory_space, b.source)


class _Origins:
  """Each buffer's provenance: the stack and name of the instruction that
  computed its value, and what a ``/temps`` buffer holds."""

  def __init__(self, provenance: ModuleProvenance, placed_at):
    self.provenance, self.placed_at = provenance, placed_at

  def described(self, buffer: Buffer, live: LiveBuffer, computation=None) -> Buffer:
    if live.kind == 'reserved':  # the storage an asynchronous op will write
      defining = self.provenance.instruction(computation or self.provenance.module.entry,
                                             live.instruction)
      return buffer if defining is None else dataclasses.replace(buffer, opcode=defining.opcode)
    source = self.provenance.computing_instruction(live.instruction, live.shape_index,
                                                   computation)
    defining = self.provenance.instruction(computation or self.provenance.module.entry,
                                           live.instruction)
    found = dict(opcode='' if defining is None else defining.opcode,
                 output_index=live.output_index)
    if source is not None:
      found.update(frames=self.provenance.stack(source), computed_by=source.op_name)
    if live.kind == 'temps':
      found['parts'] = self._parts(live, computation)
    return dataclasses.replace(buffer, **found)

  def _parts(self, live: LiveBuffer, computation) -> tuple[Buffer, ...]:
    ins = self.provenance.instruction(computation or self.provenance.module.entry,
                                      live.instruction)
    held = None if ins is None else peak_temporaries(self.provenance.module, ins,
                                                     self.placed_at)
    if not held:
      return ()
    comp, buffers = held
    parts = [self.described(_buffer(b, []), b, comp) for b in buffers]
    return tuple(sorted(parts, key=lambda b: -b.bytes))


# -- XLA's placement along the schedule ------------------------------------------------

def _placed_temp_buffers(placement) -> dict[str, dict]:
  """Per computation, (instruction, shape index) -> (allocation, offset,
  bytes) of its buffers in temporary allocations."""
  placed: dict[str, dict] = {}
  for p in placement.buffers if placement is not None else ():
    if _device_temporary(placement, p):
      placed.setdefault(p.computation, {})[(p.instruction, p.shape_index)] = (
          p.allocation, p.offset, p.bytes)
  return placed


def _device_temporary(placement: BufferAssignment, buffer) -> bool:
  """Whether `buffer` is a temporary in the device's main memory (a TPU's
  on-chip memory is not what a program's peak is measured in)."""
  allocation = placement.allocations[buffer.allocation]
  return allocation.kind == 'temp' and allocation.color == 0


def _placed_bytes(module: HloModule, placement: BufferAssignment,
                  found: list[LiveBuffer]) -> list[int]:
  steps = len(module.entry_instructions)
  ranges = {(b.instruction, b.shape_index): (b.start, b.end)
            for b in found if b.kind == 'value'}
  running = module.steps_running()
  defining_step = _defining_steps(module)
  tops: dict[int, np.ndarray] = {}
  for p in placement.buffers:
    if not _device_temporary(placement, p):
      continue
    top = tops.setdefault(p.allocation, np.zeros(steps, dtype=np.int64))
    if p.computation == module.entry:
      start, end = (ranges.get((p.instruction, p.shape_index))
                    or defining_step(p.instruction))
      spans = [(start, end)]
    else:  # a loop body's (or other called computation's) buffer
      spans = [(i, i) for i in running.get(p.computation, ())]
    for start, end in spans:
      np.maximum(top[start:end + 1], p.offset + p.bytes, out=top[start:end + 1])
  held = (placement.bytes_of('parameter') + placement.bytes_of('output'))
  total = np.full(steps, held, dtype=np.int64)
  for top in tops.values():
    total += top
  return [int(x) for x in total]


def _defining_steps(module: HloModule):
  """A function giving the (step, last step reading it) of an entry
  instruction whose buffer the liveness model has no leaf for (a tuple's
  index table), from one pass over the schedule."""
  first: dict[str, int] = {}
  last_read: dict[str, int] = {}
  for i, x in enumerate(module.entry_instructions):
    first.setdefault(x.name, i)
    for operand in x.operands:
      last_read[operand] = i

  def defining_step(name: str) -> tuple[int, int]:
    step = first.get(name, 0)
    return step, last_read.get(name, step)
  return defining_step
