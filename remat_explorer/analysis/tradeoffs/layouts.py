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
  outweigh the carries themselves). The expected temp is the schedule's
  carries plus every value one step creates (a bound on its working set);
  ``temp_warning`` says when XLA holds more than 1.25 times that, which
  means the compiled program does not keep the schedule;
* recomputed steps: the FLOPs the backward pass spends evaluating steps
  again inside the scope (the recompute, not its transpose), over the
  FLOPs of one step (the forward pass runs each step once, so its FLOPs
  inside the scope over n), from the jaxpr.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jax.extend.core import Var, jaxprs_in_params

from remat_explorer.analysis.split import flops as flop_count
from remat_explorer.analysis.xla.costs import CompiledCosts
from remat_explorer.analysis.split.report import RematReport
from remat_explorer.analysis.units import aval_bytes
from remat_explorer.analysis.units import element_bits
from remat_explorer.engine import (ScanScheduleCosts, ScanScope, parse_scan_scope,
                                   recomputes_primal, scan_schedule_costs)

_TYPE = re.compile(r'(\w+)\[([\d,]*)\]')


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
  """The FLOPs of the backward pass's recompute inside the scope over
  ``step_flops``; None when a step has no FLOPs."""
  temp_carries: float | None = None
  """XLA's compiled temporary memory over the carry's bytes."""
  step_carries: float | None = None
  """The bytes of every value one step creates, over the carry's bytes:
  a bound on the working set the backward pass adds to the carries."""
  input_carries: float | None = None
  """The bytes the scan reads (carry, `xs`, constants) over the carry's:
  the backward pass holds their cotangents."""

  @property
  def expected_temp_carries(self) -> float | None:
    """The schedule's carries held at once plus one step's working set."""
    if self.step_carries is None or self.input_carries is None:
      return None
    return self.predicted.stored_carries + self.step_carries + self.input_carries

  @property
  def temp_warning(self) -> str | None:
    """Set when XLA's temporaries exceed the expected by more than 25%."""
    expected = self.expected_temp_carries
    if self.temp_carries is None or expected is None or self.temp_carries <= 1.25 * expected:
      return None
    return (f'checkpointed_scan[{self.schedule}; n={self.steps}]: XLA holds '
            f'{self.temp_carries:,.1f} carries of temporaries, more than 1.25 times the '
            f"{expected:,.1f} the schedule explains ({self.predicted.stored_carries} carries, "
            f"one step's {self.step_carries:,.1f} and the cotangents of its inputs, "
            f'{self.input_carries:,.1f}): the compiled program keeps more than its schedule '
            '(copies per nesting level, or a recompute XLA merged into the forward pass).')


def scan_layouts(report: RematReport, costs: CompiledCosts | None = None
                 ) -> tuple[ScanLayoutCheck, ...]:
  """Every ``checkpointed_scan`` of `report`'s program, its predicted
  costs beside those measured (`costs` adds XLA's temporary memory)."""
  if report.forward_jaxpr is None:
    return ()
  found: dict[ScanScope, list] = {}
  _scoped_flops(report.forward_jaxpr.jaxpr, '', 1, found, lambda name: True)
  recomputed_flops: dict[ScanScope, list] = {}  # [flops, ...], the bytes unused
  if report.backward_jaxpr is not None:
    _scoped_flops(report.backward_jaxpr.jaxpr, '', 1, recomputed_flops, recomputes_primal)
  checks = []
  for scope, (flops, created, inputs) in found.items():
    schedule, n, carry = scope.schedule, scope.steps, scope.carry
    step_flops = flops // max(n, 1)
    carry_shapes = [_shape(t) for t in _TYPE.finditer(carry)]
    carry_bytes = sum(_bytes(t) for t in _TYPE.finditer(carry))
    recomputed = (recomputed_flops.get(scope, [0])[0] / step_flops
                  if step_flops else None)
    temp = (costs.temp_bytes / carry_bytes
            if costs is not None and not costs.failed and carry_bytes else None)
    checks.append(ScanLayoutCheck(
        schedule, n, carry, _predicted(n, schedule),
        _carry_residuals(report, carry_shapes[0] if carry_shapes else None),
        step_flops, recomputed, temp,
        created / max(n, 1) / carry_bytes if carry_bytes else None,
        inputs / carry_bytes if carry_bytes else None))
  return tuple(checks)


def _scoped_flops(jaxpr, outer: str, trips: int, found: dict, counted) -> None:
  """Add to `found[scope]` the FLOPs and the bytes created by the
  equations under each checkpointed_scan scope whose name stack is
  `counted`, loop trip counts applied, and the bytes of the values they
  read from outside the scope (its carry, `xs` and constants, whose
  cotangents the backward pass holds), each once."""
  created_here: dict[ScanScope, set] = {}
  for eqn in jaxpr.eqns:
    scope = f'{outer}/{eqn.source_info.name_stack}'
    subs = list(jaxprs_in_params(eqn.params))
    m = parse_scan_scope(scope)
    if m and counted(scope) and m != parse_scan_scope(outer):
      # The scope's outermost equations at this level: what they read
      # that no equation of the scope made is the scope's input.
      totals = found.setdefault(m, [0, 0, 0])
      made = created_here.setdefault(m, set())
      for v in eqn.invars:
        if isinstance(v, Var) and v not in made:
          made.add(v)
          totals[2] += aval_bytes(v.aval)
      made.update(eqn.outvars)
    if subs and not (m and eqn.primitive.name == 'cond'):  # a cond: its costliest branch
      times = trips * (eqn.params['length'] if eqn.primitive.name == 'scan' else 1)
      for sub in subs:
        _scoped_flops(sub, scope, times, found, counted)
      continue
    if m and counted(scope):
      totals = found.setdefault(m, [0, 0, 0])
      totals[0] += flop_count.eqn_flops(eqn) * trips
      totals[1] += sum(aval_bytes(v.aval) for v in eqn.outvars) * trips


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
  return size * element_bits(match.group(1)) // 8


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
