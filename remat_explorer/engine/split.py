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

import dataclasses
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
  draft = _Draft.of(discharge_internal_refs(jaxpr), in_unknowns, policy)
  split = draft.trimmed()
  split = dataclasses.replace(
      split, known=_round_residuals_to_dtype(split.known, split.num_residuals))
  if ref_effects == 'once':
    split = recompute_from_saved_ref_values(
        split, [v.aval for v in jaxpr.invars], in_unknowns)
  return split


# -- the draft, and trimming it -----------------------------------------------
#
# JAX's interpreters offer one way to split a jaxpr under a policy:
# `partial_eval_jaxpr_custom` drafts both halves, and `dce_jaxpr` trims each.
# So those calls, and their order, are fixed; what the draft holds and why
# the trimming runs backward pass first is said here.

@dataclass(frozen=True)
class _Draft:
  """Both halves as partial evaluation first drafts them, before trimming.

  The draft is generous. Its staged jaxpr takes *every* input of the block
  and, besides the unknown outputs, produces any known output it happens to
  recompute, so it reads values the backward pass will never need; and its
  known jaxpr saves, as candidate residuals, every value the policy allows
  that some staged equation reads.
  """
  known: core.Jaxpr
  """Known inputs -> known outputs, then the candidate residuals."""
  staged: core.Jaxpr
  """Candidate residuals, then every block input -> its outputs."""
  out_unknowns: tuple[bool, ...]
  """For each output of the block, whether only the backward pass has it."""
  staged_outputs: tuple[bool, ...]
  """For each output of the block, whether ``staged`` produces it."""
  num_candidates: int

  @classmethod
  def of(cls, body, in_unknowns, policy) -> _Draft:
    # Every input is available to the staged jaxpr (instantiated), and no
    # output is forced to be unknown or staged: the policy alone decides.
    known, staged, out_unknowns, staged_outputs, num_candidates = (
        jx.pe.partial_eval_jaxpr_custom(body, in_unknowns, True, False, False,
                                        policy))
    return cls(known, staged, tuple(out_unknowns), tuple(staged_outputs),
               num_candidates)

  def trimmed(self) -> Split:
    """The split that keeps only what the unknown outputs need.

    The backward pass is trimmed first, because what it still reads is what
    decides which candidates remain residuals; the forward pass then stops
    producing the others, and the work only they needed.
    """
    staged, staged_reads = jx.pe.dce_jaxpr(self.staged, self._wanted_from_staged())
    residuals_read, staged_inputs_used = jx.split_list(
        staged_reads, [self.num_candidates])
    known_outputs = [True] * self.out_unknowns.count(False)
    known, known_inputs_used = jx.pe.dce_jaxpr(
        self.known, known_outputs + residuals_read)
    return Split(known, staged, self.out_unknowns, sum(residuals_read),
                 tuple(known_inputs_used), tuple(staged_inputs_used))

  def _wanted_from_staged(self) -> list[bool]:
    """For each output ``staged`` produces, whether the backward pass needs
    it: only unknown outputs; the known ones the forward pass already has."""
    return [unknown for unknown, staged
            in zip(self.out_unknowns, self.staged_outputs) if staged]


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
