"""The theory beside the measurement, for ``checkpointed_scan``'s schedules.

A ``checkpointed_scan`` runs in a named scope that says its schedule, its
length and its carry (``checkpointed_scan[binomial s=4; n=256;
carry=f32[8,64]]``). ``scan_layouts`` finds those scopes in an analysed
program and sets, for each, the schedule's predicted costs
(``scan_schedule_costs``, in closed form) beside what the program shows:

* stored carries: the residuals of the carry's shape the forward pass
  saves (a stack of k carries counts k), from the jaxpr; and the compiled
  temporary memory in carries (``temp_bytes / carry bytes``), from XLA,
  which also holds a step's own intermediates, the loops' buffers and, for
  nested schedules, a carry or two per level (with a small carry, these
  outweigh the carries themselves);
* recomputed steps: the FLOPs the backward pass spends recomputing, over
  the FLOPs of one step (the forward pass runs each step once, so its
  FLOPs inside the scope over n), from the jaxpr.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jax.extend.core import jaxprs_in_params

from remat_explorer.analysis import flops as flop_count
from remat_explorer.analysis.compiled import CompiledCosts
from remat_explorer.analysis.report import RematReport
from remat_explorer.engine import (ScanScheduleCosts, ScanScope, parse_scan_scope,
                                   scan_schedule_costs)

_TYPE = re.compile(r'(\w+)\[([\d,]*)\]')
_BYTES = {'f16': 2, 'bf16': 2, 'f32': 4, 'f64': 8, 'i8': 1, 'i16': 2, 'i32': 4,
          'i64': 8, 'u8': 1, 'u32': 4, 'bool': 1, 'c64': 8, 'c128': 16}


@dataclass(frozen=True)
class ScanLayoutCheck:
  """One ``checkpointed_scan`` of a program: predicted and measured."""
  schedule: str
  """As ``scan_schedule_costs`` names it: 'every', 'sqrt', 'segments=k',
  'binomial s=S'."""
  steps: int
  carry: str
  """The carry's type(s), e.g. ``f32[8,64]``."""
  predicted: ScanScheduleCosts
  forward_carries: int
  """Carries the forward pass keeps for the backward pass (its residuals of
  the carry's shape), from the jaxpr. Nested blocks keep more while the
  backward pass runs through them, so the most held at once (predicted)
  can be larger."""
  step_flops: int
  """FLOPs of one step: the forward pass's FLOPs in the scope over n."""
  recomputed_steps: float | None
  """The backward pass's recompute FLOPs over ``step_flops``; None when the
  program has more than one checkpointed scan (the recompute is the whole
  program's)."""
  temp_carries: float | None = None
  """XLA's compiled temporary memory over the carry's bytes."""


def scan_layouts(report: RematReport, costs: CompiledCosts | None = None
                 ) -> tuple[ScanLayoutCheck, ...]:
  """Every ``checkpointed_scan`` of `report`'s program, its predicted
  costs beside those measured (`costs` adds XLA's temporary memory)."""
  if report.forward_jaxpr is None:
    return ()
  found: dict[ScanScope, list] = {}
  _scoped_flops(report.forward_jaxpr.jaxpr, '', 1, found)
  checks = []
  for scope, (flops,) in found.items():
    schedule, n, carry = scope.schedule, scope.steps, scope.carry
    step_flops = flops // max(n, 1)
    carry_shapes = [_shape(t) for t in _TYPE.finditer(carry)]
    carry_bytes = sum(_bytes(t) for t in _TYPE.finditer(carry))
    recomputed = (report.recompute_flops / step_flops
                  if len(found) == 1 and step_flops else None)
    temp = (costs.temp_bytes / carry_bytes
            if costs is not None and not costs.failed and carry_bytes else None)
    checks.append(ScanLayoutCheck(
        schedule, n, carry, _predicted(n, schedule),
        _carry_residuals(report, carry_shapes[0] if carry_shapes else None),
        step_flops, recomputed, temp))
  return tuple(checks)


def _scoped_flops(jaxpr, outer: str, trips: int, found: dict) -> None:
  """Add to `found[scope][0]` the FLOPs of the equations under each
  checkpointed_scan scope, loop trip counts applied."""
  for eqn in jaxpr.eqns:
    scope = f'{outer}/{eqn.source_info.name_stack}'
    subs = list(jaxprs_in_params(eqn.params))
    m = parse_scan_scope(scope)
    if subs and not (m and eqn.primitive.name == 'cond'):  # a cond: its costliest branch
      times = trips * (eqn.params['length'] if eqn.primitive.name == 'scan' else 1)
      for sub in subs:
        _scoped_flops(sub, scope, times, found)
      continue
    if m:
      found.setdefault(m, [0])[0] += flop_count.eqn_flops(eqn) * trips


def _predicted(n: int, schedule: str) -> ScanScheduleCosts:
  if schedule.startswith('binomial s='):
    return scan_schedule_costs(n, ('binomial', int(schedule.split('=')[1])))
  if schedule.startswith('segments='):
    return scan_schedule_costs(n, 'segments', int(schedule.split('=')[1]))
  return scan_schedule_costs(n, schedule)


def _shape(match) -> tuple[int, ...]:
  return tuple(int(d) for d in match.group(2).split(',') if d)


def _bytes(match) -> int:
  size = 1
  for d in _shape(match):
    size *= d
  return size * _BYTES.get(match.group(1), 4)


def _carry_residuals(report: RematReport, carry: tuple[int, ...] | None) -> int:
  """Residuals of the carry's shape, a stack of k of them counting k."""
  if carry is None:
    return 0
  count = 0
  for r in report.residuals:
    if r.kind == 'argument':
      continue
    if r.shape == carry:
      count += 1
    elif r.shape[1:] == carry:
      count += r.shape[0]
  return count
