"""How a differentiated checkpoint block is lowered to StableHLO.

The staged (backward-pass) copy of a block recomputes forward values. Left
unprotected, XLA sees the same computation twice and may merge it with the
forward pass (CSE), or schedule it early, while the forward values are still
live; either way the memory saving is gone. JAX has used three protections:

* ``"barrier"`` (JAX today): the recompute's inputs pass through one
  ``optimization_barrier``; XLA may not look through or move work across it.
* ``"cond"``: the recompute sits in the true branch of a conditional whose
  predicate, ``rng_uniform(0, 1) < 2``, is always true but cannot be folded
  by XLA; the branch starts only when all its operands (cotangents included)
  are ready, and cannot be hoisted or merged.
* ``"while"``: the recompute is the body of a loop whose trip count,
  ``rng_uniform(1, 2)``, is always one but opaque (JAX's old GPU lowering).

and ``"none"`` lowers it inline, as ``prevent_cse=False`` does.
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np

from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine.introspect import CHECKPOINT_LOWERING_SCOPE, RECOMPUTE_GUARD_SCOPE

core, mlir = jx.core, jx.mlir

STRATEGIES = ('barrier', 'cond', 'while', 'none')
DEFAULT_STRATEGY = 'barrier'

# Part of JAX's trace and jit cache keys: a function jitted outside a
# `lowering_strategy` block and called inside it is traced again, so the
# block's strategy reaches it instead of a stale trace's.
_enclosing_strategy = jx.traced_setting(
    'remat_explorer_lowering', STRATEGIES,
    help='How checkpoints that name no lowering strategy protect their recompute.')


def check_strategy(lowering) -> str:
  if lowering not in STRATEGIES:
    raise ValueError(
        f'the `lowering` argument of checkpoint must be one of {STRATEGIES}, '
        f'got {lowering!r}.')
  return lowering


@contextlib.contextmanager
def lowering_strategy(lowering: str):
  """Lower checkpoints called inside this block with `lowering`, unless they
  name a strategy of their own.

  Example:
    >>> import jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
    >>> with rx.lowering_strategy('cond'):
    ...   report = rx.analyze(f, 2.0)
    >>> report.lowering
    'cond'
  """
  check_strategy(lowering)
  with _enclosing_strategy(lowering):
    yield


def enclosing_strategy() -> str | None:
  """The strategy of the innermost ``lowering_strategy`` block, if any."""
  return _enclosing_strategy.value


def current_strategy(explicit: str | None) -> str:
  """The strategy for a block: its own, else the enclosing block's, else the default."""
  if explicit is not None:
    return explicit
  return _enclosing_strategy.value or DEFAULT_STRATEGY


def lower_checkpoint(ctx, *args, jaxpr, prevent_cse, differentiated, policy,
                     lowering, ref_effects):
  del policy, ref_effects  # refs are discharged before lowering
  protect = _protected_inputs(prevent_cse, len(args))
  if lowering == 'none' or not differentiated or not any(protect):
    # The forward copy, or nothing asked to be protected: plain inline code.
    return _lower_body(ctx, jaxpr, args)
  if lowering == 'barrier':
    return _lower_body(ctx, jaxpr, _behind_optimization_barrier(ctx, args, protect))
  if jaxpr.effects:
    raise NotImplementedError(
        f'checkpoint(lowering={lowering!r}) cannot lower a block with effects '
        f'{set(jaxpr.effects)}; use lowering="barrier" for this block.')
  recompute = _recompute_in_cond if lowering == 'cond' else _recompute_in_while
  guarded = ctx.replace(name_stack=ctx.name_stack.extend(RECOMPUTE_GUARD_SCOPE))
  return mlir.lower_fun(lambda *xs: recompute(jaxpr, xs), multiple_results=True)(guarded, *args)


def _protected_inputs(prevent_cse, num_inputs) -> tuple[bool, ...]:
  """For each input, whether the recompute must not be merged across it."""
  if isinstance(prevent_cse, bool):
    return (prevent_cse,) * num_inputs
  return prevent_cse


def _lower_body(ctx, jaxpr, inputs):
  """Emit the block's equations in place, under a `checkpoint` name scope.

  ``jaxpr_subcomp`` is JAX's one way for a lowering rule to inline a jaxpr,
  and its arguments are fixed by that: everything the enclosing lowering
  carries (effect tokens in, shape variables, how constants are lowered,
  the caller's traceback) goes in, no constants do (a body closes over
  none), and the tokens the body's effects leave become this equation's.
  """
  scope = ctx.name_stack.extend(CHECKPOINT_LOWERING_SCOPE)
  outs, tokens_after_body = mlir.jaxpr_subcomp(
      ctx.module_context, jaxpr, scope, ctx.tokens_in, (), *inputs,
      dim_var_values=ctx.dim_var_values, const_lowering=ctx.const_lowering,
      outer_traceback=ctx.traceback)
  ctx.set_tokens_out(tokens_after_body)
  return outs


def _behind_optimization_barrier(ctx, inputs, protect):
  """`inputs`, the protected ones replaced by their values after a single
  `optimization_barrier`: XLA cannot see through it, so it can neither start
  the recompute before those values arrive nor merge it with the forward pass.
  """
  positions = [i for i, p in enumerate(protect) if p]
  # Each array input is one IR value, so results pair up with positions.
  barrier = jx.hlo.OptimizationBarrierOp([inputs[i] for i in positions])
  guarded = list(inputs)
  for i, result in zip(positions, barrier.results, strict=True):
    # Keep the sharding the input's type carries (explicit-axes meshes).
    guarded[i] = mlir.lower_with_sharding_in_types(ctx, result, ctx.avals_in[i])
  return guarded


def _run(jaxpr, args):
  return core.eval_jaxpr(jaxpr, (), *args)


def _placeholders(jaxpr):
  return [jax.numpy.zeros(v.aval.shape, v.aval.dtype) for v in jaxpr.outvars]


def _recompute_in_cond(jaxpr, args):
  always = jax.lax.rng_uniform(np.float32(0), np.float32(1), shape=()) < np.float32(2)
  return jax.lax.cond(always, lambda xs: _run(jaxpr, xs),
                      lambda xs: _placeholders(jaxpr), list(args))


def _recompute_in_while(jaxpr, args):
  trips = jax.lax.rng_uniform(np.int32(1), np.int32(2), shape=())

  def body(carry):
    count, _, xs = carry
    return count + 1, _run(jaxpr, xs), xs
  _, outs, _ = jax.lax.while_loop(
      lambda carry: carry[0] < trips, body,
      (np.int32(0), _placeholders(jaxpr), list(args)))
  return outs
