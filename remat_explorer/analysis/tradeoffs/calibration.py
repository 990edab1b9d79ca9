"""The estimate calibrated on what a search compiled: compiled figures over
estimated ones, the estimate scaled by them, and how far it may misjudge
one policy against another (``search_policy(rank_by_estimate=True)``)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from remat_explorer.analysis.split.report import RematReport
from remat_explorer.analysis.xla.costs import CompiledCosts


def ranked_flops(costs: CompiledCosts, report: RematReport) -> float:
  """What the search ranks by: the compiled program's executed FLOPs; the
  jaxpr's count only where there is no compiled one (a failed compile)."""
  return costs.executed_flops if costs.executed_flops is not None else report.total_flops


def _pairs(estimates, compiled, flops: bool) -> list[tuple[float, float]]:
  """(estimated, compiled) peak (`flops`: executed FLOPs) of each policy
  both estimated, above zero, and compiled."""
  pairs = []
  for label, (costs, report) in compiled.items():
    estimate = estimates.get(label)
    if estimate is None or costs.failed:
      continue
    pair = ((estimate.flops, ranked_flops(costs, report)) if flops
            else (estimate.peak_bytes, costs.peak_bytes))
    if pair[0]:
      pairs.append(pair)
  return pairs


def compiled_over_estimated(estimates, compiled, flops: bool = False) -> list[float]:
  """The compiled peak (`flops`: the executed FLOPs) over the estimated
  one, of each policy both estimated and compiled."""
  return [measured / estimated for estimated, measured in _pairs(estimates, compiled, flops)]


def calibrated(estimates, compiled, flops: bool = False) -> Callable[[float], float]:
  """Compiled peak (`flops`: executed FLOPs) as a function of the
  estimated one, through every policy compiled: between two of them, on
  the line that joins them; beyond them, the estimate scaled by the
  nearest one's compiled-over-estimated ratio (the estimate itself where
  nothing is compiled yet).

  Not one ratio for all: how far the estimate misses depends on the
  policy. XLA:CPU merges the recompute of a straight-line program with its
  forward pass, so ``nothing_saveable``'s executed FLOPs can compile to no
  remat's, a quarter under its estimate, while policies that recompute
  little compile to theirs; a mean of those ratios put ``dots_saveable``
  8% under the FLOPs of no remat, which it compiles 0.5% over, and a
  search's table then showed it beating the answer it had compiled."""
  points: dict[float, list[float]] = {}
  for estimated, measured in _pairs(estimates, compiled, flops):
    points.setdefault(estimated, []).append(measured)
  if not points:
    return lambda estimate: estimate
  xs = sorted(points)
  ys = [float(np.mean(points[x])) for x in xs]

  def predict(estimate: float) -> float:
    if estimate <= xs[0]:
      return estimate * ys[0] / xs[0]
    if estimate >= xs[-1]:
      return estimate * ys[-1] / xs[-1]
    return float(np.interp(estimate, xs, ys))
  return predict


def flops_error(estimates, compiled) -> float:
  """The FLOPs by which the estimate may misjudge one policy against
  another: the spread of compiled-over-estimated FLOPs between the
  policies compiled, times nothing_saveable's estimated FLOPs (0 where
  fewer than two are compiled). Saving a value costs its bytes for
  certain; a saving below this may compile to none, or to more FLOPs, and
  the answer is then beaten by a built-in that does not save it (the
  reductions and an ``integer_pow`` of a transformer's softmax and norms,
  saved beside its dots, compile over ``dots_saveable``'s FLOPs)."""
  ratios = compiled_over_estimated(estimates, compiled, flops=True)
  if len(ratios) < 2:
    return 0.0
  return (max(ratios) - min(ratios)) * estimates['nothing_saveable'].flops


SLACK = 0.05
"""How far over the budget a candidate's estimate may land, at the most
favourable ratio compiled, and still be compiled: the estimate's error
between policies the ratios do not show."""


def may_fit(estimates, compiled, budget) -> Callable[[int], bool]:
  """Whether a candidate's estimated peak may fit once compiled: at the
  lowest ratio of compiled to estimated peak seen on the policies compiled,
  it lands within ``SLACK`` of the budget. (Policies the estimate
  cannot tell apart can compile to peaks 10% apart, no remat and
  ``everything_saveable`` among them: a mean ratio would rule out the one
  that fits.)"""
  least = min(compiled_over_estimated(estimates, compiled), default=1.0)
  return lambda estimate: estimate * least <= budget * (1 + SLACK)
