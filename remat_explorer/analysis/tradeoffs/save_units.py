"""What a search can save, priced: the handles of ``chosen_policy.py``
(names, roles, equation patterns) each priced by the analysis, and the
greedy choice among them. Shared by both rankings of ``search_policy``.

`run` is the search's runner: ``run.report(policy)`` analyses a policy
(cached), ``run.say(done, total, label)`` reports progress.
"""

from __future__ import annotations

from remat_explorer.analysis.policies.chosen_policy import ROLES, EquationPattern, SaveChosen
from remat_explorer.analysis.split.report import RematReport

# At most this many equation patterns are priced, the ones whose recompute
# costs most first: each costs one analysis.
MAX_PATTERN_UNITS = 16


def greedy_units(run, base_report: RematReport, names, fits, min_saved_flops: float = 0) -> list:
  """The units to save: each priced by the analysis (the recompute FLOPs
  it removes per residual byte it adds over `base_report`), added best
  first while ``fits(units)`` says the predicted peak fits. A unit that
  removes no more than `min_saved_flops` is not a candidate: its bytes are
  certain, its saving is not."""
  run.say(0, None, 'pricing what to save')
  units = ([('name', n) for n in names] + [('role', r) for r in ROLES]
           + [('pattern', p) for p in costliest_recomputed(base_report)])
  priced = []
  for unit in units:
    report = run.report(policy_of([unit]))
    saved_flops = base_report.total_flops - report.total_flops
    added_bytes = report.residual_bytes_per_device - base_report.residual_bytes_per_device
    if saved_flops > min_saved_flops:
      priced.append((saved_flops / max(added_bytes, 1), unit))
  priced.sort(key=lambda p: -p[0])
  chosen = []
  for _, unit in priced:
    if fits([*chosen, unit]):
      chosen.append(unit)
  return without_redundant(run, chosen)


def without_redundant(run, chosen: list) -> list:
  """`chosen` without the units that change nothing the others do not
  already save (a pattern of dots once their role is chosen, ...): fewer,
  clearer handles in the policy and its source."""
  def effect(units):
    report = run.report(policy_of(units))
    return report.total_flops, report.residual_bytes_per_device
  full = effect(chosen)
  kept = list(chosen)
  for unit in reversed(chosen):
    trial = [u for u in kept if u != unit]
    if trial and effect(trial) == full:
      kept = trial
  return kept


def recomputed_patterns(report: RematReport):
  """(pattern, recomputed equation, block) for each equation the blocks
  recompute that a pattern can name (not those inside a call of the
  staged half, reached through their name or role only)."""
  for block in report.blocks:
    if not block.differentiated or block.staged_jaxpr is None:
      continue
    for e in block.recomputed:
      if e.index is None or e.flops <= 0:
        continue
      pattern = EquationPattern.of_equation(block.staged_jaxpr.eqns[e.index])
      if pattern is not None:
        yield pattern, e, block


def costliest_recomputed(report: RematReport) -> list[EquationPattern]:
  """The patterns of recomputed equations by the FLOPs their recompute
  costs in all (trip counts applied), costliest first, at most
  ``MAX_PATTERN_UNITS``."""
  flops: dict[EquationPattern, int] = {}
  for pattern, e, block in recomputed_patterns(report):
    flops[pattern] = flops.get(pattern, 0) + e.flops * (block.trip_count or 1)
  return sorted(flops, key=lambda p: (-flops[p], p))[:MAX_PATTERN_UNITS]


def user_sites(report: RematReport, units) -> tuple[str, ...]:
  """The lines of the user's code the chosen patterns cover."""
  patterns = {v for kind, v in units if kind == 'pattern'}
  found = []
  for pattern, e, _ in recomputed_patterns(report):
    if pattern in patterns:
      where = ' · '.join(x for x in (e.source, e.module_path) if x)
      if where and where not in found:
        found.append(where)
  return tuple(found)


def policy_of(units, sites=()) -> SaveChosen:
  return SaveChosen(
      names=frozenset(v for kind, v in units if kind == 'name'),
      roles=frozenset(v for kind, v in units if kind == 'role'),
      patterns=frozenset(v for kind, v in units if kind == 'pattern'),
      sites=tuple(sites))
