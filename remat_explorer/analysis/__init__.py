"""Analysis: a user function plus a policy, turned into plain data.

* ``analyze(f, *args, policy=...) -> RematReport``: the forward and backward
  jaxprs, the residuals and their origins, per-block splits, recompute and
  FLOPs, from the very splits differentiation takes.
* ``compile_costs(f, *args, policy=...) -> CompiledCosts``: XLA's compiled
  memory, FLOPs and times for the training step (the loss and its gradient),
  and a memory timeline.
* ``estimate_costs(f, *args, policy=...) -> CostEstimate``: the training
  step's peak memory and FLOPs estimated from its jaxpr in milliseconds,
  nothing compiled (a model, later replaced by ``compile_costs``' figures).
* ``compare(f, *args) -> Comparison``: every policy side by side.
* ``search_policy(f, *args, memory_budget=...) -> SearchResult``: a policy
  that fits a memory budget with the fewest FLOPs.

All four take sharded programs (arguments on a mesh, ``in_shardings``,
``shard_map``) and then report per device: each residual's sharding and
shard, XLA's memory and FLOPs of the partitioned executable, and the
collectives the recompute re-runs. With ``target_mesh("v5e:16x16", ...)``
and arguments given as ``jax.ShapeDtypeStruct``s sharded over it, every
figure is XLA's for that TPU or GPU, compiled from any machine.

Layers, each importing only those before it (``tests/test_conventions.py``
checks it); each subpackage's ``__init__`` lists its modules:

1. ``source``: the user's code (lines, module paths, names; what made a value).
2. ``policies``: policies in words, as text, and the search's answer.
3. ``targets``: meshes of accelerators to compile for (``target_mesh``),
   arguments placed on them (``on_target``), GPU target configs, each
   device's memory.
4. ``program``: the function and its arguments checked, its remat blocks
   found and their policies set, its devices.
5. ``split``: ``analyze`` and the ``RematReport`` (residuals, recompute,
   FLOPs, the plain graph), and ``estimate_costs``, from the jaxprs.
6. ``xla``: ``compile_costs`` and the readings of XLA's compiled program
   (memory timeline, peak, executed FLOPs, collectives).
7. ``tradeoffs``: ``compare``, ``search_policy`` and scan layouts.

Shared by every layer: ``units`` (figures in words, element sizes),
``cache`` (result caches, ``clear_caches``), ``context`` (trace settings
and the compile count), ``full_collections`` (Python's full garbage
collections held off while a batch of analyses runs), ``progress`` (how
far a comparison or a search is, where its user looks), ``freed_memory``
(what reading a compiled program freed, given back to the system) and
``errors`` (exceptions as users read them).
"""

from remat_explorer.analysis.split.analyze import analyze
from remat_explorer.analysis.program.blocks import DEFAULT_LOWERING, LOWERINGS
from remat_explorer.analysis.cache import clear_caches
from remat_explorer.analysis.xla.collectives import Collective
from remat_explorer.analysis.errors import error_summary
from remat_explorer.analysis.tradeoffs.compare import builtin_policies, compare
from remat_explorer.analysis.tradeoffs.rows import Comparison, PolicyRow
from remat_explorer.analysis.xla.compiled import compile_costs
from remat_explorer.analysis.xla.costs import CompiledCosts
from remat_explorer.analysis.split.estimate import CostEstimate, estimate_costs
from remat_explorer.analysis.xla.peak import (PeakBuffer, PeakExplanation, PeakResidual,
                                         explain_peak, live_at_peak, residuals_at_peak)
from remat_explorer.analysis.policies.policy_info import NO_REMAT, describe_policy
from remat_explorer.analysis.split.report import (BlockReport, EquationCost,
                                            RecomputedEquation, RematReport,
                                            Residual)
from remat_explorer.analysis.policies.chosen_policy import EquationPattern, SaveChosen
from remat_explorer.analysis.policies.policy_text import parse_policy
from remat_explorer.analysis.policies.policy_source import policy_source
from remat_explorer.analysis.tradeoffs.search import search_policy
from remat_explorer.analysis.tradeoffs.search_result import SearchResult
from remat_explorer.analysis.targets import (device_memory_bytes, gpu_target_config,
                                             gpu_target_names, on_target, register_gpu_target,
                                             target_mesh)
from remat_explorer.analysis.xla.timeline import Buffer, MemoryTimeline
# What the rendering layer reads besides the entry points: the words and
# pieces its views share with the analysis.
from remat_explorer.analysis.context import TraceSettings
from remat_explorer.analysis.program.devices import mesh_text
from remat_explorer.analysis.source.origins import full_path
from remat_explorer.analysis.program.keywords import check_keywords
from remat_explorer.analysis.program.problem import check_positions, donated_positions
from remat_explorer.analysis.split.graph import GraphBlock, GraphNode, SplitGraph, split_graph_of
from remat_explorer.analysis.tradeoffs.rows import AS_WRITTEN, AS_WRITTEN_NO_REMAT
from remat_explorer.analysis.tradeoffs.merged_recompute import recompute_eliminated
from remat_explorer.analysis.units import (MISSING, byte_unit, flop_unit, format_bytes,
                                           format_flops, format_seconds, memory_share_text)

__all__ = [
    'analyze', 'RematReport', 'Residual', 'BlockReport', 'RecomputedEquation',
    'EquationCost', 'compile_costs', 'CompiledCosts', 'estimate_costs',
    'CostEstimate', 'MemoryTimeline', 'Buffer',
    'compare', 'Comparison', 'PolicyRow', 'builtin_policies', 'NO_REMAT',
    'describe_policy', 'search_policy', 'SearchResult', 'SaveChosen',
    'EquationPattern', 'parse_policy', 'policy_source',
    'LOWERINGS', 'DEFAULT_LOWERING', 'residuals_at_peak', 'live_at_peak', 'explain_peak', 'PeakExplanation', 'PeakBuffer', 'PeakResidual', 'Collective', 'clear_caches',
    'error_summary', 'target_mesh', 'on_target', 'register_gpu_target', 'gpu_target_config',
    'gpu_target_names', 'device_memory_bytes',
    # for the rendering layer
    'TraceSettings', 'mesh_text', 'full_path', 'check_keywords', 'check_positions',
    'donated_positions', 'GraphBlock', 'GraphNode', 'SplitGraph',
    'split_graph_of', 'AS_WRITTEN', 'AS_WRITTEN_NO_REMAT', 'recompute_eliminated', 'MISSING',
    'byte_unit', 'flop_unit', 'format_bytes', 'format_flops', 'format_seconds',
    'memory_share_text',
]
