"""Whether XLA dropped the recompute a policy asks for: what the optimized
program executes against what was traced, or, where the FLOPs are not
known, the matmuls it lost.

XLA may see that a recompute computes what the forward pass already
computed and keep the forward value instead (common-subexpression
elimination across a lowering that does not protect the recompute): the
policy's memory saving then does not happen, whatever the jaxpr says.
"""

from __future__ import annotations

from remat_explorer.analysis.split.report import RematReport
from remat_explorer.analysis.units import format_flops
from remat_explorer.analysis.xla.costs import CompiledCosts

_MATMULS = ('dot_general', 'conv_general_dilated')


def recompute_eliminated(report: RematReport | None, costs: CompiledCosts) -> str | None:
  """Say so when the compiler dropped the recompute the policy asks for.

  On one device the FLOPs decide: the optimized program executes at least
  half of the recompute's FLOPs fewer than the program as traced. Else the
  matmul counts do: the optimized program has fewer matmuls than the
  lowered one. Not on a GPU, whose XLA merges matmuls that share an operand
  (and strength-reduces small ones) whether or not it keeps the recompute."""
  if (report is None or costs.failed or costs.lowered_matmuls is None
      or costs.compiled_matmuls is None):
    return None
  recomputed = sum(1 for b in report.blocks if b.differentiated
                   for e in b.recomputed if e.primitive in _MATMULS)
  if recomputed == 0:
    return None
  counts = (f'the backward pass should recompute {recomputed} matmul(s); the lowered '
            f'program has {costs.lowered_matmuls}, the optimized one {costs.compiled_matmuls}')
  if (costs.executed_flops is not None and report.num_devices == 1
      and not report.unknown_trip_counts and report.recompute_flops > 0):
    traced = report.forward_flops + report.backward_flops
    missing = traced - costs.executed_flops
    if missing < report.recompute_flops / 2:
      return None
    return (f'recompute eliminated by the compiler: {counts}, and it executes '
            f'{format_flops(missing)} fewer than the {format_flops(traced)} traced, where the '
            f'recompute is {format_flops(report.recompute_flops)}: XLA merged the '
            'recompute with the forward pass and keeps its outputs alive instead.')
  merged = costs.lowered_matmuls - costs.compiled_matmuls
  if merged <= 0 or costs.platform == 'gpu':
    return None
  return (f'recompute eliminated by the compiler: {counts}, so '
          f'{min(merged, recomputed)} recomputed matmul(s) were merged with the '
          'forward pass and their outputs are kept alive instead.')
