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
import contextlib
import hashlib
import time

import jax

from remat_explorer.engine import is_compile_only, no_persistent_cache_writes
from remat_explorer.analysis.xla.costs import CompiledCosts
from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.freed_memory import give_back_freed_memory
from remat_explorer.analysis.context import note_compile
from remat_explorer.analysis.program.keywords import check_keywords, entry_point
from remat_explorer.analysis.program.step import StepRequest, trace_step
from remat_explorer.analysis.program.blocks import PolicyChoice
from remat_explorer.analysis.program.devices import find_placement, target_device
from remat_explorer.analysis.targets.device_memory import device_memory_bytes
from remat_explorer.analysis.xla.kernel_cache import kernel_cache_options, reuses_kernels
from remat_explorer.analysis.xla.xla_dump import XlaDump
from remat_explorer.analysis.xla.step_compile import SameProgram, StepCompile, done_with
from remat_explorer.analysis.xla.hlo import count_matmuls_lowered
from remat_explorer.analysis.xla.run_times import timed_costs


_cache = ResultCache(max_entries=32)
"""(costs, runnable) by problem and setting: a step compiled to run keeps its
executable until its runs are timed, so that it is not compiled again."""

_programs = ResultCache(max_entries=32)
"""The compiles started, by program (``start_step_compile``'s
`program_key`): two policies, or a policy and the program as written, that
lower to one program share one XLA compile. Each entry drops its
executable once read (``StepCompile.finish``)."""


# What an analysis compile changes, by platform. On the CPU, the backend's
# optimization level only affects the machine code LLVM makes from the
# optimized HLO: the HLO, its schedule, the buffer assignment and so every
# figure read here are those of a full compile (checked field by field in
# tests/test_analysis_compile.py), in about two thirds of the time. A
# compile-only GPU reuses the kernels its compiles made before
# (``kernel_cache.py``; checked the same way). Other platforms, a live GPU
# among them, compile as usual until the same check has been made there.
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
        done_with(lambda: None) if compile_ is None else compile_.compiled)

  def entry(self) -> tuple[CompiledCosts, object]:
    """(costs, runnable), as ``StepCompile.finish`` gives them."""
    if self._entry is None:
      self._entry = self._compile.finish()
      self._compile, self.compiled = None, done_with(lambda: None)
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
                       program_key=None) -> 'StepCompile | SameProgram':
  """Lower `step` (a function, or a ``jax.stages.Traced`` from
  ``trace_step``, whose donations it keeps) and start XLA's compile, on
  `executor`'s thread or, without one, on this one.
  Unless `for_running` or the caller gives its own `compiler_options`, the
  figures come from an analysis compile, which keeps nothing to run
  (``runnable()`` gives None).
  With a `program_key` (what, besides the program, decides the compile:
  the arguments, their devices, the options), a step that lowers to the
  program of a step compiled or compiling under the same key is not
  compiled again: its figures are that compile's (``SameProgram``)."""
  device = target_device(placement)
  options = compiler_options
  if options is None and not for_running:
    options = analysis_compiler_options(device.platform)
  kernels_reused = compiler_options is None and not for_running and reuses_kernels(device)
  # What is compiled for a compile-only device cannot be loaded back from
  # JAX's persistent compilation cache: nothing of it is written there.
  cache_writes = (no_persistent_cache_writes if is_compile_only(device)
                  else contextlib.nullcontext)
  analysis = compiler_options is None and (options is not None or kernels_reused)
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
  started = StepCompile(
      lowered=lowered, compiled=concurrent.futures.Future(), analysis=analysis, dump=None,
      lower_seconds=lower_seconds, placement=placement, device=device, notes=tuple(notes),
      common=common, lowered_matmuls=0)
  first = _programs.setdefault(program_key, started)
  if first is not started:
    return SameProgram(first, common, tuple(notes), lower_seconds)

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
      # The kernel cache is this thread's: a file no other compile writes.
      with cache_writes():
        compiled = lowered.compile({**options, **kernel_cache_options()} if kernels_reused
                                   else options)
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
