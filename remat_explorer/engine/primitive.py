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

import contextlib
import dataclasses
import logging
import threading

from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine.lowering import DEFAULT_STRATEGY, lower_checkpoint
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


# -- impl and abstract eval ---------------------------------------------------

@checkpoint_p.def_impl
def _impl(*args, jaxpr, **params):
  del params  # only matter to transformations
  return core.eval_jaxpr(jaxpr, (), *args)


@checkpoint_p.def_effectful_abstract_eval
def _abstract_eval(*args, jaxpr, **params):
  del args, params
  return [v.aval for v in jaxpr.outvars], core.positional_effects(jaxpr)


# -- JVP ----------------------------------------------------------------------

def _jvp(primals, tangents, *, jaxpr, prevent_cse, **params):
  nonzero = [not isinstance(t, jx.ad_util.Zero) for t in tangents]
  jvp_closed, out_nonzero = ad.jvp_jaxpr(pe.close_jaxpr(jaxpr), nonzero, False)
  jvp_jaxpr = pe.convert_constvars_jaxpr(jvp_closed.jaxpr)
  _note_derived(jvp_jaxpr, jaxpr)
  nonzero_tangents = [t for t, nz in zip(tangents, nonzero) if nz]
  if isinstance(prevent_cse, tuple):
    prevent_cse = ((False,) * len(jvp_closed.consts) + prevent_cse
                   + (True,) * len(nonzero_tangents))
  outs = checkpoint_p.bind(
      *jvp_closed.consts, *primals, *nonzero_tangents, jaxpr=jvp_jaxpr,
      prevent_cse=prevent_cse, **params)
  out_primals, out_nonzero_tangents = jx.split_list(outs, [len(jaxpr.outvars)])
  nonzero_iter = iter(out_nonzero_tangents)
  out_tangents = [next(nonzero_iter) if nz else jx.ad_util.p2tz(p)
                  for p, nz in zip(out_primals, out_nonzero)]
  return out_primals, out_tangents

ad.primitive_jvps[checkpoint_p] = _jvp


# -- partial eval: the known/staged split --------------------------------------

def _partial_eval(trace, *tracers, jaxpr, prevent_cse, **params):
  """Run the known part of the block now; stage the rest for later."""
  _check_effects_can_be_split(jaxpr)
  in_unknowns = [not t.is_known() for t in tracers]
  split = split_jaxpr(jaxpr, in_unknowns, _checked_policy(params['policy']),
                      params['ref_effects'])
  _note_split(jaxpr, in_unknowns, split, params)

  known_values = [t.pval.get_known() for t in tracers if t.pval.is_known()]
  known_values = [v for v, used in zip(known_values, split.known_inputs_used) if used]
  known_outs_and_res = core.eval_jaxpr(split.known, (), *known_values)
  known_outs, residuals = jx.split_list(
      known_outs_and_res, [len(known_outs_and_res) - split.num_residuals])

  staged_tracers = [t for t, used in zip(tracers, split.staged_inputs_used) if used]
  in_tracers = ([trace.new_instantiated_const(r) for r in residuals]
                + [trace.instantiate_const(t) for t in staged_tracers])
  out_tracers = [pe.JaxprTracer(trace, pe.PartialVal.unknown(v.aval), None)
                 for v in split.staged.outvars]
  if isinstance(prevent_cse, tuple):
    staged_cse = [c for c, used in zip(prevent_cse, split.staged_inputs_used) if used]
    prevent_cse = (True,) * split.num_residuals + tuple(staged_cse)
  staged_params = dict(params, jaxpr=split.staged, prevent_cse=prevent_cse,
                       differentiated=True)
  recipe = pe.new_eqn_recipe(
      trace, in_tracers, out_tracers, checkpoint_p, staged_params,
      core.positional_effects(split.staged), jx.source_info_util.current())
  for t in out_tracers:
    t.recipe = recipe

  level = logging.WARNING if jx.log_checkpoint_residuals_enabled() else logging.DEBUG
  if logger.isEnabledFor(level):
    staged_unknowns = [u for u, used in zip(in_unknowns, split.staged_inputs_used) if used]
    log_residuals(level, logger, split, staged_unknowns)

  return jx.merge_lists(list(split.out_unknowns), known_outs, out_tracers)

pe.custom_partial_eval_rules[checkpoint_p] = _partial_eval


# -- observing splits ----------------------------------------------------------
#
# The analysis layer asks "what did differentiation do to each block?" rather
# than redoing it: while `observe_splits()` is active, every split taken by
# the partial-eval rule is recorded, with the user's block it derives from.
# A block nested in another is split twice: with its parent, by the parent's
# policy (JAX's call rule, `_partial_eval_custom`), and again by its own
# policy when the backward pass runs the parent's recompute (`_transpose`
# partially evaluates the parent's staged body). Only the second goes through
# `_partial_eval`; the halves of the first are noted as derived from the
# block, so that the second is recorded as the block's.

@dataclasses.dataclass(frozen=True)
class SplitRecord:
  block: core.Jaxpr
  """The body of the block as the user's program holds it."""
  jaxpr: core.Jaxpr
  """The body that was split (the block's JVP, for reverse mode)."""
  in_unknowns: tuple[bool, ...]
  split: object
  params: dict
  lineage: tuple = ()
  """``jaxpr``, then each jaxpr it was derived from (by JVP, vmap, DCE, or
  a split from outside), ending with ``block``: what lets the analysis find
  a nested block's own split from the call its parent's split left behind."""


class _SplitObserver:
  def __init__(self):
    self.records: list[SplitRecord] = []
    self.derived_from: dict[int, core.Jaxpr] = {}
    self._keep_alive: list = []  # so that ids stay unique while observing

  def lineage(self, jaxpr) -> tuple:
    chain = [jaxpr]
    while (id(chain[-1]) in self.derived_from
           and not any(j is self.derived_from[id(chain[-1])] for j in chain)):
      chain.append(self.derived_from[id(chain[-1])])
    return tuple(chain)


_observers = threading.local()


def _active_observers() -> list:
  return getattr(_observers, 'stack', [])


@contextlib.contextmanager
def observe_splits():
  """Record every split taken while active; yields the list of records."""
  observer = _SplitObserver()
  _observers.stack = [*_active_observers(), observer]
  try:
    yield observer.records
  finally:
    _observers.stack = [o for o in _active_observers() if o is not observer]


def _note_derived(new_jaxpr, from_jaxpr):
  if new_jaxpr is from_jaxpr:
    return
  for observer in _active_observers():
    observer.derived_from[id(new_jaxpr)] = from_jaxpr
    observer._keep_alive.append(new_jaxpr)


def _note_split(jaxpr, in_unknowns, split, params):
  for observer in _active_observers():
    lineage = observer.lineage(jaxpr)
    observer.records.append(SplitRecord(
        lineage[-1], jaxpr, tuple(in_unknowns), split, dict(params), lineage))


def _check_effects_can_be_split(jaxpr):
  disallowed = jx.effects_remat_disallows(jaxpr.effects)
  if disallowed:
    names = ', '.join(sorted({type(e).__name__ for e in disallowed}))
    raise NotImplementedError(
        'Effects not supported in partial-eval of `checkpoint`/`remat`: '
        f'{names} ({disallowed}). Move the effectful operation out of the checkpointed '
        'function, or use an effect that is allowed under remat '
        '(e.g. jax.debug.callback).')


class _CheckedPolicy:
  """A user's policy, with its failures explained in terms of `policy=`."""

  def __init__(self, policy):
    self.policy = policy

  def __eq__(self, other):
    return isinstance(other, _CheckedPolicy) and other.policy == self.policy

  def __hash__(self):
    return hash(self.policy)

  def __call__(self, prim, *avals, **params):
    try:
      answer = self.policy(prim, *avals, **params)
    except Exception as e:
      e.add_note(f'(raised by the remat policy {self.policy!r}, passed as '
                 f'`policy=` to checkpoint, when asked about primitive '
                 f'{prim.name!r})')
      raise
    if not isinstance(answer, (bool, type(jx.Saveable), type(jx.Recompute),
                               jx.Offloadable)):
      raise TypeError(
          f'The remat policy {self.policy!r} (the `policy=` argument of '
          f'checkpoint) returned {answer!r} of type {type(answer).__name__} '
          f'for primitive {prim.name!r}; a policy must return a bool, or '
          'Saveable, Recompute or Offloadable(src=..., dst=...) from '
          'jax.ad_checkpoint.')
    return answer


def _checked_policy(policy):
  return None if policy is None else _CheckedPolicy(policy)


def _partial_eval_custom_params(unks_in, inst_in, kept_outs_known, inst_out,
                                num_res, params_known, params_staged):
  """Parameters of the two halves when a checkpoint is split from outside.

  This happens when the block sits inside another block being split, or in
  a `scan`/`jit` body that is: the outer policy decides, and the staged half
  becomes a differentiated (recomputing) checkpoint.
  """
  del kept_outs_known, inst_out, num_res
  prevent_cse = params_known['prevent_cse']
  if isinstance(prevent_cse, tuple):
    known_cse = [c for c, unknown in zip(prevent_cse, unks_in) if not unknown]
    staged_cse = [c for c, inst in zip(prevent_cse, inst_in) if inst]
    params_known = dict(params_known, prevent_cse=tuple(known_cse))
    params_staged = dict(params_staged, prevent_cse=tuple(staged_cse))
  return params_known, dict(params_staged, differentiated=True)

def _partial_eval_custom(saveable, unks_in, inst_in, eqn, **kwargs):
  """JAX's rule for a call split from outside, noting that the staged half's
  body derives from the block's: when the backward pass later splits that
  half with the block's own policy (``_transpose`` of the enclosing block),
  the split is recorded as this block's."""
  eqn_known, eqn_staged, *rest = pe.call_partial_eval_custom_rule(
      'jaxpr', _partial_eval_custom_params, saveable, unks_in, inst_in, eqn,
      **kwargs)
  if eqn_staged is not None:
    _note_derived(eqn_staged.params['jaxpr'], eqn.params['jaxpr'])
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
  out_zeros = tuple(isinstance(ct, jx.ad_util.Zero) for ct in out_cts)
  transposed, in_cts_are_zero = _transposed_jaxpr(
      pe.close_jaxpr(jaxpr), in_linear, out_zeros)
  nonlinear_args = [x for x, lin in zip(args, in_linear) if not lin]
  nonzero_cts = [ct for ct, zero in zip(out_cts, out_zeros) if not zero]
  if isinstance(prevent_cse, tuple):
    prevent_cse = ((False,) * len(transposed.consts)
                   + tuple(c for c, lin in zip(prevent_cse, in_linear) if not lin)
                   + (True,) * len(nonzero_cts))
  in_cts = checkpoint_p.bind(
      *transposed.consts, *nonlinear_args, *nonzero_cts,
      jaxpr=pe.convert_constvars_jaxpr(transposed.jaxpr),
      prevent_cse=prevent_cse, **params)
  in_cts = iter(in_cts)
  for accumulator, is_zero in zip(accumulators, in_cts_are_zero):
    if not is_zero:
      accumulator.accum(next(in_cts))


@jx.weakref_lru_cache
def _transposed_jaxpr(closed_jaxpr, in_linear, out_zeros):
  """A jaxpr from (non-linear inputs, nonzero cotangents) to the nonzero
  input cotangents, and for each linear input whether its cotangent is zero."""
  in_avals = ([a for a, lin in zip(closed_jaxpr.in_avals, in_linear) if not lin]
              + [a.to_ct_aval() for a, zero in zip(closed_jaxpr.out_avals, out_zeros)
                 if not zero])
  zeros_found = []

  def transposed(*flat_args):
    nonlinear_args, cts = jx.split_list(flat_args, [len(in_linear) - sum(in_linear)])
    # Recompute the non-linear part; what is left is linear in the rest.
    with jx.config.mutable_array_checks(False):
      recompute, linear, _, _ = pe.partial_eval_jaxpr_nounits(
          closed_jaxpr, in_linear, False)
    with jx.source_info_util.extend_name_stack('rematted_computation'):
      residuals = core.jaxpr_as_fun(recompute)(*nonlinear_args)
    cts = iter(cts)
    out_cts = [jx.ad_util.Zero(a.to_ct_aval()) if zero else next(cts)
               for a, zero in zip(closed_jaxpr.out_avals, out_zeros)]
    linear_inputs = [ad.UndefinedPrimal(a.to_ct_aval())
                     for a in linear.in_avals[len(residuals):]]
    in_cts = ad.backward_pass(linear.jaxpr, False, linear.consts,
                              [*residuals, *linear_inputs], out_cts)
    in_cts = in_cts[len(residuals):]
    zeros_found[:] = [isinstance(ct, jx.ad_util.Zero) for ct in in_cts]
    return [ct for ct in in_cts if not isinstance(ct, jx.ad_util.Zero)]

  dbg = closed_jaxpr.jaxpr.debug_info.with_unknown_names()
  traced, _ = pe.trace_to_jaxpr(
      transposed, jx.FlatTree.flatten((tuple(in_avals), {})), dbg)
  return traced, list(zeros_found)

ad.fancy_transposes[checkpoint_p] = _transpose


# -- vmap ---------------------------------------------------------------------

def _vmap(axis_data, args, dims, *, jaxpr, **params):
  batched, out_batched = batching.batch_jaxpr_axes(
      pe.close_jaxpr(jaxpr), axis_data, dims,
      [batching.zero_if_mapped] * len(jaxpr.outvars))
  batched_jaxpr = pe.convert_constvars_jaxpr(batched.jaxpr)
  _note_derived(batched_jaxpr, jaxpr)
  prevent_cse = params.pop('prevent_cse')
  if isinstance(prevent_cse, tuple):
    prevent_cse = (False,) * len(batched.consts) + prevent_cse
  outs = checkpoint_p.bind(*batched.consts, *args, jaxpr=batched_jaxpr,
                           prevent_cse=prevent_cse, **params)
  return outs, [0 if b else None for b in out_batched]

batching.fancy_primitive_batchers[checkpoint_p] = _vmap


# -- DCE ----------------------------------------------------------------------

def _dce(used_outputs, eqn):
  """Drop unused outputs, and the inputs and work only they needed.

  A block with side effects is kept even when none of its outputs is used.
  """
  if not any(used_outputs) and not pe.has_effects(eqn):
    return [False] * len(eqn.invars), None
  jaxpr, used_inputs = pe.dce_jaxpr(eqn.params['jaxpr'], used_outputs)
  if not any(used_inputs) and not any(used_outputs) and not _has_real_effects(jaxpr):
    return used_inputs, None
  prevent_cse = eqn.params['prevent_cse']
  if isinstance(prevent_cse, tuple):
    prevent_cse = tuple(c for c, used in zip(prevent_cse, used_inputs) if used)
  _note_derived(jaxpr, eqn.params['jaxpr'])
  invars = [v for v, used in zip(eqn.invars, used_inputs) if used]
  outvars = [v for v, used in zip(eqn.outvars, used_outputs) if used]
  new_eqn = pe.new_jaxpr_eqn(
      invars, outvars, checkpoint_p,
      dict(eqn.params, jaxpr=jaxpr, prevent_cse=prevent_cse),
      core.eqn_effects(jaxpr, invars), eqn.source_info, eqn.ctx)
  return used_inputs, new_eqn


def _has_real_effects(jaxpr) -> bool:
  # Axis names and refs allocated inside the block are not observable.
  bookkeeping = (core.NamedAxisEffect, core.InternalMutableArrayEffect)
  return any(not isinstance(e, bookkeeping) for e in jaxpr.effects)

pe.dce_rules[checkpoint_p] = _dce


# -- lowering -----------------------------------------------------------------

mlir.register_lowering(checkpoint_p, lower_checkpoint)


# -- state discharge ----------------------------------------------------------

@jx.discharge.register_discharge_rule(checkpoint_p)
def _discharge_state(in_avals, out_avals, *args, jaxpr, **params):
  """Turn reads and writes of ref inputs into values in and values out."""
  del out_avals
  discharged = jx.discharge.discharge_state(core.ClosedJaxpr(jaxpr, []))
  if discharged.consts:
    raise NotImplementedError(
        'checkpoint: discharging refs produced constants in the block body; '
        'this is not supported.')
  outs_and_refs = checkpoint_p.bind(*args, jaxpr=discharged.jaxpr, **params)
  outs, final_ref_values = jx.split_list(outs_and_refs, [len(jaxpr.outvars)])
  final_ref_values = iter(final_ref_values)
  new_inputs = [next(final_ref_values) if isinstance(a, jx.AbstractRef) else None
                for a in in_avals]
  return new_inputs, outs


# -- high-level (hijax) types -------------------------------------------------

def _is_high(*_, jaxpr, **__) -> bool:
  return jaxpr.is_high

checkpoint_p.is_high = _is_high


def _to_lojax(*hi_args, jaxpr, **params):
  lowered = pe.lower_jaxpr2(pe.close_jaxpr(jaxpr))
  lo_args = [lo for aval, x in zip(jaxpr.in_aval_qdds, hi_args)
             for lo in (aval.read_loval(x) if aval.has_qdd else aval.lower_val(x))]
  return checkpoint_p.bind(*lowered.consts, *lo_args,
                           jaxpr=pe.convert_constvars_jaxpr(lowered.jaxpr), **params)

checkpoint_p.to_lojax = _to_lojax
