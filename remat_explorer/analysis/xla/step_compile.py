"""One step's compile, started by ``compiled.start_step_compile``, and its
reading: once XLA is done, the executable is read into a ``CompiledCosts``
(XLA's memory and cost analyses, the module's text and buffer assignment,
the memory timeline, the FLOPs executed, the collectives), once for every
step that lowered to the same program, and then dropped."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import numbers as numbers_module
import threading
from dataclasses import dataclass

import jax

from remat_explorer import engine
from remat_explorer.analysis.program.devices import compiled_placement
from remat_explorer.analysis.xla.collectives import Collective, collectives_in
from remat_explorer.analysis.xla.costs import CompiledCosts
from remat_explorer.analysis.xla.executed_flops import executed_flops
from remat_explorer.analysis.xla.reader import read_compiled
from remat_explorer.analysis.xla.run_times import Runnable
from remat_explorer.analysis.xla.timeline import memory_timeline
from remat_explorer.analysis.xla.xla_dump import XlaDump


def done_with(fn) -> concurrent.futures.Future:
  """A future holding what `fn()` returned or raised."""
  future = concurrent.futures.Future()
  try:
    future.set_result(fn())
  except Exception as e:
    future.set_exception(e)
  return future


@dataclass
class StepCompile:
  """One step lowered, its compile under way (``compiled``: a future of the
  executable and the seconds XLA took)."""
  lowered: object
  compiled: concurrent.futures.Future
  analysis: bool
  dump: XlaDump | None
  lower_seconds: float
  placement: object
  device: object
  """The device compiled for (a target's compile-only one, say)."""
  notes: tuple[str, ...]
  common: dict
  lowered_matmuls: int
  _finished: tuple | None = None
  _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

  def finish(self):
    """(CompiledCosts, `runnable`), read from the compiled program once XLA
    is done: `runnable` (a ``Runnable``) gives an executable to run, or None
    (an analysis compile, or XLA refused the program, whose
    ``CompiledCosts`` is then a failed one). Read once, for every step of
    this program (``SameProgram``); the lowered program is then dropped,
    and the executable too but for what `runnable` holds until timed."""
    with self._lock:
      if self._finished is None:
        self._finished = self._read()
        self.lowered, self.compiled = None, done_with(lambda: None)
      return self._finished

  def _read(self):
    notes, common = list(self.notes), self.common
    analysis, lower_seconds = self.analysis, self.lower_seconds
    try:
      compiled, compile_seconds = self.compiled.result()
    except Exception as e:  # XLA's errors (out of memory, bad options, ...)
      if self.dump is not None:
        self.dump.remove()
      if not _is_xla_error(e):
        raise
      return CompiledCosts(**common, failed=True, error=f'{type(e).__name__}: {e}',
                           lower_seconds=lower_seconds,
                           notes=tuple(notes)), Runnable()
    memory = compiled.memory_analysis()
    memory_numbers, buffer_assignment = _memory_analysis_fields(memory)
    cost = _cost_analysis(compiled)
    devices = compiled_placement(compiled, self.placement)
    dumped = None if self.dump is None else self.dump.read()
    try:  # every reading below is of this one object
      program = read_compiled(compiled, memory, dumped)
    except Exception as e:  # a text or proto this reader does not know
      program = None
      notes.append(f'compiled program unreadable: {type(e).__name__}: {e}')
    module = None if program is None else program.module
    timeline = executed = None
    if program is not None:
      if program.buffers is None and common['platform'] != 'cpu':
        notes.append('XLA wrote no buffer assignment (an executable loaded from '
                     "JAX's compilation cache is not compiled): the timeline is "
                     'the liveness model alone')
      try:
        timeline = memory_timeline(program)
      except Exception as e:
        notes.append(f'memory timeline unavailable: {type(e).__name__}: {e}')
      try:
        # XLA:GPU's own cost_analysis() leaves out the matmuls of its GEMM
        # fusions and its cuBLAS and cuDNN calls: a GPU's count is made from
        # the text.
        executed = executed_flops(module, self.device,
                                  None if common['platform'] == 'gpu' else cost.get('flops'))
      except Exception as e:  # a text XLA's parser refuses: say so, keep the rest
        notes.append(f'executed FLOPs unavailable: {type(e).__name__}: {e}')
    xla_peak = getattr(memory, 'peak_memory_in_bytes', None)
    if timeline is not None and common['platform'] != 'cpu' and xla_peak:
      gap = timeline.peak_bytes / xla_peak - 1
      if abs(gap) > 0.01:
        notes.append(f"the memory timeline peaks at {timeline.peak_bytes:,} B, {gap:+.1%} "
                     f"from XLA's peak of {xla_peak:,} B, the figure reported")
    if executed is not None and executed.unknown_trip_counts:
      notes.append(f'{executed.unknown_trip_counts} loop(s) of unknown trip count '
                   'are counted once in the executed FLOPs')
    # A program on one device communicates with no other.
    collectives = _collectives(module, notes) if devices.num_devices > 1 else ()
    costs = CompiledCosts(
        **common,
        argument_bytes=memory.argument_size_in_bytes,
        output_bytes=memory.output_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes,
        temp_bytes=memory.temp_size_in_bytes,
        generated_code_bytes=memory.generated_code_size_in_bytes,
        peak_memory_bytes=getattr(memory, 'peak_memory_in_bytes', None),
        host_argument_bytes=memory.host_argument_size_in_bytes,
        host_output_bytes=memory.host_output_size_in_bytes,
        host_alias_bytes=memory.host_alias_size_in_bytes,
        host_temp_bytes=memory.host_temp_size_in_bytes,
        host_generated_code_bytes=getattr(
            memory, 'host_generated_code_size_in_bytes', None),
        memory_analysis=memory_numbers, buffer_assignment_proto=buffer_assignment,
        xla_flops=cost.get('flops'),
        executed_flops=executed.flops if executed else None,
        executed_flops_low=executed.low if executed else None,
        loops_of_unknown_trip_count=executed.unknown_trip_counts if executed else 0,
        bytes_accessed=cost.get('bytes accessed'),
        transcendentals=cost.get('transcendentals'), cost_analysis=cost,
        analysis_compile=analysis,
        lower_seconds=lower_seconds, compile_seconds=compile_seconds,
        lowered_matmuls=self.lowered_matmuls,
        compiled_matmuls=module.matmul_count() if module else None,
        timeline=timeline, notes=tuple(notes), num_devices=devices.num_devices,
        mesh_shape=devices.mesh_shape, collectives=collectives)
    # An analysis compile (figures only: ``compile_costs`` without runs,
    # ``compare``, the search) keeps nothing to run: a step compiled to run
    # is compiled for running, under a key of its own. Keeping its lowered
    # program to compile later held 1.3 GiB per policy of recurrentgemma's
    # Griffin, in the caches, for nothing.
    if engine.is_compile_only(self.device) or analysis:
      return costs, Runnable()
    return costs, Runnable(compiled)


class SameProgram:
  """A step that lowered to the program of an earlier step (`first`):
  XLA's figures are that compile's, under this step's own labels, with a
  note naming the policy it shares the program with."""

  def __init__(self, first: StepCompile, common: dict, notes: tuple[str, ...],
               lower_seconds: float):
    self.first, self.common, self.notes = first, common, notes
    self.lower_seconds = lower_seconds
    # A future of its own, done when the first's is: callers tell their
    # compiles apart by their futures.
    self.compiled = concurrent.futures.Future()
    first.compiled.add_done_callback(self._first_done)

  def _first_done(self, _) -> None:
    if self.compiled.set_running_or_notify_cancel():  # not cancelled meanwhile
      self.compiled.set_result(None)

  def finish(self):
    costs, runnable = self.first.finish()
    own_notes = costs.notes[len(self.first.notes):]
    same_step = (costs.policy, costs.lowering) == (self.common['policy'],
                                                   self.common['lowering'])
    shared = () if same_step else (
        f'compiles to the same program as {costs.policy} (lowering '
        f'{costs.lowering}): XLA compiled it once, for both',)
    return dataclasses.replace(
        costs, **self.common, lower_seconds=self.lower_seconds,
        notes=(*self.notes, *shared, *own_notes)), runnable


def _memory_analysis_fields(memory) -> tuple[dict[str, int], bytes | None]:
  """Every number of XLA's ``CompiledMemoryStats`` by name, read from the
  object itself so that fields a later XLA adds are kept too; and the
  serialized buffer assignment."""
  numbers, proto = {}, None
  for name in dir(memory):
    if name.startswith('_'):
      continue
    value = getattr(memory, name)
    if isinstance(value, bytes):
      proto = value if name == 'serialized_buffer_assignment_proto' else proto
    elif isinstance(value, numbers_module.Number) and not isinstance(value, bool):
      numbers[name] = int(value)
  return numbers, proto


def _cost_analysis(compiled) -> dict[str, float]:
  """``cost_analysis()`` as a plain dict (one per program in older JAX
  versions, whose first is this one), values as Python floats."""
  cost = compiled.cost_analysis() or {}
  cost = (cost[0] if cost else {}) if isinstance(cost, list) else cost
  return {str(k): float(v) for k, v in cost.items()}


def _collectives(module, notes: list[str]) -> tuple[Collective, ...]:
  if module is None:
    return ()
  try:
    summary = collectives_in(module)
  except Exception as e:  # a reading of XLA's text format, like the timeline
    notes.append(f'collectives unavailable: {type(e).__name__}: {e}')
    return ()
  if summary.unknown_trip_count:
    notes.append('some collectives sit in a loop of unknown trip count and '
                 'are counted once per loop')
  return summary.collectives


def _is_xla_error(e: Exception) -> bool:
  return (isinstance(e, getattr(jax.errors, 'JaxRuntimeError', ()))
          or type(e).__name__ in ('XlaRuntimeError', 'JaxRuntimeError'))
