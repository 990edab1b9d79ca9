"""``checkpointed_scan``: a ``jax.lax.scan`` whose gradient keeps few carries.

``lax.scan(checkpoint(f))``, the usual idiom, still keeps one carry per step
for the backward pass. ``checkpointed_scan`` runs the same loop under a
schedule (``scan_plans`` says why each costs what it does) and keeps only
the schedule's carries:

* ``'every'``: ``lax.scan(checkpoint(f))``, n carries, each step evaluated
  twice;
* ``'sqrt'`` / ``segments=k``: k checkpointed segments, each a
  ``lax.scan(checkpoint(f))``; k + n // k carries (about 2 sqrt(n) for
  'sqrt'), one more forward pass;
* ``('binomial', s)``: Griewank's binomial schedule, at most `s` carries and
  the fewest step evaluations possible with them.

The nested schedules are built from our ``checkpoint`` and ``lax.scan``
only, so every JAX transformation that applies to those applies to them
(``jit``, ``vmap``, ``jvp``, ``grad`` of ``grad``, sharded inputs). The
binomial schedule is one loop with its own VJP (``revolve_scan``): its
program does not grow with n, and it takes ``jit``, ``vmap``, ``grad`` of
``grad`` and ``jvp`` of ``grad``, but not ``jvp`` of the scan itself.

What else the backward pass holds: one step's intermediates at a time (its
"tape"), what `policy` lets a step save, and, when `xs` is differentiated,
its cotangent (the size of `xs`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
from jax import lax

from remat_explorer.engine.api import checkpoint
from remat_explorer.engine.introspect import scan_scope
from remat_explorer.engine.lowering import enclosing_strategy
from remat_explorer.engine.revolve_scan import revolve_scan
from remat_explorer.engine.scan_plans import (
    Chain, Checkpointed, Loop, Step, plan_for, resolve_schedule, scan_schedule_costs)

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
    f: as for ``jax.lax.scan``.
    init: as for ``jax.lax.scan``.
    xs: as for ``jax.lax.scan``.
    length: as for ``jax.lax.scan``.
    reverse: as for ``jax.lax.scan``.
    schedule: which carries the forward pass keeps for the backward pass.
      ``'every'`` (``lax.scan(checkpoint(f))``), ``'sqrt'`` (ceil(sqrt(n))
      checkpointed segments), ``'segments'`` with `segments`, or
      ``('binomial', s)``: Griewank's schedule holding at most `s` carries,
      with the fewest step evaluations possible for that `s`.
      ``scan_schedule_costs`` gives each one's carries and evaluations.
    segments: the number of checkpointed segments; implies the segmented
      layout, with the default `schedule` or ``'segments'``.
    policy: the checkpoint policy of each step, as for ``checkpoint``:
      which of a step's intermediates its checkpoint may save. (The last
      step of each block is not checkpointed: its backward pass follows
      at once.) The binomial loop linearizes each step right before its
      VJP, so it saves nothing a policy could choose.
    unroll: as for ``lax.scan``; applies to the loops over single steps
      (the binomial schedule's forward and backward loops).

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
  if n == 0:  # nothing to keep: the idiom is as good as any schedule
    return lax.scan(checkpoint(f, policy=policy), init, xs, length=0, reverse=reverse,
                    unroll=unroll)
  init, has_effects = _as_lax_scan_carries(f, init, xs, n)
  kind, size = resolve_schedule(schedule, segments, n)
  # The schedule, its length and its carry, in the name of the scope the
  # program runs in: what the analysis reads to put the schedule's
  # predicted costs beside the measured ones.
  scope = scan_scope(scan_schedule_costs(n, schedule, segments).schedule, n, init)
  if kind == 'binomial':
    with jax.named_scope(scope):
      return revolve_scan(f, init, xs, n, size, reverse=reverse, unroll=unroll, scope=scope)
  runner = _Runner(f, policy, reverse, unroll, _chain_block_lowering(has_effects))
  plan = plan_for(n, schedule, segments)
  # Chains of blocks read the steps' inputs in place (see _Runner).
  in_place = isinstance(plan, Chain) and bool(jax.tree_util.tree_leaves(xs))
  with jax.named_scope(scope):
    return runner.run(plan, init, xs, (xs, 0) if in_place else None)


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

  Where a block receives its slice of `xs`, the slice is a copy, and the
  block keeps it for its recompute: nested blocks would keep copies of
  copies, up to several times `xs` when a step's input is as large as its
  carry. So plans with chains of blocks read the steps' inputs in place:
  ``at = (xs_all, row)`` says where the chunk in hand starts in the full
  `xs`, each step reads its row from there (blocks keep `xs_all` itself,
  shared), and the chunk only brings the tangent (see ``_read_in_place``).
  """

  def __init__(self, f, policy, reverse, unroll, chain_lowering):
    self.steps = {(False, False): f, (True, False): checkpoint(f, policy=policy)}
    in_place = _read_in_place(f)
    self.steps[False, True] = in_place
    self.steps[True, True] = checkpoint(in_place, policy=policy)
    self.reverse, self.unroll = reverse, unroll
    self.chain_lowering = chain_lowering
    self._blocks = {}

  def run(self, plan, carry, xs, at=None):
    """(final carry, stacked ys) of the `plan.length` steps of `plan`."""
    if isinstance(plan, Step):
      return self._one_step(plan, carry, xs, at)
    if isinstance(plan, Loop):
      return self._loop(plan, carry, xs, at)
    if isinstance(plan, Chain):
      return self._chain(plan, carry, xs, at)
    assert isinstance(plan, Checkpointed), plan
    return self._call_block(plan, None, carry, xs, at)

  def _step(self, plan, at):
    """The step as a function of (carry, x), or of (carry, xs_all, row, x)."""
    return self.steps[plan.checkpointed, at is not None]

  def _one_step(self, plan, carry, xs, at):
    x = tree_map(lambda a: lax.squeeze(a, (0,)), xs)
    carry, y = self._step(plan, at)(carry, x) if at is None else (
        self._step(plan, at)(carry, at[0], at[1], x))
    return carry, tree_map(lambda a: jax.numpy.expand_dims(a, 0), y)

  def _loop(self, plan, carry, xs, at):
    times, inner = plan.times, plan.body.length
    scan = lambda body, xs, unroll: lax.scan(body, carry, xs, length=times,
                                             reverse=self.reverse, unroll=unroll)
    if isinstance(plan.body, Step):
      step = self._step(plan.body, at)
      if at is None:
        return scan(step, xs, self.unroll)
      xs_all, row = at
      return scan(lambda c, x_i: step(c, xs_all, row + x_i[1], x_i[0]),
                  (xs, _indices(times)), self.unroll)
    blocks = tree_map(lambda a: a.reshape((times, inner) + a.shape[1:]), xs)
    if at is None:
      carry, ys = scan(lambda c, x: self.run(plan.body, c, x), blocks, 1)
    else:
      xs_all, row = at
      carry, ys = scan(lambda c, x_i: self.run(plan.body, c, x_i[0],
                                               (xs_all, row + x_i[1] * inner)),
                       (blocks, _indices(times)), 1)
    return carry, tree_map(lambda a: a.reshape((plan.length,) + a.shape[2:]), ys)

  def _chain(self, plan, carry, xs, at):
    sizes = [p.length for p in plan.parts]
    ys = []
    for part, chunk, start in zip(plan.parts, _split(xs, sizes, self.reverse),
                                  _chunk_starts(sizes, self.reverse)):
      part_at = None if at is None else (at[0], at[1] + start)
      if isinstance(part, Checkpointed):
        carry, y = self._call_block(part, self.chain_lowering, carry, chunk, part_at)
      else:
        carry, y = self.run(part, carry, chunk, part_at)
      ys.append(y)
    return carry, _concatenate(ys, self.reverse)

  def _call_block(self, plan, lowering, carry, xs, at):
    key = (plan, lowering, at is None)
    block = self._blocks.get(key)
    if block is None:
      if at is None:
        def checkpointed_scan_block(carry, xs):
          return self.run(plan.body, carry, xs)
      else:
        def checkpointed_scan_block(carry, xs_all, row, xs):
          return self.run(plan.body, carry, xs, (xs_all, row))
      # A block keeps only its inputs; the policy is the steps' own.
      block = self._blocks[key] = checkpoint(checkpointed_scan_block, lowering=lowering)
    return block(carry, xs) if at is None else block(carry, at[0], at[1], xs)


def _read_in_place(f):
  """`f` with its input `x` read from row `row` of `xs_all`.

  `x` itself, the same numbers cut from `xs` block by block, brings the
  tangent: under differentiation the read row's tangent is dropped and
  `x`'s used, so `xs`'s cotangent is assembled by the blocks' concatenations
  rather than by every block padding its rows to the full length. Nothing
  needs `x`'s values, so no block keeps them.
  """
  def step_reading_xs_in_place(carry, xs_all, row, x):
    read = tree_map(lambda a: lax.dynamic_index_in_dim(a, row, 0, keepdims=False), xs_all)
    return f(carry, tree_map(_with_tangent_of, read, x))
  return step_reading_xs_in_place


@jax.custom_jvp
def _with_tangent_of(value, twin):
  """`value`, differentiated as `twin` (which holds the same numbers)."""
  return value


def _with_tangent_of_jvp(primals, tangents):
  value, _ = primals
  return value, tangents[1]

_with_tangent_of.defjvp(_with_tangent_of_jvp, symbolic_zeros=True)


def _indices(times):
  return jax.numpy.arange(times, dtype=jax.numpy.int32)


def _chunk_starts(sizes, reverse):
  """Where each chunk of `_split` starts in its parent, in rows of `xs`."""
  ends = list(itertools.accumulate(sizes))
  total = ends[-1]
  return [total - end if reverse else end - size for size, end in zip(sizes, ends)]


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
