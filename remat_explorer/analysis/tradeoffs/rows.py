"""The rows of a comparison: one policy's analysis beside XLA's compiled
figures (``PolicyRow``), the table of them with its Pareto front
(``Comparison``), and the labels of the program's own rows.

A row's FLOPs come in three counts: what the compiled program executes
(XLA's count of each computation, loop bodies once per trip:
``compiled_flops``, what the Pareto front, the charts, the recommendation
and the search rank by), what the jaxpr asks for (scan trip counts applied:
``flops``; XLA may merge or drop some of it), and XLA's ``cost_analysis``
as it reports it (a loop's body once: ``xla_flops``).

For a sharded program, compiled bytes, XLA's FLOPs and the collectives are
per device (one device's partitioned executable); residual bytes come both
global and per device, and the jaxpr's FLOPs are the whole program's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax

from remat_explorer.analysis.errors import error_summary
from remat_explorer.analysis.policies.policy_info import NO_REMAT
from remat_explorer.analysis.program.blocks import DEFAULT_LOWERING
from remat_explorer.analysis.program.problem import function_name
from remat_explorer.analysis.split.report import RematReport, plain_data
from remat_explorer.analysis.tradeoffs.layouts import scan_layouts
from remat_explorer.analysis.tradeoffs.merged_recompute import recompute_eliminated
from remat_explorer.analysis.xla.costs import CompiledCosts

FLOPS_USED_BY_CHARTS = 'compiled (executed, loops counted)'
"""Charts plot the FLOPs the compiled program executes (``ranked_flops``)."""


@dataclass(frozen=True)
class KeptRecompute:
  """A row's policy compiled under the lowering that keeps its recompute
  (XLA cannot merge work across a conditional), where the row's own
  lowering let XLA merge it away."""
  lowering: str
  peak_bytes: int | None
  compiled_flops: float | None


KEEPS_RECOMPUTE = 'cond'
"""The lowering measured beside a row whose recompute XLA merged away."""


@dataclass(frozen=True)
class PolicyRow:
  """One policy: the analysis and XLA's compiled figures.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> row = rx.compare(f, w, x, policies=['dots_saveable']).row('dots_saveable')
    >>> row.failed, row.residual_bytes, row.peak_bytes > 0
    (False, 4096, True)
  """
  label: str
  policy: Any = dataclasses.field(repr=False, compare=False)
  report: RematReport | None = dataclasses.field(repr=False, compare=False)
  costs: CompiledCosts = dataclasses.field(repr=False, compare=False)
  residual_bytes: int | None
  flops: int | None
  """Forward + backward FLOPs from the jaxpr, trip counts applied."""
  recompute_flops: int | None
  xla_flops: float | None
  """XLA's ``cost_analysis()``: each loop's body once."""
  temp_bytes: int | None
  peak_bytes: int | None
  """Compiled, per device."""
  compile_seconds: float | None
  run_seconds: float | None
  failed: bool
  recompute_eliminated: str | None = None
  """Set when XLA merged recomputed matmuls away: the policy's memory saving
  then does not happen, whatever the jaxpr says."""
  on_pareto_front: bool = False
  residual_bytes_per_device: int | None = None
  """What one device keeps (``residual_bytes`` unless sharded)."""
  collectives: int | None = None
  """Collective executions per step in the compiled program."""
  recompute_collectives: int | None = None
  """Of those, the ones the recompute re-runs in the backward pass."""
  scan_layouts: tuple = ()
  """For each ``checkpointed_scan`` in the program, its schedule's
  predicted costs beside the measured ones (``layouts.ScanLayoutCheck``)."""
  warnings: tuple[str, ...] = ()
  """What is wrong with this row's figures, each once, without the label
  (``Comparison.warnings`` holds them with it)."""
  compiled_flops: float | None = None
  """FLOPs the compiled program executes (per device), loops counted."""
  kept_recompute: KeptRecompute | None = None
  """Where XLA merged the recompute away (``recompute_eliminated``), the
  same policy compiled under ``KEEPS_RECOMPUTE``: what keeping it saves."""

  @property
  def flops_unknown(self) -> bool:
    """The compiled program runs a loop whose trip count XLA cannot infer (a
    ``while_loop`` that ends on a value): no count of its FLOPs is whole."""
    return self.costs is not None and self.costs.loops_of_unknown_trip_count > 0

  @property
  def ranked_flops(self) -> float | None:
    """The FLOPs rows are ranked by: what the compiled program executes,
    else (no compiled count) what the jaxpr asks for; None where the
    program's loops make every count partial (``flops_unknown``)."""
    if self.flops_unknown:
      return None
    if self.compiled_flops is not None:
      return self.compiled_flops
    return self.flops if self.flops is not None else self.xla_flops


@dataclass(frozen=True)
class Comparison:
  """What ``compare`` measured: a row per policy (or per function), the
  program as written and without remat first, and the Pareto front.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> comparison = rx.compare(f, w, x, policies=['dots_saveable'])
    >>> [row.label for row in comparison.rows], comparison.baseline.label
    (['as written', 'no remat', 'dots_saveable'], 'no remat')
  """
  function: str
  device_kind: str
  platform: str
  rows: tuple[PolicyRow, ...]
  warnings: tuple[str, ...]
  """Every row's warnings, each starting with ``'<label>: '``; the rows'
  ``warnings`` hold the same without the label."""
  flops_used_by_charts: str = FLOPS_USED_BY_CHARTS
  num_devices: int = 1
  """Devices each compiled program is partitioned over."""
  mesh_shape: tuple[tuple[str, int], ...] | None = None
  device_memory_bytes: int | None = None
  """One device's memory (``CompiledCosts.device_memory_bytes``); None on the CPU."""

  @property
  def baseline(self) -> PolicyRow | None:
    return next((r for r in self.rows if r.policy is NO_REMAT), None)

  @property
  def pareto_front(self) -> tuple[PolicyRow, ...]:
    return tuple(r for r in self.rows if r.on_pareto_front)

  def row(self, label: str) -> PolicyRow:
    for r in self.rows:
      if r.label == label:
        return r
    raise KeyError(f'no policy {label!r} in this comparison; it has '
                   f'{[r.label for r in self.rows]}')

  def to_dict(self) -> dict:
    out = plain_data(dataclasses.replace(self, rows=()))
    out['rows'] = [dict(plain_data(r), costs=r.costs.to_dict(),
                        report=None if r.report is None else r.report.to_dict())
                   for r in self.rows]
    return out


AS_WRITTEN = 'as written'
"""The label of the program's own policies, unchanged."""
AS_WRITTEN_NO_REMAT = 'as written (no remat)'
"""The label of a program without a remat block, as it is."""
NO_REMAT_LABEL = 'no remat'
"""The label of the program with its remat blocks removed."""


def failed_costs(fn, label, lowering, e: Exception) -> CompiledCosts:
  """The row of a step that failed before XLA gave figures: `e`, said in one line."""
  device = jax.devices()[0]
  return CompiledCosts(function=function_name(fn), policy=label,
                       lowering=lowering or DEFAULT_LOWERING, platform=device.platform,
                       device_kind=device.device_kind, failed=True,
                       error=error_summary(e, one_line=True))


def policy_row(label, policy, report, costs) -> PolicyRow:
  """The row of `policy`: its analysis `report` (None if it failed first)
  beside XLA's `costs`."""
  if report is None:  # it failed before XLA had a program
    return PolicyRow(label=label, policy=policy, report=None, costs=costs,
                     residual_bytes=None, flops=None, recompute_flops=None,
                     xla_flops=None, temp_bytes=None, peak_bytes=None,
                     compile_seconds=None, run_seconds=None, failed=True)
  flops, recompute, residual = report.total_flops, report.recompute_flops, report.residual_bytes
  layouts = scan_layouts(report, costs)
  # The binomial schedule recomputes in a loop of its own, not in blocks:
  # its recompute is measured in the backward pass (``layouts.py``).
  recompute += sum(round(c.recomputed_steps * c.step_flops) for c in layouts
                   if c.schedule.startswith('binomial') and c.recomputed_steps)
  return PolicyRow(
      label=label, policy=policy, report=report, costs=costs,
      residual_bytes=residual, flops=flops, recompute_flops=recompute,
      xla_flops=costs.xla_flops, temp_bytes=costs.temp_bytes,
      peak_bytes=costs.peak_bytes, compile_seconds=costs.compile_seconds,
      run_seconds=costs.run_seconds, failed=costs.failed,
      recompute_eliminated=recompute_eliminated(report, costs),
      residual_bytes_per_device=report.residual_bytes_per_device,
      collectives=None if costs.failed else costs.collective_count,
      recompute_collectives=None if costs.failed else costs.recompute_collective_count,
      scan_layouts=layouts, compiled_flops=costs.executed_flops)


def mark_pareto_front(rows: list[PolicyRow]) -> list[PolicyRow]:
  """A row is on the front if no other row is at least as good on both peak
  memory and FLOPs and better on one."""
  usable = [r for r in rows if not r.failed and r.peak_bytes is not None
            and r.ranked_flops is not None]

  def dominated(r):
    return any(o.peak_bytes <= r.peak_bytes and o.ranked_flops <= r.ranked_flops
               and (o.peak_bytes < r.peak_bytes or o.ranked_flops < r.ranked_flops)
               for o in usable)
  front = {id(r) for r in usable if not dominated(r)}
  return [dataclasses.replace(r, on_pareto_front=id(r) in front) for r in rows]
