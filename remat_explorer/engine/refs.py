"""Mutable references (``jax.Ref``) in checkpointed blocks.

A block meets refs in two ways.

* Refs it allocates itself (``jax.new_ref`` inside the block) cannot be seen
  from outside, so the block is pure. Before splitting, their reads and
  writes are discharged into ordinary values (``discharge_internal_refs``),
  which partial evaluation handles like any other computation.
* Refs passed in, as arguments or closed over, are the program's state: their
  reads and writes are effects, and the recompute raises the question of
  whether they happen again. ``ref_effects`` answers it:

  - ``"once"`` (the default): the forward pass performs the effects. The
    value each ref holds when the block starts is saved as a residual, and
    the recompute runs on a fresh, private ref initialised from it, so it
    sees what the forward pass saw and its writes go nowhere
    (``recompute_from_saved_ref_values``).
  - ``"replay"``: the recompute runs on the real refs and performs the writes
    again, writing what it recomputes, or what the policy saved (so under
    ``everything_saveable`` a replayed ``r[...] += 1`` rewrites the value the
    forward pass wrote rather than incrementing twice). Sound only when no value the block reads from a ref it writes
    reaches the block's outputs (``check_replay_is_sound``); otherwise the
    recompute would differentiate at the state the forward pass left behind.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax

from remat_explorer.engine import _jax_internals as jx

core = jx.core

REF_EFFECTS = ('once', 'replay')
DEFAULT_REF_EFFECTS = 'once'


def check_ref_effects(ref_effects) -> None:
  if ref_effects not in REF_EFFECTS:
    raise ValueError(
        f'`ref_effects` must be one of {", ".join(map(repr, REF_EFFECTS))}, '
        f'got {ref_effects!r}. "once" performs the writes to refs passed to '
        'the block on the forward pass only; "replay" performs them again '
        'when the backward pass recomputes the block.')


def discharge_internal_refs(jaxpr: core.Jaxpr) -> core.Jaxpr:
  """Turn refs that the block allocates itself into plain values."""
  if core.internal_mutable_array_effect not in jaxpr.effects:
    return jaxpr
  closed = jx.discharged(core.ClosedJaxpr(jaxpr, []), should_discharge=False)
  if closed.consts:  # not expected: discharge only rewrites equations
    return jaxpr
  return closed.jaxpr


# -- ref_effects="once" -------------------------------------------------------

def recompute_from_saved_ref_values(split, in_avals, in_unknowns):
  """Rewrite a ``Split`` so that the recompute never touches a ref input.

  The known jaxpr also returns, as extra residuals after the others, the
  value of each ref input the staged jaxpr reads, read before anything else
  happens. The staged jaxpr takes those values instead of the refs and
  copies each into a fresh ref of its own.
  """
  captured = [i for i, (aval, unknown, used) in enumerate(
                  zip(in_avals, in_unknowns, split.staged_inputs_used))
              if isinstance(aval, jx.AbstractRef) and not unknown and used]
  if not captured:
    return split
  dbg = split.known.debug_info.with_unknown_names()

  known_positions = [i for i, unknown in enumerate(in_unknowns) if not unknown]
  known_used = [used or i in captured
                for i, used in zip(known_positions, split.known_inputs_used)]
  known_in = [i for i, used in zip(known_positions, known_used) if used]
  old_known_in = [i for i, used in zip(known_positions, split.known_inputs_used)
                  if used]

  first_use = _first_use_of_inputs(split, old_known_in, captured)

  def known_then_ref_values(*args):
    by_position = dict(zip(known_in, args))
    # Read first: the known jaxpr may write to these refs. Each read takes
    # the source line of the block's first use of its ref, so residual
    # reports point at the user's code rather than at this module.
    initial_values = []
    for i in captured:
      with jx.source_info_of(first_use[i]) if first_use[i] else contextlib.nullcontext():
        initial_values.append(by_position[i][...])
    outs = core.eval_jaxpr(split.known, (), *(by_position[i] for i in old_known_in))
    return [*outs, *initial_values]

  staged_in = [i for i, used in enumerate(split.staged_inputs_used) if used]
  still_staged = [i for i in staged_in if i not in captured]
  num_res = split.num_residuals

  def staged_on_fresh_refs(*args):
    residuals, initial_values, rest = jx.split_list(args, [num_res, len(captured)])
    by_position = dict(zip(still_staged, rest))
    by_position.update(
        (i, core.new_ref(v)) for i, v in zip(captured, initial_values))
    return core.eval_jaxpr(split.staged, (), *residuals,
                           *(by_position[i] for i in staged_in))

  known = _trace(known_then_ref_values, [in_avals[i] for i in known_in], dbg)
  staged = _trace(
      staged_on_fresh_refs,
      [*split.residual_avals, *(in_avals[i].inner_aval for i in captured),
       *(in_avals[i] for i in still_staged)], dbg)
  # The fresh refs are private to the recompute: make them plain values, and
  # drop the writes nothing reads any more.
  staged = discharge_internal_refs(staged)
  staged, _ = jx.pe.dce_jaxpr(staged, [True] * len(staged.outvars),
                              instantiate=True)
  return dataclasses.replace(
      split, known=known, staged=staged, num_residuals=num_res + len(captured),
      known_inputs_used=tuple(known_used),
      staged_inputs_used=tuple(used and i not in captured for i, used
                               in enumerate(split.staged_inputs_used)))


def _first_use_of_inputs(split, known_in, positions) -> dict:
  """For each block input at `positions`, the first equation of the known
  (else the staged) jaxpr that reads it, or None."""
  staged_in = [i for i, used in enumerate(split.staged_inputs_used) if used]
  variables = {}
  for i in positions:
    variables[i] = []
    if i in known_in:
      variables[i].append(split.known.invars[known_in.index(i)])
    if i in staged_in:
      variables[i].append(split.staged.invars[split.num_residuals + staged_in.index(i)])
  first = {}
  for i, wanted in variables.items():
    first[i] = next((e for jaxpr in (split.known, split.staged) for e in jaxpr.eqns
                     if any(v in wanted for v in e.invars if isinstance(v, core.Var))),
                    None)
  return first


def _trace(fun, in_avals, dbg) -> core.Jaxpr:
  closed, _ = jx.pe.trace_to_jaxpr(
      fun, jx.flat_tree((tuple(in_avals), {})), dbg)
  assert not closed.consts, 'rewriting a split introduced constants'
  return closed.jaxpr


# -- ref_effects="replay" -----------------------------------------------------

def check_replay_is_sound(jaxpr: core.Jaxpr, fun_name: str) -> None:
  """Refuse ``replay`` when the recompute would read state the forward wrote.

  A value read from a ref that the block writes, if it reaches an output,
  differs between the forward pass and a replayed recompute (which starts
  after the forward pass's writes), so the gradient would be taken at the
  wrong point: a silently wrong answer. Nested calls that receive such a
  ref are assumed to read it.
  """
  written = {jx.ref_written_by(jaxpr, e) for e in jaxpr.effects
             if isinstance(e, (jx.WriteEffect, jx.AccumEffect))}
  if not written:
    return
  depends_on_written = set()
  for eqn in jaxpr.eqns:
    reads = [v for v in eqn.invars if isinstance(v, core.Var)
             and (v in written or v in depends_on_written)]
    if reads:
      depends_on_written.update(eqn.outvars)
  leaked = [i for i, v in enumerate(jaxpr.outvars)
            if isinstance(v, core.Var) and v in depends_on_written]
  if leaked:
    raise ValueError(
        f'checkpoint(..., ref_effects="replay") cannot be honoured for '
        f'{fun_name}: it writes to a ref passed to it, and a value read from '
        f'that ref reaches its output(s) {leaked}. A replayed recompute would '
        'start from the state the forward pass left behind, not the state it '
        'read, so the backward pass would compute the wrong gradient. Use '
        'ref_effects="once" (the default), which recomputes from the saved '
        'initial value, or read the ref outside the checkpointed function.')



# -- refs a loop step closes over ---------------------------------------------

def step_on_ref_values(step, carry, x):
  """``(refs, pure)`` for a loop body ``step(carry, x) -> (carry, y)``.

  `refs` are the refs `step` closes over; ``pure(carry, x, values)`` returns
  ``(carry, y, new_values)``: `step` run on `values` in place of what the refs
  hold, touching no ref. A loop that re-runs steps (the binomial schedule's
  recompute) carries the values instead of the refs, so its recompute sees
  the state the forward pass saw and writes nowhere. `refs` is empty when
  `step` closes over none; `pure` is then None.
  """
  closed, out_shape = jax.make_jaxpr(step, return_shape=True)(carry, x)
  is_ref = [isinstance(jax.typeof(c), jx.AbstractRef) for c in closed.consts]
  if not any(is_ref):
    return [], None
  refs = [c for c, r in zip(closed.consts, is_ref) if r]
  others = [c for c, r in zip(closed.consts, is_ref) if not r]
  # The refs become the first inputs, then discharged into values in and out.
  jaxpr = jx.pe.convert_constvars_jaxpr(closed.jaxpr)
  num_consts = len(closed.consts)
  reordered = ([i for i, r in enumerate(is_ref) if r]
               + [i for i, r in enumerate(is_ref) if not r]
               + list(range(num_consts, len(jaxpr.invars))))
  jaxpr = jaxpr.replace(invars=[jaxpr.invars[i] for i in reordered])
  discharged = jx.discharged(
      core.ClosedJaxpr(jaxpr, []),
      should_discharge=[i < len(refs) for i in range(len(jaxpr.invars))])
  out_tree = jax.tree_util.tree_structure(out_shape)
  num_outs = out_tree.num_leaves

  def pure(carry, x, values):
    args = jax.tree_util.tree_leaves((carry, x))
    outs = core.eval_jaxpr(discharged.jaxpr, discharged.consts, *values, *others, *args)
    new_carry, y = jax.tree_util.tree_unflatten(out_tree, outs[:num_outs])
    return new_carry, y, list(outs[num_outs:num_outs + len(refs)])
  return refs, pure
