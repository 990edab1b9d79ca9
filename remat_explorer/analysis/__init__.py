"""Analysis: a user function plus a policy, turned into plain data.

* ``analyze(f, *args, policy=...) -> RematReport``: the forward and backward
  jaxprs, the residuals and their origins, per-block splits, recompute and
  FLOPs, from the very splits differentiation takes.
* ``compile_costs(f, *args, policy=...) -> CompiledCosts``: XLA's compiled
  memory, FLOPs and times for the training step (the loss and its gradient),
  and a memory timeline.
* ``compare(f, *args) -> Comparison``: every policy side by side.
* ``search_policy(f, *args, memory_budget=...) -> SearchResult``: a policy
  that fits a memory budget with the fewest FLOPs.

All four take sharded programs (arguments on a mesh, ``in_shardings``,
``shard_map``) and then report per device: each residual's sharding and
shard, XLA's memory and FLOPs of the partitioned executable, and the
collectives the recompute re-runs.

Modules, in the order a function flows through them:

* ``problem`` (the function and its arguments, checked), ``program`` (its
  remat blocks found, policies set), ``origins`` (lines, module paths and
  names in the user's terms);
* ``analyze`` and ``report`` (the split, residuals, recompute), ``flops``;
* ``compiled`` (XLA's figures), ``hlo`` (the compiled module and XLA's buffer
  placement, read once), ``liveness`` and ``timeline`` (memory along the
  schedule), ``peak`` (residuals at the peak), ``collectives``, ``sharding``;
* ``compare``, ``search`` and ``chosen_policy`` (the policy it returns);
* ``policy_info`` and ``policy_text`` (policies in words, and back),
  ``units``, ``cache``, ``context``, ``keywords`` (options checked before
  tracing), ``errors`` (exceptions as users read them).
"""

from remat_explorer.analysis.analyze import analyze
from remat_explorer.analysis.program import DEFAULT_LOWERING, LOWERINGS
from remat_explorer.analysis.cache import clear_caches
from remat_explorer.analysis.collectives import Collective
from remat_explorer.analysis.errors import error_summary
from remat_explorer.analysis.compare import (Comparison, PolicyRow,
                                             builtin_policies, compare)
from remat_explorer.analysis.compiled import CompiledCosts, compile_costs
from remat_explorer.analysis.peak import (PeakBuffer, PeakExplanation, PeakResidual,
                                         explain_peak, live_at_peak, residuals_at_peak)
from remat_explorer.analysis.policy_info import NO_REMAT, describe_policy
from remat_explorer.analysis.report import (BlockReport, EquationCost,
                                            RecomputedEquation, RematReport,
                                            Residual)
from remat_explorer.analysis.chosen_policy import EquationPattern, SaveChosen
from remat_explorer.analysis.policy_text import parse_policy
from remat_explorer.analysis.search import SearchResult, search_policy
from remat_explorer.analysis.timeline import Buffer, MemoryTimeline

__all__ = [
    'analyze', 'RematReport', 'Residual', 'BlockReport', 'RecomputedEquation',
    'EquationCost', 'compile_costs', 'CompiledCosts', 'MemoryTimeline', 'Buffer',
    'compare', 'Comparison', 'PolicyRow', 'builtin_policies', 'NO_REMAT',
    'describe_policy', 'search_policy', 'SearchResult', 'SaveChosen',
    'EquationPattern', 'parse_policy',
    'LOWERINGS', 'DEFAULT_LOWERING', 'residuals_at_peak', 'live_at_peak', 'explain_peak', 'PeakExplanation', 'PeakBuffer', 'PeakResidual', 'Collective', 'clear_caches',
    'error_summary',
]
