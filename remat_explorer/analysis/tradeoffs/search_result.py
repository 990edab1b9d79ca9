"""What ``search_policy`` answers: the candidates it priced, the policy it
chose with its compiled figures, the sentence that says why, and the
policy as Python (``SearchResult.to_source()``): for an answer of no
remat, with the policy of those compiled to keep the checkpoints with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from remat_explorer.analysis.policies.chosen_policy import SaveChosen
from remat_explorer.analysis.policies.policy_info import NO_REMAT, describe_policy
from remat_explorer.analysis.policies.policy_source import no_remat_source, policy_source
from remat_explorer.analysis.split.report import RematReport, plain_data
from remat_explorer.analysis.tradeoffs.rows import AS_WRITTEN, AS_WRITTEN_NO_REMAT, NO_REMAT_LABEL
from remat_explorer.analysis.units import format_bytes, format_flops
from remat_explorer.analysis.xla.costs import CompiledCosts

OWN_LABELS = (AS_WRITTEN, AS_WRITTEN_NO_REMAT, NO_REMAT_LABEL)
"""The candidates that are the program itself, not a policy."""


@dataclass(frozen=True)
class Candidate:
  label: str
  peak_bytes: int | None
  flops: float
  """What the compiled program executes, loops counted (the jaxpr's count
  where XLA's cannot be had)."""
  fits: bool
  estimated: bool = False
  """True when the figures are ``estimate_costs``' (``rank_by_estimate``:
  a candidate not compiled), calibrated on the compiled candidates'
  figures (``calibration.calibrated``: for a sharded program, so brought
  from the whole program to one device), its fit the predicted one. No
  such row beats the answer: one that would is compiled."""


@dataclass(frozen=True)
class SearchResult:
  """What ``search_policy`` chose and why: the policy, its compiled peak
  and FLOPs, and every candidate it priced.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> result = rx.search_policy(f, w, x, memory_budget=1.0)
    >>> result.fits, 'jax.checkpoint_policies.' in result.to_source()
    (True, True)
  """
  policy: Callable[..., Any] = field(repr=False)
  label: str
  """At most 80 characters."""
  budget_bytes: int
  peak_bytes: int | None
  """Compiled peak of the chosen policy (verified, not predicted); per
  device for a sharded program. None only where XLA refused every
  candidate for the device's memory (``fits`` is then False and
  ``explanation`` gives XLA's words)."""
  flops: float
  """Forward + backward FLOPs the chosen policy's compiled program executes
  (per device), loops counted: what the search ranks by."""
  fits: bool
  """False only if nothing fits, not even ``nothing_saveable``."""
  explanation: str
  """What was chosen and why, in a sentence or two."""
  compiles_used: int
  """XLA compiles this search ran, pricing included (which compiles the
  forward pass of a sharded program to learn its shardings); a result cached
  by an earlier call (of ``analyze``, ``compile_costs``, ``compare`` or the
  search itself) costs none."""
  candidates: tuple[Candidate, ...]
  costs: CompiledCosts = field(repr=False)
  report: RematReport = field(repr=False)
  kept_checkpoint: Candidate | None = None
  """Where the answer is no remat: the policy, of those compiled, to keep
  the checkpoints with instead (fewest FLOPs of those that fit the budget,
  else the lowest peak), as ``to_source()`` writes it; else None."""
  kept_checkpoint_policy: Callable[..., Any] | None = field(default=None, repr=False)

  def to_source(self) -> str:
    """Python that builds the chosen policy with JAX alone, as ``policy``
    (paste it next to ``jax.checkpoint(..., policy=policy)``). For no
    remat, the policy to keep the checkpoints with is the one of
    ``kept_checkpoint``, with what its compile showed: not a policy that
    saves everything, which can compile above the budget."""
    kept = self.kept_checkpoint
    if self.policy is not NO_REMAT or kept is None:
      return policy_source(self.policy)
    name = ('the policy below, the search\'s own choice,'
            if isinstance(self.kept_checkpoint_policy, SaveChosen) else kept.label)
    if kept.fits:
      more = self.flops and kept.flops / self.flops - 1
      why = (f'{name} fits the budget of {format_bytes(self.budget_bytes)} with the '
             f'fewest FLOPs of the policies compiled: compiled peak '
             f'{format_bytes(kept.peak_bytes)}, {more:+.1%} FLOPs.')
    else:
      why = (f'no policy compiled fits the budget of {format_bytes(self.budget_bytes)}; '
             f'{name} has the lowest compiled peak, {format_bytes(kept.peak_bytes)}.')
    return no_remat_source(self.kept_checkpoint_policy, why)

  def to_dict(self) -> dict:
    out = plain_data(self)
    out['policy'] = repr(self.policy)
    out['kept_checkpoint_policy'] = (None if self.kept_checkpoint_policy is None
                                     else describe_policy(self.kept_checkpoint_policy))
    out['source'] = self.to_source()
    out['costs'] = self.costs.to_dict()
    out['report'] = self.report.to_dict()
    return out


def policy_to_keep(compiled) -> Candidate | None:
  """Of the compiled candidates that are policies (not the program as
  written or without remat), the one to keep the checkpoints with: fewest
  FLOPs of those that fit, then the lowest peak; where none fits, the
  lowest peak. None where no policy compiled."""
  policies = [c for c in compiled if c.label not in OWN_LABELS and c.peak_bytes is not None]
  fitting = [c for c in policies if c.fits]
  if fitting:
    return min(fitting, key=lambda c: (c.flops, c.peak_bytes))
  return min(policies, key=lambda c: c.peak_bytes, default=None)


def explanation(chosen: Candidate, policy, budget, candidates, fits, refusal='') -> str:
  if not fits and chosen.peak_bytes is None:  # every compile refused for memory
    return (f'Nothing fits {format_bytes(budget)}: XLA refused every candidate it '
            f'compiled for the device\'s memory; on {chosen.label}: {refusal} Make '
            'the step smaller (batch, sequence, sharding).')
  if not fits:
    return (f'Nothing fits {format_bytes(budget)}: the smallest compiled peak, '
            f'{chosen.label}\'s, is {format_bytes(chosen.peak_bytes)}. Raise the '
            'budget, or make the step smaller (batch, sequence, sharding).')
  if chosen.label in OWN_LABELS:
    program = ('The program as written' if chosen.label != NO_REMAT_LABEL
               else 'The program without remat')
    return (f'{program} fits: compiled peak {format_bytes(chosen.peak_bytes)} within '
            f'the {format_bytes(budget)} budget, with the fewest FLOPs of every '
            f'policy compiled ({format_flops(chosen.flops)}); no policy to change.')
  what = (policy.summary(200) if isinstance(policy, SaveChosen)
          else f'the built-in {chosen.label}')
  nothing = next((c for c in candidates if c.label == 'nothing_saveable'), None)
  fewer = ''
  if nothing is not None and nothing.flops > chosen.flops:
    fewer = f', {1 - chosen.flops / nothing.flops:.0%} fewer than nothing_saveable'
  return (f'Saves {what}: compiled peak {format_bytes(chosen.peak_bytes)} within '
          f'the {format_bytes(budget)} budget, {format_flops(chosen.flops)}{fewer}.')
