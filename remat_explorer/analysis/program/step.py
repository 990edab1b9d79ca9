"""The training step every figure of a policy is taken from: the loss and
its gradient, as ``compile_costs`` compiles it and ``estimate_costs``
traces it."""

from __future__ import annotations

import jax
import numpy as np


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
