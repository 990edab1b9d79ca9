"""The binomial schedule of ``checkpointed_scan`` as one loop with its own VJP.

``revolve_scan`` is a ``jax.custom_vjp`` function. Undifferentiated it is
``lax.scan``. Its forward pass is one ``lax.scan`` over the steps that also
writes the schedule's snapshots into a preallocated ``(slots, *carry)``
buffer; the last step is linearized there (its VJP comes first). Its
backward pass is one ``lax.scan`` of ``p(n, s)`` turns, each evaluating the
step once, linearized, and then either advancing or, when the cotangent is
one step ahead, applying the VJP and restoring the newest snapshot
(``revolve`` decides which, from a few integers). So the program holds one
copy of the step per pass whatever `n`, at most `s` carries plus one step's
working set (the loop itself orders the recompute: no barrier is needed),
and evaluates the step exactly ``n + p(n, s)`` times.

Every array the step closes over is hoisted out of it (``_hoisted``) and
passed once, as an argument of the loops: one the differentiation may
perturb (a traced inexact value) gets the cotangent the backward pass
accumulates; any other (data the step reads, a concrete array) gets none.
Left inside the step, a closed-over array would be a constant of each
loop body the step is traced into, which XLA copies into each. Only
inexact leaves are differentiated: integer parts of the carry, `xs` or the
outputs ride along and get no cotangent.

Refs the step closes over are read once before the loop; their values ride
in the carry, so a snapshot holds them and the recompute writes nowhere,
and the final values are written back once (effects run once, as in
``lax.scan``).

Both loops have fixed trip counts, so the backward pass can itself be
differentiated (``grad`` of ``grad``). Forward-mode (``jax.jvp`` of the
scan itself) is not available, as for any ``custom_vjp`` function;
forward-over-reverse (``jvp`` of ``grad``) is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine import revolve
from remat_explorer.engine.introspect import RECOMPUTE_SCOPE, branch_runs_scope
from remat_explorer.engine.refs import step_on_ref_values

tree_map = jax.tree_util.tree_map


def revolve_scan(f, init, xs, n: int, s: int, *, reverse: bool, unroll, scope: str):
  """``lax.scan(f, init, xs, length=n, reverse=reverse)``, differentiated
  by Griewank's schedule holding at most `s` carries (`n >= 1`). `scope`
  names the backward pass's loop as the forward's is named."""
  init = tree_map(jnp.asarray, init)  # Python scalars become arrays with a shape
  x_example = tree_map(lambda a: a[0], xs)
  refs, on_values = step_on_ref_values(f, init, x_example)
  if refs:
    return _on_ref_values(refs, on_values, init, xs, n, s, reverse=reverse,
                          unroll=unroll, scope=scope)
  step, consts, data = _hoisted(f, init, x_example)
  schedule = _Schedule(step, n, s, reverse, unroll, scope)

  @jax.custom_vjp
  def scan(consts, data, init, xs):
    return lax.scan(lambda c, x: step(c, x, *consts, *data), init, xs, length=n,
                    reverse=reverse, unroll=unroll)

  scan.defvjp(schedule.forward, schedule.backward)
  return scan(consts, data, init, xs)


def _hoisted(f, init, x_example):
  """``(step, consts, data)``: `f` as ``step(carry, x, *consts, *data)``,
  every array it closes over an argument. `consts` are those the
  differentiation may perturb (traced, inexact: ``jax.closure_convert``
  hoists these alone), `data` every other (concrete arrays, integers)."""
  closed, out_shape = jax.make_jaxpr(f, return_shape=True)(init, x_example)
  out_tree = jax.tree_util.tree_structure(out_shape)
  perturbed = [isinstance(c, jx.core.Tracer) and jnp.issubdtype(jnp.result_type(c), jnp.inexact)
               for c in closed.consts]
  data, consts = jx.partition_list(perturbed, closed.consts)
  order = perturbed  # the jaxpr takes its constants in their own order

  def step(carry, x, *args):
    given, rest = list(args[:len(consts)]), list(args[len(consts):])
    outs = jx.core.eval_jaxpr(closed.jaxpr, jx.merge_lists(order, rest, given),
                              *jax.tree_util.tree_leaves((carry, x)))
    return jax.tree_util.tree_unflatten(out_tree, outs)
  return step, consts, data


def _on_ref_values(refs, on_values, init, xs, n, s, **options):
  """The loop of a step that closes over `refs`: their values ride in the
  carry (so each snapshot holds them and the recompute starts from what the
  forward pass saw, writing nowhere), and the final values are written back
  once. Refs are not differentiated, as in ``lax.scan``."""
  def step(carry_and_values, x):
    carry, values = carry_and_values
    new, y, values = on_values(carry, x, values)
    return (new, [lax.stop_gradient(v) for v in values]), y

  values = [lax.stop_gradient(ref[...]) for ref in refs]
  (carry, values), ys = revolve_scan(step, (init, values), xs, n, s, **options)
  for ref, value in zip(refs, values):
    ref[...] = lax.stop_gradient(value)
  return carry, ys


class _Schedule:
  """The forward and backward passes of one ``revolve_scan``."""

  def __init__(self, step, n, s, reverse, unroll, scope):
    self.step, self.n, self.s = step, n, s
    self.reverse, self.unroll, self.scope = reverse, unroll, scope
    self.slots = revolve.slots_needed(n, s)
    self.table = revolve.binomial_table(n, s)

  def row(self, pos):
    """The row of `xs` and of the outputs that step `pos` uses."""
    return self.n - 1 - pos if self.reverse else pos

  def linearized(self, consts, data, carry, x):
    """``(new carry, y, vjp)`` of one step; `vjp` maps the cotangents of the
    inexact leaves of (new carry, y) to those of (consts, carry, x)."""
    carry_d, carry_rest = _inexact(carry)
    x_d, x_rest = _inexact(x)

    def differentiable(consts, carry_d, x_d):
      out = self.step(carry_rest.merge(carry_d), x_rest.merge(x_d), *consts, *data)
      out_d, out_rest = _inexact(out)
      return out_d, out_rest

    out_d, vjp, out_rest = jax.vjp(differentiable, consts, carry_d, x_d, has_aux=True)
    new, y = out_rest.merge(out_d)
    return new, y, vjp

  # -- forward pass ------------------------------------------------------------

  def forward(self, consts, data, init, xs):
    # Through a barrier the data is no constant to XLA, which would copy a
    # constant into each loop body that reads it (the forward and backward
    # loops): one copy stands, read in place by both.
    data = lax.optimization_barrier(data)
    table = jnp.asarray(self.table)
    ctrl = revolve.start(self.n, self.s, self.slots, table, jnp)
    snapshots = tree_map(lambda a: jnp.zeros((self.slots,) + a.shape, a.dtype).at[0].set(a),
                         init)
    _, y_shape = jax.eval_shape(lambda c, x: self.step(c, x, *consts, *data), init,
                                tree_map(lambda a: a[0], xs))
    ys = tree_map(lambda a: jnp.zeros((self.n,) + a.shape, a.dtype), y_shape)

    def advance(state, _):
      carry, ctrl, snapshots, ys = state
      new, y = self.step(carry, _read(xs, self.row(ctrl.pos)), *consts, *data)
      ys = _write(ys, self.row(ctrl.pos), y)
      ctrl, store, slot = revolve.after_advance(ctrl, self.s, table, jnp)
      return (new, ctrl, _store(snapshots, slot, new, store), ys), None

    (carry, ctrl, snapshots, ys), _ = lax.scan(
        advance, (init, ctrl, snapshots, ys), length=self.n - 1, unroll=self.unroll)
    # The last step's VJP comes first: linearize it now rather than again.
    final, y, last_vjp = self.linearized(consts, data, carry, _read(xs, self.row(self.n - 1)))
    ys = _write(ys, self.row(self.n - 1), y)
    return (final, ys), (consts, data, xs, snapshots, ctrl, last_vjp)

  # -- backward pass -----------------------------------------------------------

  def backward(self, residuals, cotangents):
    with jax.named_scope(self.scope):
      return self._backward(residuals, cotangents)

  def _backward(self, residuals, cotangents):
    consts, data, xs, snapshots, ctrl, last_vjp = residuals
    ct_final, ct_ys = cotangents
    table = jnp.asarray(self.table)
    ct_carry = _inexact(ct_final)[0]
    ct_xs = tree_map(jnp.zeros_like, _inexact(xs)[0])
    g_consts, ct_carry, g_x = last_vjp(self._output_cotangent(ct_carry, ct_ys, self.n - 1))
    ct_xs = _write(ct_xs, self.row(self.n - 1), g_x)
    ctrl, slot = revolve.after_vjp(ctrl, self.s, table, jnp)
    carry = _read(snapshots, slot)
    # Every step but the last is reversed in the loop, once.
    turns = revolve.backward_turns(self.n, self.s)

    def turn(state, _):
      carry, ctrl, snapshots, ct_carry, g_consts, ct_xs = state
      with jax.named_scope(RECOMPUTE_SCOPE):
        new, _, vjp = self.linearized(consts, data, carry, _read(xs, self.row(ctrl.pos)))
      reversing = ctrl.pos + 1 == ctrl.target

      def reverse_step(ct_carry, g_consts):
        dg_consts, ct_carry, g_x = vjp(self._output_cotangent(ct_carry, ct_ys, ctrl.pos))
        return ct_carry, tree_map(jnp.add, g_consts, dg_consts), g_x

      def keep(ct_carry, g_consts):
        return ct_carry, g_consts, tree_map(lambda a: jnp.zeros(a.shape[1:], a.dtype), ct_xs)

      # Which turns reverse is known here, not to XLA: the scope says how
      # often each branch runs (`keep` is branch 0), so the compiled
      # program's FLOPs can be counted exactly.
      with jax.named_scope(branch_runs_scope((turns - (self.n - 1), self.n - 1))):
        ct_carry, g_consts, g_x = lax.cond(reversing, reverse_step, keep, ct_carry, g_consts)
      # Rows below the cotangent's position are still zero: writing a zero
      # row while advancing changes nothing.
      ct_xs = _write(ct_xs, self.row(ctrl.pos), g_x)
      advanced, store, store_slot = revolve.after_advance(ctrl, self.s, table, jnp)
      snapshots = _store(snapshots, store_slot, new, store & ~reversing)
      restored, restore_slot = revolve.after_vjp(ctrl, self.s, table, jnp)
      ctrl = _select_control(reversing, restored, advanced)
      carry = tree_map(lambda r, a: jnp.where(reversing, r, a),
                       _read(snapshots, restore_slot), new)
      return (carry, ctrl, snapshots, ct_carry, g_consts, ct_xs), None

    state = (carry, ctrl, snapshots, ct_carry, g_consts, ct_xs)
    (_, _, _, ct_init, g_consts, ct_xs), _ = lax.scan(
        turn, state, length=turns, unroll=self.unroll)
    return (g_consts, None, _inexact(snapshots)[1].cotangent_tree(ct_init),
            _inexact(xs)[1].cotangent_tree(ct_xs))

  def _output_cotangent(self, ct_carry, ct_ys, pos):
    """What `vjp` takes: the carry's cotangent, then row `pos` of the outputs'
    (their inexact leaves, in the order of ``(carry, y)``'s leaves)."""
    return [*ct_carry, *_read(_inexact(ct_ys)[0], self.row(pos))]


# -- pytrees split into inexact leaves and the rest ---------------------------------

class _Rest:
  """A pytree with its inexact leaves taken out (see ``_inexact``)."""

  def __init__(self, leaves, tree, mask):
    self.leaves, self.tree, self.mask = leaves, tree, mask

  def merge(self, inexact):
    """The pytree, with `inexact` (a list) put back in place."""
    inexact = iter(inexact)
    return self.tree.unflatten([next(inexact) if m else leaf
                                for leaf, m in zip(self.leaves, self.mask)])

  def cotangent_tree(self, inexact):
    """The pytree's cotangent: `inexact` in place, None (a zero) elsewhere."""
    inexact = iter(inexact)
    return self.tree.unflatten([next(inexact) if m else None for m in self.mask])


def _inexact(tree):
  """``(inexact leaves as a list, _Rest)``: what is differentiated, and what not."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  mask = [jnp.issubdtype(jnp.result_type(leaf), jnp.inexact) for leaf in leaves]
  return [leaf for leaf, m in zip(leaves, mask) if m], _Rest(leaves, treedef, mask)


# -- buffers --------------------------------------------------------------------------

def _read(buffers, index):
  return tree_map(lambda a: lax.dynamic_index_in_dim(a, index, keepdims=False), buffers)


def _write(buffers, index, rows):
  return tree_map(lambda a, r: lax.dynamic_update_index_in_dim(a, r.astype(a.dtype), index, 0),
                  buffers, rows)


def _store(snapshots, slot, carry, store):
  """`carry` into `slot` where `store`, else that slot as it was."""
  kept = _read(snapshots, slot)
  return _write(snapshots, slot, tree_map(lambda new, old: jnp.where(store, new, old),
                                          carry, kept))


def _select_control(pred, when_true, when_false):
  return revolve.Control(*(jnp.where(pred, a, b) for a, b in zip(when_true, when_false)))
