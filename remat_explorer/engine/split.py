"""The known/staged split: the one place that decides what remat saves.

Given the body of a checkpointed block, which of its inputs are unknown (their
values only exist on the backward pass, i.e. tangents or cotangents) and a
policy, ``split_jaxpr`` returns

* the *known* jaxpr, run on the forward pass: known inputs to known outputs
  plus the residuals the policy allowed it to keep, and
* the *staged* jaxpr, run on the backward pass: residuals plus inputs to the
  unknown outputs, recomputing whatever was not saved.

The primitive's partial-evaluation rule and the analysis layer both call this
function, so what the explorer shows is exactly what differentiation does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine.policies import nothing_saveable
from remat_explorer.engine.refs import (
    DEFAULT_REF_EFFECTS, discharge_internal_refs, recompute_from_saved_ref_values)

core = jx.core


@dataclass(frozen=True)
class Split:
  known: core.Jaxpr
  """Forward pass: used known inputs -> known outputs, then residuals."""
  staged: core.Jaxpr
  """Backward pass: residuals, then used inputs -> unknown outputs."""
  out_unknowns: tuple[bool, ...]
  """For each output of the block, whether the staged jaxpr computes it."""
  num_residuals: int
  known_inputs_used: tuple[bool, ...]
  """For each *known* input of the block, whether ``known`` reads it."""
  staged_inputs_used: tuple[bool, ...]
  """For each input of the block, whether ``staged`` reads it."""

  @property
  def residual_avals(self) -> list:
    return [v.aval for v in self.staged.invars[:self.num_residuals]]


def split_jaxpr(jaxpr: core.Jaxpr, in_unknowns: Sequence[bool],
                policy=None, ref_effects: str = DEFAULT_REF_EFFECTS) -> Split:
  """Split a checkpointed block's body into its forward and backward parts.

  `policy` of ``None`` means ``nothing_saveable``, as for ``checkpoint``.
  `ref_effects` says whether the backward pass re-performs the block's writes
  to refs passed to it (``"replay"``) or recomputes from their saved initial
  values (``"once"``); see ``refs.py``.
  """
  return _split_jaxpr_cached(jaxpr, tuple(map(bool, in_unknowns)),
                             policy or nothing_saveable, ref_effects)


@jx.weakref_lru_cache
def _split_jaxpr_cached(jaxpr, in_unknowns, policy, ref_effects) -> Split:
  in_avals = [v.aval for v in jaxpr.invars]
  jaxpr = discharge_internal_refs(jaxpr)
  num_inputs = len(jaxpr.invars)
  known, staged, out_unknowns, out_instantiated, num_res = (
      jx.pe.partial_eval_jaxpr_custom(
          jaxpr, in_unknowns, [True] * num_inputs, False, False, policy))

  # The backward pass only needs the unknown outputs; everything it does not
  # need to produce them (and every residual it does not read) is dropped.
  _, wanted_staged_outputs = jx.partition_list(out_instantiated, out_unknowns)
  staged, staged_reads = jx.pe.dce_jaxpr(staged, wanted_staged_outputs)
  residuals_read, staged_inputs_used = jx.split_list(staged_reads, [num_res])

  num_known_outputs = len(out_unknowns) - sum(out_unknowns)
  known, known_inputs_used = jx.pe.dce_jaxpr(
      known, [True] * num_known_outputs + residuals_read)
  num_res = sum(residuals_read)
  known = _round_residuals_to_dtype(known, num_res)
  split = Split(known, staged, tuple(out_unknowns), num_res,
                tuple(known_inputs_used), tuple(staged_inputs_used))
  if ref_effects == 'once':
    split = recompute_from_saved_ref_values(split, in_avals, in_unknowns)
  return split


def _round_residuals_to_dtype(jaxpr: core.Jaxpr, num_res: int) -> core.Jaxpr:
  """Make saved residuals bit-identical to what the forward pass used.

  XLA may keep a fused intermediate in excess precision on the forward pass
  while the copy written out as a residual is rounded to its dtype; the
  backward pass would then see a slightly different value. So each
  floating-point residual that the forward pass also consumes is produced by
  an explicit ``reduce_precision`` to its own dtype, placed right after the
  value is made (after its producer, or first thing for an input), and the
  forward pass reads the rounded value too.
  """
  consumed = {x for eqn in jaxpr.eqns for x in eqn.invars
              if isinstance(x, core.Var)}
  producer_of = {v: i for i, eqn in enumerate(jaxpr.eqns) for v in eqn.outvars}
  first = []       # roundings of inputs and constants
  after = {}       # equation index -> roundings of its outputs
  unrounded = {}   # residual -> the fresh variable its producer now writes
  for var in jaxpr.outvars[len(jaxpr.outvars) - num_res:]:
    if not _needs_rounding(var, consumed) or var in unrounded:
      continue
    params = _reduce_precision_params(var.aval.dtype)
    index = producer_of.get(var)  # None for an input or a constant
    producer = None if index is None else jaxpr.eqns[index]
    if (producer is not None and producer.primitive is jx.reduce_precision_p
        and producer.params == params):
      continue  # already rounded
    # The rounding takes its producer's source line, so reports name the
    # user's code; an input's rounding takes the current one.
    where = () if producer is None else (producer.source_info, producer.ctx)
    unrounded[var] = core.Var(var.aval)
    rounding = core.new_jaxpr_eqn([unrounded[var]], [var], jx.reduce_precision_p,
                                  params, set(), *where)
    # Each rounding goes in front of those placed earlier at the same spot:
    # JAX orders them so, and the jaxprs must print alike.
    (first if index is None else after.setdefault(index, [])).insert(0, rounding)

  rename = lambda vs: [unrounded.get(v, v) for v in vs]
  eqns = list(first)
  for i, eqn in enumerate(jaxpr.eqns):
    eqns.append(eqn.replace(outvars=rename(eqn.outvars)) if i in after else eqn)
    eqns.extend(after.get(i, ()))
  rounded = jaxpr.replace(invars=rename(jaxpr.invars),
                          constvars=rename(jaxpr.constvars), eqns=eqns)
  if jx.checks_enabled():
    core.check_jaxpr(rounded)
  return rounded


def _needs_rounding(var, consumed) -> bool:
  aval = var.aval
  return (isinstance(var, core.Var) and var in consumed
          and isinstance(aval, core.ShapedArray)
          and jx.dtypes.issubdtype(aval.dtype, np.inexact))


def _reduce_precision_params(dtype) -> dict:
  finfo = jx.dtypes.finfo(dtype)
  return dict(exponent_bits=finfo.nexp, mantissa_bits=finfo.nmant)
