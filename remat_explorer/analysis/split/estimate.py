"""``estimate_costs``: the training step's peak memory and FLOPs, estimated
from its jaxpr in milliseconds, before anything is compiled.

The step is the one ``compile_costs`` compiles (``program/step.py``: the
loss and its gradient), the same trace: one estimate costs the compile
that follows it no second trace. Its FLOPs are the jaxpr's count
(``flops.py``, loop trip counts applied); its peak is the liveness model
of ``jaxpr_memory.py`` over the step's jaxpr, the arguments and outputs
added as XLA places them (apart from its temporaries, for the whole
step). Every figure is a model's, to be replaced by ``compile_costs``'
once the step is compiled; ``bench/estimates.py`` measures how far apart
the two are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from jax.extend.core import ClosedJaxpr, Var

from remat_explorer.engine import in_backward_pass
from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.program.devices import (device_count, find_placement,
                                                     target_device)
from remat_explorer.analysis.program.keywords import check_keywords, entry_point
from remat_explorer.analysis.program.step import StepRequest, trace_step
from remat_explorer.analysis.split.backend import backend_of
from remat_explorer.analysis.split.flops import jaxpr_flops
from remat_explorer.analysis.split.jaxpr_memory import peak_bytes
from remat_explorer.analysis.split.operations import value_bytes


@dataclass(frozen=True)
class CostEstimate:
  """Estimated figures of one training step (outputs and gradients), from
  its jaxpr: a model of what XLA would do, not a measurement (the compiled
  figures, ``compile_costs``, replace it). Sizes in bytes, of the whole
  program (a sharded one's are not divided among its devices).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> estimate = rx.estimate_costs(f, w, x)
    >>> estimate.argument_bytes, estimate.residual_bytes, estimate.peak_bytes > 0
    (2048, 2048, True)
  """
  peak_bytes: int
  """Arguments + outputs + the most temporaries the liveness model holds at
  once (fused elementwise chains not materialised), less what donated
  arguments give to outputs."""
  flops: int
  """The step's FLOPs by XLA's conventions, each loop body once per trip:
  what ``compile_costs``' ``executed_flops`` measures."""
  residual_bytes: int
  """Values the forward pass keeps for the backward pass (stacked loop
  residuals and arguments the backward pass reads included), at the step's
  top level."""
  argument_bytes: int
  output_bytes: int
  seconds: float
  """How long the estimate took, tracing the step included (unless an
  earlier estimate or compile of the same step traced it)."""
  model_seconds: float = 0.0
  """The liveness model and FLOP count alone, on the traced step: what the
  estimate adds to a compile, which traces the same step (shared)."""
  function: str = ''
  policy: str = ''
  notes: tuple[str, ...] = ()
  platform: str = 'cpu'
  """The platform whose compiler the model follows (``backend.py``): that
  of the devices the arguments are placed on (a ``target_mesh``'s), else
  JAX's default device's."""
  num_devices: int = 1
  """The devices the program runs on (``compile_costs``' count). Above one,
  every figure is still the whole program's: XLA decides how each value
  is split only as it compiles."""


_cache = ResultCache(max_entries=256)
_POINTER_BYTES = 8


@entry_point
def estimate_costs(f, *args, policy=None, lowering: str | None = None,
                   argnums: int | tuple[int, ...] = 0, has_aux: bool = False,
                   whole_function: bool = False, donate_argnums=(),
                   **kwargs) -> CostEstimate:
  """Estimate the peak memory and FLOPs of `f`'s training step at `args`
  from its jaxpr alone: nothing is compiled. The options mean what they
  mean for ``compile_costs``; the figures are a model's (``CostEstimate``).
  Results are cached like ``compile_costs``'.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> def loss(w, x):
    ...   layer = rx.checkpoint(lambda h: jnp.tanh(h @ w))
    ...   return jnp.sum(layer(layer(x)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> estimate = rx.estimate_costs(loss, w, x)
    >>> estimate.residual_bytes, estimate.peak_bytes > 0, estimate.flops > 0
    (3072, True, True)
  """
  check_keywords(estimate_costs, f, kwargs, policy=policy, lowering=lowering,
                 argnums=argnums, has_aux=has_aux, whole_function=whole_function,
                 donate_argnums=donate_argnums)
  start = time.perf_counter()
  request = StepRequest.make(f, args, kwargs, policy=policy, argnums=argnums,
                             has_aux=has_aux, whole_function=whole_function,
                             donate_argnums=donate_argnums, caller='estimate_costs')
  problem, policy, donated = request.problem, request.policy, request.donated
  key = problem.cache_key('estimate', policy, lowering, request.donate)
  cached = _cache.get(key)
  if cached is not None:
    return cached
  step = trace_step(problem, policy, lowering, donated)
  notes = step.notes
  placement = find_placement(problem.leaves, step.program)
  num_devices = device_count(placement)
  if num_devices > 1:
    notes = (*notes, 'estimated for the whole program, not per device: the '
             f'program runs on {num_devices} devices')
  platform = target_device(placement).platform
  if platform == 'tpu':
    notes = (*notes, 'XLA:TPU fuses more than this model knows: on TPUs the '
             'estimate is far from the compiled peak, either way '
             '(bench/estimates.py --target)')
  estimate = _estimate(step.traced.jaxpr, donated, function=problem.name,
                       policy=step.policy, notes=notes, start=start, platform=platform,
                       num_devices=num_devices)
  _cache.put(key, estimate)
  return estimate


def _estimate(closed: ClosedJaxpr, donated, *, function, policy, notes,
              start, platform, num_devices) -> CostEstimate:
  model_start = time.perf_counter()
  jaxpr = closed.jaxpr
  backend = backend_of(platform)
  stored = backend.stored_bytes
  arguments = sum(stored(v.aval) for v in jaxpr.invars)
  outputs = sum(stored(v.aval) for v in jaxpr.outvars)
  if len(jaxpr.outvars) > 1:  # XLA's output tuple: a pointer per element
    outputs += _POINTER_BYTES * len(jaxpr.outvars)
  temporaries = peak_bytes(closed, count_outputs=False, backend=backend)
  peak = arguments + outputs + temporaries - _donated_bytes(jaxpr, donated, stored)
  return CostEstimate(
      peak_bytes=peak, flops=jaxpr_flops(closed),
      residual_bytes=residual_bytes(closed), argument_bytes=arguments,
      output_bytes=outputs, seconds=time.perf_counter() - start,
      model_seconds=time.perf_counter() - model_start,
      function=function, policy=policy, notes=notes, platform=platform,
      num_devices=num_devices)


def _donated_bytes(jaxpr, donated, stored_bytes) -> int:
  """Bytes (`stored_bytes` of each) of outputs XLA can write over a donated
  argument of the same type (each argument given to one output)."""
  free = [jaxpr.invars[i].aval for i in donated]
  given = 0
  for out in jaxpr.outvars:
    aval = getattr(out, 'aval', None)
    for i, candidate in enumerate(free):
      if (candidate is not None and aval is not None
          and (candidate.shape, candidate.dtype) == (aval.shape, aval.dtype)):
        given += stored_bytes(aval)
        free[i] = None
        break
  return given


def residual_bytes(closed: ClosedJaxpr) -> int:
  """Bytes of the values the step's forward equations make or take as
  arguments and its backward equations (JAX's ``transpose(...)`` scope)
  read: the residuals, as ``analyze`` counts them."""
  forward: set[Var] = set(closed.jaxpr.invars)
  read: set[Var] = set()
  backward: dict[int, tuple] = {}  # name stacks are shared: each read once
  for eqn in closed.jaxpr.eqns:
    stack = eqn.source_info.name_stack
    if id(stack) not in backward:
      backward[id(stack)] = stack, in_backward_pass(stack)
    if backward[id(stack)][1]:
      read.update(v for v in eqn.invars if isinstance(v, Var) and v in forward)
    else:
      forward.update(eqn.outvars)
  return sum(value_bytes(v) for v in read)
