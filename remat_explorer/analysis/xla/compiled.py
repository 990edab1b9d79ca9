"""``compile_costs``: what XLA makes of a gradient under a policy, measured.

The training step (``value_and_grad`` for a scalar output, a VJP with a
ones cotangent otherwise, returning the outputs too) is lowered and
compiled with JAX's AOT API on the default device,
or, for a sharded program, on the devices its arguments and shardings name;
every number here comes from the compiled executable (``memory_analysis``,
``cost_analysis``, its HLO text) or from running it. Nothing is estimated.

A sharded program is compiled as the SPMD partitioner splits it: the
executable is the program one device runs, so its memory and FLOP figures
are per device, and its HLO holds the collectives (``collectives.py``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import numbers as numbers_module
import threading
import time
from dataclasses import dataclass

import jax

from remat_explorer import engine
from remat_explorer.analysis.xla.collectives import Collective, collectives_in
from remat_explorer.analysis.xla.costs import CompiledCosts
from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.freed_memory import give_back_freed_memory
from remat_explorer.analysis.context import note_compile
from remat_explorer.analysis.program.keywords import check_keywords, entry_point
from remat_explorer.analysis.program.step import StepRequest, trace_step
from remat_explorer.analysis.program.blocks import PolicyChoice
from remat_explorer.analysis.program.devices import (compiled_placement, find_placement,
                                                     target_device)
from remat_explorer.analysis.targets.device_memory import device_memory_bytes
from remat_explorer.analysis.xla.xla_dump import XlaDump
from remat_explorer.analysis.xla.executed_flops import executed_flops
from remat_explorer.analysis.xla.hlo import count_matmuls_lowered
from remat_explorer.analysis.xla.run_times import Runnable, timed_costs
from remat_explorer.analysis.xla.reader import read_compiled
from remat_explorer.analysis.xla.timeline import memory_timeline


_cache = ResultCache(max_entries=32)
"""(costs, runnable) by problem and setting: a step compiled to run keeps its
executable until its runs are timed, so that it is not compiled again."""


# What an analysis compile changes, by platform. On the CPU, the backend's
# optimization level only affects the machine code LLVM makes from the
# optimized HLO: the HLO, its schedule, the buffer assignment and so every
# figure read here are those of a full compile (checked field by field in
# tests/test_analysis_compile.py), in about two thirds of the time. Other
# platforms compile as usual until the same check has been made there.
_ANALYSIS_OPTIONS = {'cpu': {'xla_backend_optimization_level': 0}}


def analysis_compiler_options(platform: str) -> dict | None:
  """Compiler options for a compile whose figures are read but which is
  not run, on `platform`; None where a full compile is made."""
  options = _ANALYSIS_OPTIONS.get(platform)
  return None if options is None else dict(options)


@entry_point
def compile_costs(f, *args, policy: PolicyChoice = None, lowering: str | None = None,
                  argnums: int | tuple[int, ...] = 0, has_aux: bool = False,
                  whole_function: bool = False, donate_argnums=(),
                  repeats: int = 0, compiler_options: dict | None = None,
                  **kwargs) -> CompiledCosts:
  """Compile `f`'s training step at `args`, its outputs and their gradient
  (``gradient_function``), and report XLA's figures.

  `policy`, `lowering`, `argnums`, `has_aux` and `whole_function` mean what
  they mean for ``analyze`` (``NO_REMAT`` as the policy gives the
  no-remat baseline; a function without a remat block is compiled as
  written unless a policy is given).
  `donate_argnums`: positional arguments (negative ones count from the
  end) whose every leaf is donated to ``jax.jit``, so donated buffers show
  as aliased memory; a position out of range is a ``ValueError``.
  With `repeats` > 0 the step is also run: the median time of `repeats`
  runs after a warm-up, and the device's measured peak where it reports one.
  A compile that XLA refuses (out of memory, ...) gives a ``CompiledCosts``
  with ``failed=True`` and XLA's message. A sharded program (see
  ``analyze``) is compiled partitioned: the figures are per device, with
  the collectives of its HLO. Results are cached like ``analyze``'s.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> def loss(w, x):
    ...   layer = rx.checkpoint(lambda h: jnp.tanh(h @ w))
    ...   return jnp.sum(layer(layer(x)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> costs = rx.compile_costs(loss, w, x)
    >>> costs.policy, costs.failed, costs.peak_bytes > 0
    ('nothing_saveable (default)', False, True)
  """
  check_keywords(compile_costs, f, kwargs, policy=policy, lowering=lowering,
                 argnums=argnums, has_aux=has_aux, whole_function=whole_function,
                 donate_argnums=donate_argnums, repeats=repeats,
                 compiler_options=compiler_options)
  if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 0:
    raise ValueError(f'repeats must be an int >= 0 (runs to time), got {repeats!r}.')
  pending = _start(f, args, kwargs, policy=policy, lowering=lowering, argnums=argnums,
                   has_aux=has_aux, whole_function=whole_function,
                   donate_argnums=donate_argnums, compiler_options=compiler_options,
                   for_running=repeats > 0, executor=None)
  return timed_costs(pending, repeats)


def start_compile_costs(executor, f, *args, policy: PolicyChoice = None,
                        lowering: str | None = None, argnums=0, has_aux: bool = False,
                        whole_function: bool = False, donate_argnums=(),
                        compiler_options: dict | None = None, for_running: bool = False,
                        **kwargs) -> 'PendingCosts':
  """``compile_costs`` (without run times) with XLA's compile handed to
  `executor` (a ``concurrent.futures.Executor``): the step is traced and
  lowered on the calling thread, XLA compiles on the executor's thread
  without Python's lock, and ``PendingCosts.result()`` reads the compiled
  program. So a caller keeps its own thread busy (tracing the next step,
  analyzing) while XLA compiles. With `for_running` the compile is a full
  one, its executable kept until ``timed_costs`` times it, so that the step
  is not compiled again to run."""
  check_keywords(compile_costs, f, kwargs, policy=policy, lowering=lowering,
                 argnums=argnums, has_aux=has_aux, whole_function=whole_function,
                 donate_argnums=donate_argnums, compiler_options=compiler_options)
  return _start(f, args, kwargs, policy=policy, lowering=lowering, argnums=argnums,
                has_aux=has_aux, whole_function=whole_function,
                donate_argnums=donate_argnums, compiler_options=compiler_options,
                for_running=for_running, executor=executor)


class PendingCosts:
  """A ``compile_costs`` under way: ``compiled`` is done once XLA is (at
  once for a result found in the cache); ``result()`` waits for it and
  reads the program, on the thread that asks, once."""

  def __init__(self, key, request, lowering, compile_=None, entry=None):
    self.key, self.request, self.lowering = key, request, lowering
    self.leaves, self.donated = request.problem.leaves, request.donated
    self._compile, self._entry = compile_, entry
    self.compiled: concurrent.futures.Future = (
        _done_with(lambda: None) if compile_ is None else compile_.compiled)

  def entry(self) -> tuple[CompiledCosts, object]:
    """(costs, runnable), as ``_StepCompile.finish`` gives them."""
    if self._entry is None:
      self._entry = self._compile.finish()
      self._compile, self.compiled = None, _done_with(lambda: None)
      _cache.put(self.key, self._entry)
      give_back_freed_memory()  # the program and what reading it built, dropped
    return self._entry

  def result(self) -> CompiledCosts:
    return self.entry()[0]

  def compiled_to_run(self):
    """The step compiled in full, to run (not kept: its run times are)."""
    request = self.request
    step = trace_step(request.problem, request.policy, self.lowering, request.donated,
                      keep=False)
    note_compile()
    return step.traced.lower().compile()


def cached_compile_costs(f, *args, policy: PolicyChoice = None, lowering: str | None = None,
                         argnums=0, has_aux: bool = False, whole_function: bool = False,
                         donate_argnums=(), compiler_options: dict | None = None,
                         **kwargs) -> CompiledCosts | None:
  """What ``compile_costs`` gives for these arguments where it is in its
  cache; None where it is not (nothing is traced or compiled to know)."""
  request = StepRequest.make(f, args, kwargs, policy=policy, argnums=argnums,
                             has_aux=has_aux, whole_function=whole_function,
                             donate_argnums=donate_argnums, caller='compile_costs')
  entry = _cache.get(_cache_key(request, lowering, _options_key(compiler_options)))
  return None if entry is None else entry[0]


def _options_key(compiler_options: dict | None) -> tuple | None:
  # No options (an analysis compile) differs from empty ones (a full one).
  return None if compiler_options is None else tuple(sorted(compiler_options.items()))


def _cache_key(request: StepRequest, lowering, options_key) -> tuple:
  return request.problem.cache_key(request.policy, lowering, request.donate, options_key)


def _start(f, args, kwargs, *, policy, lowering, argnums, has_aux, whole_function,
           donate_argnums, compiler_options, for_running, executor) -> PendingCosts:
  request = StepRequest.make(f, args, kwargs, policy=policy, argnums=argnums,
                             has_aux=has_aux, whole_function=whole_function,
                             donate_argnums=donate_argnums, caller='compile_costs')
  problem, policy, donate, donated = (request.problem, request.policy, request.donate,
                                      request.donated)
  options_key = _options_key(compiler_options)
  key = _cache_key(request, lowering, options_key)
  entry = _cache.get(key)
  if entry is not None:
    return PendingCosts(key, request, lowering, entry=entry)
  step = trace_step(problem, policy, lowering, donated, keep=False)
  return PendingCosts(key, request, lowering, compile_=start_step_compile(
      step.traced, problem.leaves, function=problem.name, policy=step.policy,
      lowering=step.lowering, compiler_options=compiler_options,
      for_running=for_running, placement=find_placement(problem.leaves, step.program),
      notes=step.notes, executor=executor,
      program_key=problem.cache_key('program', donate, options_key, for_running)))


def start_step_compile(step, leaves, *, function, policy, lowering, donate_argnums=(),
                       compiler_options=None, placement=None, notes=(),
                       for_running=False, executor=None,
                       program_key=None) -> '_StepCompile | _SameProgram':
  """Lower `step` (a function, or a ``jax.stages.Traced`` from
  ``trace_step``, whose donations it keeps) and start XLA's compile, on
  `executor`'s thread or, without one, on this one.
  Unless `for_running` or the caller gives its own `compiler_options`, the
  figures come from an analysis compile, which keeps nothing to run
  (``runnable()`` gives None).
  With a `program_key` (what, besides the program, decides the compile:
  the arguments, their devices, the options), a step that lowers to the
  program of a step compiled or compiling under the same key is not
  compiled again: its figures are that compile's (``_SameProgram``)."""
  device = target_device(placement)
  options = compiler_options
  if options is None and not for_running:
    options = analysis_compiler_options(device.platform)
  analysis = compiler_options is None and options is not None
  start = time.perf_counter()
  if isinstance(step, jax.stages.Traced):  # traced already, donations set
    lowered = step.lower()
  else:
    lowered = jax.jit(step, donate_argnums=donate_argnums).lower(*leaves)
  lower_seconds = time.perf_counter() - start
  text = lowered.as_text()
  common = dict(function=function, policy=policy, lowering=lowering,
                platform=device.platform, device_kind=device.device_kind,
                device_memory_bytes=device_memory_bytes(device))
  if program_key is not None:
    program_key = (program_key, hashlib.sha256(text.encode()).digest())
  # The program is claimed before anything else is done for its compile, so
  # that a step asking for it later, or meanwhile on another thread (the
  # Explorer's views and its search, opening together), shares this compile.
  started = _StepCompile(
      lowered=lowered, compiled=concurrent.futures.Future(), analysis=analysis, dump=None,
      lower_seconds=lower_seconds, placement=placement, device=device, notes=tuple(notes),
      common=common, lowered_matmuls=0)
  first = _programs.setdefault(program_key, started)
  if first is not started:
    return _SameProgram(first, common, tuple(notes), lower_seconds)

  def give_back(e: BaseException) -> None:
    # What went wrong (an interrupt, a dump that could not be made) is not
    # this program's result: whoever asks for it later compiles it.
    _programs.pop(program_key)
    started.compiled.set_exception(e)
  try:
    started.lowered_matmuls = count_matmuls_lowered(text)
    # An accelerator's buffer assignment comes only with a dump (xla_dump.py).
    if device.platform != 'cpu':
      started.dump = XlaDump()
      options = {**(options or {}), **started.dump.compiler_options()}
  except BaseException as e:
    give_back(e)
    raise
  note_compile()  # counted for the thread that asked for it
  # A compile cancelled (a search that no longer needs it) gives its
  # program back, for whoever asks for it later to compile.
  started.compiled.add_done_callback(
      lambda future: _programs.pop(program_key) if future.cancelled() else None)

  def compile_into_future():
    # A compile cancelled before a worker took it up is not run (as an
    # executor's own future would have it).
    if not started.compiled.set_running_or_notify_cancel():
      return
    try:
      start = time.perf_counter()
      compiled = lowered.compile(options)
      started.compiled.set_result((compiled, time.perf_counter() - start))
    except Exception as e:  # XLA's refusal is the program's result
      started.compiled.set_exception(e)
    except BaseException as e:
      give_back(e)
      raise
  if executor is None:
    compile_into_future()
  else:
    executor.submit(compile_into_future)
  return started


def _done_with(fn) -> concurrent.futures.Future:
  """A future holding what `fn()` returned or raised."""
  future = concurrent.futures.Future()
  try:
    future.set_result(fn())
  except Exception as e:
    future.set_exception(e)
  return future


_programs = ResultCache(max_entries=32)
"""The compiles started, by program (``start_step_compile``'s
`program_key`): two policies, or a policy and the program as written, that
lower to one program share one XLA compile. Each entry drops its
executable once read (``_StepCompile.finish``)."""


@dataclass
class _StepCompile:
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
    this program (``_SameProgram``); the lowered program is then dropped,
    and the executable too but for what `runnable` holds until timed."""
    with self._lock:
      if self._finished is None:
        self._finished = self._read()
        self.lowered, self.compiled = None, _done_with(lambda: None)
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


class _SameProgram:
  """A step that lowered to the program of an earlier step (`first`):
  XLA's figures are that compile's, under this step's own labels, with a
  note naming the policy it shares the program with."""

  def __init__(self, first: _StepCompile, common: dict, notes: tuple[str, ...],
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
