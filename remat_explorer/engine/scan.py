"""``checkpointed_scan``: a ``jax.lax.scan`` whose gradient keeps few carries.

``lax.scan(checkpoint(f))``, the usual idiom, still keeps one carry per step
for the backward pass. ``checkpointed_scan`` runs the same loop under a
schedule of nested checkpoints (``scan_plans`` builds the plan and says why it
costs what it does) and keeps only the schedule's carries:

* ``'every'``: ``lax.scan(checkpoint(f))``, n carries, each step evaluated
  twice;
* ``'sqrt'`` / ``segments=k``: k checkpointed segments, each a
  ``lax.scan(checkpoint(f))``; k + n // k carries (about 2 sqrt(n) for
  'sqrt'), one more forward pass;
* ``('binomial', s)``: Griewank's binomial schedule, at most `s` carries and
  the fewest step evaluations possible with them.

The program is built from our ``checkpoint`` and ``lax.scan`` only, so every
JAX transformation that applies to those applies here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax import lax

from remat_explorer.engine.api import checkpoint
from remat_explorer.engine.lowering import enclosing_strategy
from remat_explorer.engine.scan_plans import (
    Chain, Checkpointed, Loop, Step, plan_for, resolve_schedule)

tree_map = jax.tree_util.tree_map


def checkpointed_scan(f: Callable, init, xs=None, length: int | None = None, *,
                      schedule: Any = 'every', segments: int | None = None,
                      policy: Callable[..., Any] | None = None,
                      reverse: bool = False, unroll: int | bool = 1):
  """``jax.lax.scan(f, init, xs, length, reverse, unroll)``, differentiated
  under a checkpointing schedule.

  Values are those of ``lax.scan``: the final carry and the stacked outputs,
  for pytrees of arrays, with `length` alone when there are no `xs`, and with
  ``reverse=True`` walking `xs` from the end. Gradients equal those of
  ``lax.scan``; what changes is what the forward pass keeps for them.

  Args:
    f, init, xs, length, reverse: as for ``jax.lax.scan``.
    schedule: which carries the forward pass keeps for the backward pass.
      ``'every'`` (``lax.scan(checkpoint(f))``), ``'sqrt'`` (ceil(sqrt(n))
      checkpointed segments), ``'segments'`` with `segments`, or
      ``('binomial', s)``: Griewank's schedule holding at most `s` carries,
      with the fewest step evaluations possible for that `s`.
      ``scan_schedule_costs`` gives each one's carries and evaluations.
    segments: the number of checkpointed segments; implies the segmented
      layout, with the default `schedule` or ``'segments'``.
    policy: the checkpoint policy of each step, as for ``checkpoint``:
      which of a step's intermediates its checkpoint may save.
    unroll: as for ``lax.scan``; applies to the loops over single steps.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from remat_explorer import checkpointed_scan
    >>> step = lambda c, x: (jnp.sin(c) * x, c)
    >>> xs = jnp.linspace(0.5, 1.5, 100)
    >>> loss = lambda c: checkpointed_scan(step, c, xs, schedule=('binomial', 4))[0]
    >>> bool(jnp.allclose(jax.grad(loss)(1.0),
    ...                   jax.grad(lambda c: jax.lax.scan(step, c, xs)[0])(1.0)))
    True
  """
  if not callable(f):
    raise TypeError(f'checkpointed_scan expects a callable step function `f`, '
                    f'got {type(f).__name__}: {f!r}.')
  if policy is not None and not callable(policy):
    raise TypeError(f'the `policy` argument of checkpointed_scan must be callable, '
                    f'such as checkpoint_policies.dots_saveable, or None; got '
                    f'{type(policy).__name__}: {policy!r}.')
  reverse = bool(reverse)
  n = _scan_length(xs, length)
  resolve_schedule(schedule, segments, max(n, 1))  # checks them even for n = 0
  step = checkpoint(f, policy=policy)
  if n == 0:  # nothing to keep: the idiom is as good as any schedule
    return lax.scan(step, init, xs, length=0, reverse=reverse, unroll=unroll)
  init, has_effects = _as_lax_scan_carries(f, init, xs, n)
  runner = _Runner(f, step, reverse, unroll, _chain_block_lowering(has_effects))
  return runner.run(plan_for(n, schedule, segments), init, xs)


def _scan_length(xs, length) -> int:
  """The number of steps, from `length` and the leading axes of `xs`."""
  leaves = jax.tree_util.tree_leaves(xs)
  sizes = []
  for leaf in leaves:
    shape = getattr(leaf, 'shape', None)
    if not shape:
      raise ValueError(f'checkpointed_scan scans over the leading axis of every '
                       f'leaf of `xs`, but one has no leading axis: {leaf!r}.')
    sizes.append(shape[0])
  if length is not None:
    try:
      length = int(length)
    except (TypeError, jax.errors.ConcretizationTypeError):
      raise TypeError(f'the `length` argument of checkpointed_scan must be a '
                      f'concrete int, got {length!r}.') from None
    if length < 0:
      raise ValueError(f'the `length` argument of checkpointed_scan must be >= 0, '
                       f'got {length}.')
    if any(size != length for size in sizes):
      raise ValueError(f'checkpointed_scan got `length`={length}, which disagrees '
                       f'with the leading axis sizes of `xs`: {sizes}.')
    return length
  if not leaves:
    raise ValueError('checkpointed_scan needs `length` when `xs` has no arrays '
                     f'to scan over (got xs={xs!r}).')
  if len(set(sizes)) > 1:
    raise ValueError(f'the leaves of `xs` must share their leading axis size, '
                     f'got sizes {sizes}.')
  return sizes[0]


def _as_lax_scan_carries(f, init, xs, n):
  """`init` as ``lax.scan`` would carry it, and whether `f` has effects.

  Types are checked by ``lax.scan`` itself, abstractly, so that a body whose
  carry changes type fails with its message; and weakly typed initial values
  (Python scalars) take the dtype the body gives them, as ``lax.scan`` does.
  """
  jaxpr, (carry_out, _) = jax.make_jaxpr(
      lambda c, x: lax.scan(f, c, x, length=n), return_shape=True)(init, xs)

  def promote(value, out):
    aval = jax.typeof(value)
    if aval.weak_type and aval.dtype != out.dtype:
      return lax.convert_element_type(value, out.dtype)
    return value
  return tree_map(promote, init, carry_out), bool(jaxpr.effects)


def _chain_block_lowering(has_effects):
  """How the checkpointed blocks of a chain protect their recompute.

  In a chain ``c(b(a(x)))`` of checkpointed blocks, `a`'s recompute needs
  only its saved input, so nothing but the protection keeps the backward
  pass from running it early, next to `b`'s and `c`'s, with all their
  carries alive at once. An optimization barrier does not keep it in place
  on every backend (XLA:CPU drops barriers before it schedules), so blocks
  run their recompute in a conditional that also takes the cotangents
  (``lowering="cond"``), which cannot start before they exist. Each nesting
  level then keeps its incoming and outgoing cotangent carry alive while it
  runs. Loops need none of this: a scan's backward runs its steps in order.
  A step with effects cannot sit in a conditional, and an enclosing
  ``lowering_strategy`` block has the last word.
  """
  if has_effects or enclosing_strategy() is not None:
    return None
  return 'cond'


class _Runner:
  """Runs a plan for one call of ``checkpointed_scan``.

  Each distinct checkpointed block gets one function, so that equal blocks
  are traced once and share one jaxpr.
  """

  def __init__(self, f, step, reverse, unroll, chain_lowering):
    self.taped, self.step = f, step
    self.reverse, self.unroll = reverse, unroll
    self.chain_lowering = chain_lowering
    self._blocks = {}

  def run(self, plan, carry, xs):
    """(final carry, stacked ys) of the `plan.length` steps of `plan`."""
    if isinstance(plan, Step):
      return self._one_step(plan, carry, xs)
    if isinstance(plan, Loop):
      return self._loop(plan, carry, xs)
    if isinstance(plan, Chain):
      return self._chain(plan, carry, xs)
    assert isinstance(plan, Checkpointed), plan
    return self._block(plan)(carry, xs)

  def _one_step(self, plan, carry, xs):
    fn = self.step if plan.checkpointed else self.taped
    carry, y = fn(carry, tree_map(lambda a: lax.squeeze(a, (0,)), xs))
    return carry, tree_map(lambda a: jax.numpy.expand_dims(a, 0), y)

  def _loop(self, plan, carry, xs):
    if isinstance(plan.body, Step):
      fn = self.step if plan.body.checkpointed else self.taped
      return lax.scan(fn, carry, xs, length=plan.times, reverse=self.reverse,
                      unroll=self.unroll)
    inner = plan.body.length
    blocks = tree_map(lambda a: a.reshape((plan.times, inner) + a.shape[1:]), xs)
    carry, ys = lax.scan(lambda c, x: self.run(plan.body, c, x), carry, blocks,
                         length=plan.times, reverse=self.reverse)
    return carry, tree_map(lambda a: a.reshape((plan.length,) + a.shape[2:]), ys)

  def _chain(self, plan, carry, xs):
    sizes = [p.length for p in plan.parts]
    chunks = _split(xs, sizes, self.reverse)
    ys = []
    for part, chunk in zip(plan.parts, chunks):
      if isinstance(part, Checkpointed):
        carry, y = self._block(part, self.chain_lowering)(carry, chunk)
      else:
        carry, y = self.run(part, carry, chunk)
      ys.append(y)
    return carry, _concatenate(ys, self.reverse)

  def _block(self, plan, lowering=None):
    key = (plan, lowering)
    block = self._blocks.get(key)
    if block is None:
      def checkpointed_scan_block(carry, xs):
        return self.run(plan.body, carry, xs)
      # A block keeps only its input carry; the policy is the steps' own.
      block = self._blocks[key] = checkpoint(checkpointed_scan_block, lowering=lowering)
    return block


def _split(xs, sizes, reverse):
  """`xs` cut along its leading axis into consecutive chunks of `sizes` steps,
  listed in the order the steps run (from the end when `reverse`)."""
  order = sizes[::-1] if reverse else sizes
  leaves, tree = jax.tree_util.tree_flatten(xs)
  per_leaf = [lax.split(leaf, order, axis=0) for leaf in leaves]
  chunks = [tree.unflatten(parts) for parts in zip(*per_leaf)] if leaves else (
      [xs] * len(sizes))
  return chunks[::-1] if reverse else chunks


def _concatenate(ys, reverse):
  """The chunks' stacked outputs, back in the order of `xs`."""
  ordered = ys[::-1] if reverse else ys
  return tree_map(lambda *parts: lax.concatenate(parts, 0), *ordered)
