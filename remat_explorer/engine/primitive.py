"""The ``checkpoint`` primitive and its transformation rules.

A checkpointed block is staged out as one equation, ``checkpoint``, holding
the block's jaxpr. Evaluating it just runs the jaxpr; the interesting rules
are the ones differentiation uses:

* JVP keeps the block a block: the JVP of the body becomes the body of a new
  ``checkpoint`` equation, so the remat decision is taken later, once we know
  which values are tangents.
* Partial evaluation (reverse mode) splits the body with ``split_jaxpr``: the
  known part runs now and keeps only what the policy allows; the rest is
  staged as a new ``checkpoint`` equation, marked ``differentiated``, that
  recomputes what was not kept.
* Lowering protects a differentiated block from XLA, so it can neither hoist
  the recompute into the forward pass nor merge it with the forward
  computation (``lowering.py`` has the strategies).

The rules follow the order a value flows through them: bind, impl, abstract
eval, JVP, partial eval, transpose, vmap, DCE, lowering, state discharge.
"""

from __future__ import annotations

import logging

from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine.introspect import RECOMPUTE_SCOPE
from remat_explorer.engine.lowering import DEFAULT_STRATEGY, lower_checkpoint
from remat_explorer.engine.observe import note_derived, note_split
from remat_explorer.engine.policies import checked_policy
from remat_explorer.engine.refs import DEFAULT_REF_EFFECTS
from remat_explorer.engine.residuals import log_residuals
from remat_explorer.engine.split import split_jaxpr

core, pe, ad, batching, mlir = jx.core, jx.pe, jx.ad, jx.batching, jx.mlir

jx.hide_frames_of(__file__)
logger = logging.getLogger('remat_explorer.engine')

checkpoint_p = core.Primitive('checkpoint')
checkpoint_p.multiple_results = True


# -- bind ---------------------------------------------------------------------

def _bind(*args, jaxpr, prevent_cse, differentiated, policy,
          lowering=DEFAULT_STRATEGY, ref_effects=DEFAULT_REF_EFFECTS):
  """Bind with the parameters every rule expects.

  `jaxpr` is closed-over-nothing: constants are ordinary leading inputs.
  `prevent_cse` is a bool, or one bool per input. `differentiated` is True
  for the staged (backward) copy that recomputes the forward values.
  `lowering` says how that copy is protected from XLA (see ``lowering``).
  `ref_effects` says whether that copy re-performs writes to refs passed to
  the block (see ``refs``).
  """
  assert not jaxpr.constvars
  assert isinstance(prevent_cse, bool) or len(prevent_cse) == len(args)
  return core.Primitive.bind(checkpoint_p, *args, jaxpr=jaxpr,
                             prevent_cse=prevent_cse,
                             differentiated=differentiated, policy=policy,
                             lowering=lowering, ref_effects=ref_effects)

checkpoint_p.bind = _bind


def _derived_prevent_cse(prevent_cse, *, keep=None, before=(), after=()):
  """`prevent_cse` for a block whose inputs derive from another block's.

  Every rule below binds a new block whose inputs are some of the old ones
  (those marked in `keep`, all by default) with new inputs before or after
  them. A bool covers any inputs and is passed on as it is; per-input flags
  follow their inputs, and the new inputs get the flags in `before` and
  `after`.
  """
  if isinstance(prevent_cse, bool):
    return prevent_cse
  if keep is not None:
    prevent_cse = [flag for flag, kept in zip(prevent_cse, keep) if kept]
  return (*before, *prevent_cse, *after)


def _bind_on(body, args, *, prevent_cse, derived_from=None, **params):
  """Bind a block running `body` on `args`; return its outputs.

  The rules below derive a block from another by transforming its body
  (JVP, batching, transposition), and JAX hands back the transformed body
  closed over constants of its own. A block's body closes over nothing, so
  those constants become its leading inputs; they come from the rule, not
  from the user's program, and are left unprotected. `prevent_cse` covers
  `args`. `derived_from` is the body the new one derives from, for
  ``observe_splits``.
  """
  jaxpr = pe.convert_constvars_jaxpr(body.jaxpr)
  if derived_from is not None:
    note_derived(jaxpr, derived_from)
  prevent_cse = _derived_prevent_cse(prevent_cse, before=(False,) * len(body.consts))
  return checkpoint_p.bind(*body.consts, *args, jaxpr=jaxpr,
                           prevent_cse=prevent_cse, **params)


# -- impl and abstract eval ---------------------------------------------------

@checkpoint_p.def_impl
def _impl(*args, jaxpr, **params):
  del params  # only matter to transformations
  return core.eval_jaxpr(jaxpr, (), *args)


@checkpoint_p.def_effectful_abstract_eval
def _abstract_eval(*args, jaxpr, **params):
  del args, params
  return [v.aval for v in jaxpr.outvars], jx.positional_effects(jaxpr)


# -- JVP ----------------------------------------------------------------------

def _jvp(primals, tangents, *, jaxpr, prevent_cse, **params):
  """The JVP of a block is one block: primals and tangents in, primals and
  tangents out, its body the JVP of the body.

  Symbolic zero tangents are not passed in, and the body says which output
  tangents are symbolically zero; those are not computed, but made here.
  """
  has_tangent = [not _is_symbolic_zero(t) for t in tangents]
  body, out_has_tangent = ad.jvp_jaxpr(pe.close_jaxpr(jaxpr), has_tangent, False)
  given = [t for t in tangents if not _is_symbolic_zero(t)]
  # The recompute reads the tangents as it reads the primals: protect them.
  outs = _bind_on(body, [*primals, *given], derived_from=jaxpr,
                  prevent_cse=_derived_prevent_cse(prevent_cse, after=(True,) * len(given)),
                  **params)
  out_primals, computed_tangents = jx.split_list(outs, [len(jaxpr.outvars)])
  zero_tangents = [jx.ad_util.p2tz(primal) for primal, has
                   in zip(out_primals, out_has_tangent) if not has]
  return out_primals, jx.merge_lists(out_has_tangent, zero_tangents, computed_tangents)


def _is_symbolic_zero(value) -> bool:
  return isinstance(value, jx.ad_util.Zero)

ad.primitive_jvps[checkpoint_p] = _jvp


# -- partial eval: the known/staged split --------------------------------------

def _partial_eval(trace, *tracers, jaxpr, prevent_cse, **params):
  """Run the known part of the block now; stage the rest for later."""
  _check_effects_can_be_split(jaxpr)
  in_unknowns = [not t.is_known() for t in tracers]
  split = split_jaxpr(jaxpr, in_unknowns, checked_policy(params['policy']),
                      params['ref_effects'])
  note_split(jaxpr, in_unknowns, split, params)
  known_outs, residuals = _run_forward_pass(split, tracers)

  staged_tracers = [t for t, used in zip(tracers, split.staged_inputs_used) if used]
  # Residuals are what the recompute starts from: protect them too.
  prevent_cse = _derived_prevent_cse(
      prevent_cse, keep=split.staged_inputs_used,
      before=(True,) * split.num_residuals)
  staged_params = dict(params, jaxpr=split.staged, prevent_cse=prevent_cse,
                       differentiated=True)
  out_tracers = _stage(trace, split.staged, staged_params,
                       [*map(trace.new_instantiated_const, residuals),
                        *map(trace.instantiate_const, staged_tracers)])
  _log_what_is_saved(split, in_unknowns)
  return jx.merge_lists(list(split.out_unknowns), known_outs, out_tracers)


def _run_forward_pass(split, tracers):
  """Evaluate the known jaxpr on the known inputs it reads: the block's
  known outputs, and the residuals."""
  known_values = [t.pval.get_known() for t in tracers if t.pval.is_known()]
  read = [v for v, used in zip(known_values, split.known_inputs_used) if used]
  outs_then_residuals = core.eval_jaxpr(split.known, (), *read)
  return jx.split_list(outs_then_residuals,
                       [len(outs_then_residuals) - split.num_residuals])


def _log_what_is_saved(split, in_unknowns):
  # A warning when JAX's `jax_log_checkpoint_residuals` is on, as for
  # `jax.checkpoint`; otherwise a debug message.
  level = logging.WARNING if jx.log_checkpoint_residuals_enabled() else logging.DEBUG
  if logger.isEnabledFor(level):
    staged_unknowns = [u for u, used in zip(in_unknowns, split.staged_inputs_used) if used]
    log_residuals(level, logger, split, staged_unknowns)


def _stage(trace, jaxpr, params, in_tracers):
  """Record one `checkpoint` equation on `trace`; return its outputs."""
  out_tracers = [pe.JaxprTracer(trace, pe.PartialVal.unknown(v.aval), None)
                 for v in jaxpr.outvars]
  recipe = pe.new_eqn_recipe(
      trace, in_tracers, out_tracers, checkpoint_p, params,
      jx.positional_effects(jaxpr), jx.source_info_util.current())
  for t in out_tracers:
    t.recipe = recipe
  return out_tracers

pe.custom_partial_eval_rules[checkpoint_p] = _partial_eval


def _check_effects_can_be_split(jaxpr):
  disallowed = jx.effects_remat_disallows(jaxpr.effects)
  if disallowed:
    names = ', '.join(sorted({type(e).__name__ for e in disallowed}))
    # Matches JAX's wording on purpose: code that catches JAX's error by its
    # message catches ours too (tests/test_composition.py checks the prefix).
    raise NotImplementedError(
        'Effects not supported in partial-eval of `checkpoint`/`remat`: '
        f'{names} ({disallowed}). Move the effectful operation out of the checkpointed '
        'function, or use an effect that is allowed under remat '
        '(e.g. jax.debug.callback).')


def _partial_eval_custom_params(unks_in, inst_in, kept_outs_known, inst_out,
                                num_res, params_known, params_staged):
  """Parameters of the two halves when a checkpoint is split from outside.

  This happens when the block sits inside another block being split, or in
  a `scan`/`jit` body that is: the outer policy decides, and the staged half
  becomes a differentiated (recomputing) checkpoint.
  """
  del kept_outs_known, inst_out, num_res
  prevent_cse = params_known['prevent_cse']
  known_cse = _derived_prevent_cse(prevent_cse, keep=[not u for u in unks_in])
  staged_cse = _derived_prevent_cse(prevent_cse, keep=inst_in)
  return (dict(params_known, prevent_cse=known_cse),
          dict(params_staged, prevent_cse=staged_cse, differentiated=True))

def _partial_eval_custom(saveable, unks_in, inst_in, eqn, **kwargs):
  """JAX's rule for a call split from outside, noting that the staged half's
  body derives from the block's: when the backward pass later splits that
  half with the block's own policy (``_transpose`` of the enclosing block),
  the split is recorded as this block's."""
  eqn_known, eqn_staged, *rest = pe.call_partial_eval_custom_rule(
      'jaxpr', _partial_eval_custom_params, saveable, unks_in, inst_in, eqn,
      **kwargs)
  if eqn_staged is not None:
    note_derived(eqn_staged.params['jaxpr'], eqn.params['jaxpr'])
  return (eqn_known, eqn_staged, *rest)

pe.partial_eval_jaxpr_custom_rules[checkpoint_p] = _partial_eval_custom


# -- transpose ----------------------------------------------------------------

def _transpose(out_cts, *args, jaxpr, prevent_cse, **params):
  """Transpose a linear block into another checkpoint over the cotangents.

  The block's non-linear part (the recompute) is evaluated inside the new
  block, so it still happens on the backward pass, behind the same barrier.
  """
  accumulators = [x for x in args if isinstance(x, ad.GradAccum)]
  args = [ad.UndefinedPrimal(x.aval) if isinstance(x, ad.GradAccum) else x
          for x in args]
  in_linear = tuple(ad.is_undefined_primal(x) for x in args)
  out_zeros = tuple(_is_symbolic_zero(ct) for ct in out_cts)
  transposed, in_cts_are_zero = _transposed_jaxpr(
      pe.close_jaxpr(jaxpr), in_linear, out_zeros)
  nonlinear_args = [x for x, lin in zip(args, in_linear) if not lin]
  nonzero_cts = [ct for ct, zero in zip(out_cts, out_zeros) if not zero]
  prevent_cse = _derived_prevent_cse(
      prevent_cse, keep=[not lin for lin in in_linear],
      after=(True,) * len(nonzero_cts))
  in_cts = _bind_on(transposed, [*nonlinear_args, *nonzero_cts],
                    prevent_cse=prevent_cse, **params)
  in_cts = iter(in_cts)
  for accumulator, is_zero in zip(accumulators, in_cts_are_zero):
    if not is_zero:
      accumulator.accum(next(in_cts))


@jx.weakref_lru_cache
def _transposed_jaxpr(closed_jaxpr, in_linear, out_zeros):
  """The transposed block and, per linear input, whether its cotangent is a
  symbolic zero (only the nonzero ones are outputs).

  Its inputs are the non-linear inputs, then the nonzero output cotangents.
  Inside, the non-linear part is recomputed first; the linear rest, which
  reads what the recompute produced, is then transposed. JAX's
  ``backward_pass`` takes only linear equations (other values come in as
  given inputs), so the body is first cut in two with
  ``partial_eval_jaxpr_nounits``, and only the linear part goes through it.
  """
  # Splitting is jaxpr work, done once here rather than while tracing. JAX's
  # ref checks (no ref returned, no aliasing) are off for it, as in JAX's own
  # remat: with refs in the body, a ref can be what one part hands the other.
  with jx.config.mutable_array_checks(False):
    recompute, linear, _, _ = pe.partial_eval_jaxpr_nounits(
        closed_jaxpr, in_linear, False)
  num_nonlinear = in_linear.count(False)
  ct_avals = [a.to_ct_aval() for a in closed_jaxpr.out_avals]
  zero_input_cts = []  # filled in while tracing

  def nonzero_input_cts(*inputs):
    nonlinear_args, nonzero_out_cts = inputs[:num_nonlinear], inputs[num_nonlinear:]
    with jx.source_info_util.extend_name_stack(RECOMPUTE_SCOPE):
      recomputed = core.jaxpr_as_fun(recompute)(*nonlinear_args)
    out_cts = _with_symbolic_zeros(nonzero_out_cts, out_zeros, ct_avals)
    in_cts = _backward_pass(linear, recomputed, out_cts)
    zero_input_cts[:] = [isinstance(ct, jx.ad_util.Zero) for ct in in_cts]
    return [ct for ct in in_cts if not isinstance(ct, jx.ad_util.Zero)]

  input_avals = (
      [a for a, lin in zip(closed_jaxpr.in_avals, in_linear) if not lin]
      + [a for a, zero in zip(ct_avals, out_zeros) if not zero])
  traced, _ = pe.trace_to_jaxpr(
      nonzero_input_cts, jx.flat_tree((tuple(input_avals), {})),
      closed_jaxpr.jaxpr.debug_info.with_unknown_names())
  return traced, list(zero_input_cts)


def _with_symbolic_zeros(nonzero_cts, is_zero, ct_avals):
  """All output cotangents, a symbolic zero where none was given."""
  given = iter(nonzero_cts)
  return [jx.ad_util.Zero(aval) if zero else next(given)
          for aval, zero in zip(ct_avals, is_zero)]


def _backward_pass(linear, recomputed, out_cts):
  """Cotangents of the linear inputs of `linear`, whose leading inputs take
  the recomputed values."""
  num_recomputed = len(recomputed)
  undefined = [ad.UndefinedPrimal(a.to_ct_aval())
               for a in linear.in_avals[num_recomputed:]]
  in_cts = ad.backward_pass(linear.jaxpr, False, linear.consts,
                            [*recomputed, *undefined], out_cts)
  return in_cts[num_recomputed:]

ad.fancy_transposes[checkpoint_p] = _transpose


# -- vmap ---------------------------------------------------------------------

def _vmap(axis_data, args, dims, *, jaxpr, **params):
  """The batched block is one block running the batched body, so what it
  saves is still decided when it is differentiated. Each output the body
  batches has its batch axis first; the others are not batched."""
  batch_axis_first = [batching.zero_if_mapped] * len(jaxpr.outvars)
  body, out_batched = batching.batch_jaxpr_axes(
      pe.close_jaxpr(jaxpr), axis_data, dims, batch_axis_first)
  outs = _bind_on(body, args, derived_from=jaxpr, **params)
  return outs, [0 if batched else None for batched in out_batched]

batching.fancy_primitive_batchers[checkpoint_p] = _vmap


# -- DCE ----------------------------------------------------------------------

def _dce(used_outputs, eqn):
  """Drop unused outputs, and the inputs and work only they needed.

  A block none of whose outputs is used goes away only if that cannot be
  observed. One with a real effect, such as a ``jax.debug.callback``, stays
  and runs, whether or not the effect reads the block's inputs: the same
  rule as for a call (``jit``) or for code outside any remat. JAX 0.10.2's
  rule differs here: it drops the block when the effect reads none of the
  block's inputs (see "Deliberate differences" in docs/pages/matches_jax_checkpoint.md).
  """
  if not any(used_outputs) and not pe.has_effects(eqn):
    return [False] * len(eqn.invars), None
  body, used_inputs = pe.dce_jaxpr(eqn.params['jaxpr'], used_outputs)
  unobservable = not (any(used_outputs) or any(used_inputs)
                      or _has_real_effects(body))
  if unobservable:
    return used_inputs, None
  return used_inputs, _pruned(eqn, body, used_inputs, used_outputs)


def _has_real_effects(jaxpr) -> bool:
  # Axis names and refs allocated inside the block are not observable.
  bookkeeping = (core.NamedAxisEffect, core.InternalMutableArrayEffect)
  return any(not isinstance(e, bookkeeping) for e in jaxpr.effects)


def _pruned(eqn, body, used_inputs, used_outputs):
  """`eqn` running `body`, with only the used inputs and outputs."""
  note_derived(body, eqn.params['jaxpr'])
  invars = [v for v, used in zip(eqn.invars, used_inputs) if used]
  outvars = [v for v, used in zip(eqn.outvars, used_outputs) if used]
  prevent_cse = _derived_prevent_cse(eqn.params['prevent_cse'], keep=used_inputs)
  params = dict(eqn.params, jaxpr=body, prevent_cse=prevent_cse)
  return pe.new_jaxpr_eqn(invars, outvars, checkpoint_p, params,
                          jx.equation_effects(body, invars), eqn.source_info, eqn.ctx)

pe.dce_rules[checkpoint_p] = _dce


# -- lowering -----------------------------------------------------------------

mlir.register_lowering(checkpoint_p, lower_checkpoint)


# -- state discharge ----------------------------------------------------------

def _discharge_state(in_avals, out_avals, *args, jaxpr, **params):
  """The block run on the values its ref inputs hold instead of the refs.

  Its body, discharged, takes each ref's value where it took the ref, and
  returns after the block's outputs the value each ref ends with. What the
  rule gives back is fixed by JAX's discharge: each input's new value, then
  the block's outputs.
  """
  del out_avals
  outs_and_final_values = checkpoint_p.bind(*args, jaxpr=_discharged_body(jaxpr),
                                            **params)
  outs, final_values = jx.split_list(outs_and_final_values, [len(jaxpr.outvars)])
  return _new_input_values(in_avals, final_values), outs


jx.register_discharge_rule(checkpoint_p, _discharge_state)


def _new_input_values(in_avals, final_ref_values) -> list:
  """Per input of the block, what it holds afterwards: a ref, its final
  value (they come in input order); any other input, None (unchanged)."""
  is_ref = [isinstance(aval, jx.AbstractRef) for aval in in_avals]
  unchanged = [None] * is_ref.count(False)
  return jx.merge_lists(is_ref, unchanged, final_ref_values)


def _discharged_body(jaxpr):
  discharged = jx.discharged(core.ClosedJaxpr(jaxpr, []))
  if discharged.consts:
    raise NotImplementedError(
        'checkpoint: discharging refs produced constants in the block body; '
        'this is not supported.')
  return discharged.jaxpr


# -- high-level (hijax) types -------------------------------------------------
#
# A block whose body uses high-level types is rewritten into one over their
# low-level representations before anything else sees it.

def _is_high(*_, jaxpr, **__) -> bool:
  return jaxpr.is_high

checkpoint_p.is_high = _is_high


def _to_lojax(*hi_args, jaxpr, **params):
  """The same block over low-level values: its body lowered to low-level
  types, each high-level argument replaced by the values standing for it.

  `prevent_cse` is passed on as it is, as JAX's own rule does: a bool
  covers any inputs, and per-input flags are not regrouped per low-level
  value (nor extended to the lowered body's constants).
  """
  lo_body = pe.lower_jaxpr2(pe.close_jaxpr(jaxpr))
  return checkpoint_p.bind(*lo_body.consts, *_lo_args(jaxpr, hi_args),
                           jaxpr=pe.convert_constvars_jaxpr(lo_body.jaxpr),
                           **params)


def _lo_args(jaxpr, hi_args) -> list:
  """The low-level values standing for `hi_args`, in order: a value with
  mutable state (qdd) gives its current state; any other, its lowering."""
  return [lo for aval, x in zip(jaxpr.in_aval_qdds, hi_args)
          for lo in (aval.read_loval(x) if aval.has_qdd else aval.lower_val(x))]

checkpoint_p.to_lojax = _to_lojax
