"""The training step every figure of a policy is taken from: the loss and
its gradient, as ``compile_costs`` compiles it and ``estimate_costs``
reads it, traced once for both (``trace_step``)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.program.blocks import built_policy_choice, policy_label
from remat_explorer.analysis.program.problem import Problem, donated_positions


def gradient_function(run_program, problem):
  """The function compiled: ``jax.value_and_grad`` when the function returns
  one float scalar (the loss and its gradient, as a training step computes
  them; ``has_aux`` as for ``value_and_grad``), else the VJP with a ones
  cotangent, returning the outputs and the gradients.

  The outputs are returned in both cases because a training step uses them:
  with ``grad`` alone, XLA removes forward work that only feeds the loss
  value, and with it, for a checkpointed last block, the forward copy of
  what the backward pass recomputes, which hides that block's remat cost.
  """
  def split(leaves):
    diff = [x for x, d in zip(leaves, problem.diff_mask) if d]
    other = [x for x, d in zip(leaves, problem.diff_mask) if not d]

    def primal(*d):
      outs = run_program(*problem.merge(d, other))
      return outs[:problem.num_outputs], outs[problem.num_outputs:]
    return diff, primal

  outs = jax.eval_shape(run_program, *problem.leaves)[:problem.num_outputs]
  if len(outs) == 1 and outs[0].shape == () and differentiable(outs[0]):
    def value_and_grad_step(*leaves):
      diff, primal = split(leaves)
      def loss_and_aux(*d):
        loss, aux = primal(*d)
        return loss[0], aux
      return jax.value_and_grad(loss_and_aux, argnums=tuple(range(len(diff))),
                                has_aux=True)(*diff)
    return value_and_grad_step

  def vjp_step(*leaves):
    diff, primal = split(leaves)
    outs, vjp_fn, aux = jax.vjp(primal, *diff, has_aux=True)
    cotangents = [jax.numpy.ones_like(o) if differentiable(o) else
                  np.zeros(o.shape, jax.dtypes.float0) for o in outs]
    return outs, aux, vjp_fn(cotangents)
  return vjp_step


def differentiable(x) -> bool:
  return jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)


@dataclass(frozen=True)
class StepRequest:
  """What an entry point asks of a training step, checked: the problem
  (function, arguments, argnums), the policy built, and the positional
  arguments donated, as given and among the step's traced leaves."""
  problem: Problem
  policy: object
  donate: tuple[int, ...]
  donated: tuple[int, ...]

  @classmethod
  def make(cls, f, args, kwargs, *, policy, argnums, has_aux, whole_function,
           donate_argnums, caller: str) -> 'StepRequest':
    policy = built_policy_choice(policy)
    problem = Problem.make(f, args, kwargs, argnums, has_aux=has_aux,
                           whole_function=whole_function, caller=caller)
    donate = donated_positions(donate_argnums, args)
    return cls(problem, policy, donate, problem.traced_positions(donate))


@dataclass(frozen=True)
class TracedStep:
  """One policy's training step, traced once for everything that reads it:
  ``estimate_costs`` reads its jaxpr, ``compile_costs`` lowers it (so an
  estimate shown before the compile costs the compile no second trace)."""
  traced: jax.stages.Traced
  program: object
  """The program with its remat blocks set (``program_with_blocks``)."""
  policy: str
  """The policy's label, as rows and captions name it."""
  lowering: str
  notes: tuple[str, ...]


_traced_steps = ResultCache(max_entries=32)


def trace_step(problem, policy, lowering, donated: tuple[int, ...], *,
               keep: bool = True) -> TracedStep:
  """`problem`'s training step under `policy` and `lowering`, traced with
  ``jax.jit`` (`donated`: traced positions donated), cached by everything
  that changes it.

  A step about to be compiled is taken out of the cache (`keep=False`):
  JAX keeps a traced program's lowered module for as long as the program
  lives (its lowering cache is keyed on the jaxpr), so a cached step held
  its whole module once compiled, 1.3 GiB for each policy of
  recurrentgemma's Griffin. The compile's figures are cached on their own."""
  key = problem.cache_key('step', policy, lowering, donated)
  found = _traced_steps.get(key) if keep else _traced_steps.pop(key)
  if found is not None:
    return found
  program, blocks, notes = problem.program_with_blocks(policy, lowering)
  step = gradient_function(problem.program_function(program, blocks), problem)
  traced = jax.jit(step, donate_argnums=donated).trace(*problem.leaves)
  found = TracedStep(
      traced=traced, program=program, policy=policy_label(policy, blocks),
      lowering=lowering or ', '.join(sorted({b.lowering for b in blocks})),
      notes=tuple(notes))
  if keep:
    _traced_steps.put(key, found)
  return found
