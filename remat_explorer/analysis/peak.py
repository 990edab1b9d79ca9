"""What is alive at the peak, and why: every buffer live at a step of the
compiled schedule (the peak by default), residuals linked back to the
residuals the analysis found.

The compiled program names buffers by HLO instruction; the analysis names
residuals by the JAX equation (and the user's line) that produced them. A
residual buffer is matched to a residual of the same size, preferring one
from the same source line (from the HLO metadata) and then one whose
producer is the buffer's instruction kind; the match says which rule made
it. Other buffers are described from the HLO alone: the pass that made
them (from JAX's name stack in the metadata) and JAX's source line.
"""

from __future__ import annotations

from dataclasses import dataclass

from remat_explorer.analysis.compiled import CompiledCosts
from remat_explorer.analysis.origins import relative_path
from remat_explorer.analysis.report import RematReport, Residual
from remat_explorer.analysis.timeline import Buffer, pass_of

# HLO instruction kinds that implement a JAX primitive under another name.
_HLO_KIND_OF = {'scan': 'while', 'while': 'while', 'dot_general': 'dot',
                'conv_general_dilated': 'convolution'}


@dataclass(frozen=True)
class PeakBuffer:
  """A buffer live at a step of the compiled schedule, with what it is."""
  buffer: str
  bytes: int
  kind: str
  """'residual', 'parameter', 'output', 'temporary' (a loop body's
  temporaries or output storage not yet written included)."""
  made_by: str
  """The pass whose instruction defined it: 'forward', 'backward',
  'recompute', or '' where the HLO does not say."""
  residual: Residual | None = None
  """For a residual buffer: the residual the analysis found, when matched."""
  matched_by: str = ''
  """How the residual was matched: 'source line', 'instruction kind',
  'size', or 'unmatched'."""
  source: str = ''
  """The user's line: the residual's, else JAX's line from the HLO."""
  policy: str = ''

  @property
  def name(self) -> str | None:
    return None if self.residual is None else self.residual.name

  @property
  def module_path(self) -> str:
    return '' if self.residual is None else self.residual.module_path

  @property
  def recompute_flops_to_drop(self) -> int | None:
    """At least this many FLOPs would be recomputed if it were not saved."""
    return None if self.residual is None else self.residual.producer_flops


PeakResidual = PeakBuffer
"""A residual buffer live at the peak (``residuals_at_peak``)."""


def live_at_peak(report: RematReport, costs: CompiledCosts,
                 step: int | None = None) -> list[PeakBuffer]:
  """Every device buffer live at `step` (the timeline's peak by default),
  largest first, residuals linked to the report's."""
  _check_order(report, costs)
  if costs.failed or costs.timeline is None:
    return []
  timeline = costs.timeline
  step = timeline.peak_step if step is None else step
  unused = [r for r in report.residuals if r.kind != 'argument']
  found = []
  for buffer in sorted(timeline.live_at(step), key=lambda b: -b.bytes):
    if buffer.memory_space:
      continue
    found.append(_describe(buffer, unused, report.policy))
  return found


def residuals_at_peak(report: RematReport, costs: CompiledCosts) -> list[PeakBuffer]:
  """The residual buffers live at the timeline's peak, largest first."""
  return [b for b in live_at_peak(report, costs) if b.kind == 'residual']


def _check_order(report, costs) -> None:
  if not isinstance(report, RematReport) or not isinstance(costs, CompiledCosts):
    raise TypeError(
        'expected (report, costs): a RematReport from analyze() and the '
        'CompiledCosts from compile_costs() of the same program and policy, '
        f'got ({type(report).__name__}, {type(costs).__name__}).')
  # Buffers are matched to residuals by size: another policy's report
  # would match some by accident, silently.
  said = lambda x: f'{x.function} under {x.policy or "its own policies"} ({x.lowering or "-"})'
  if ((report.function, report.policy, report.lowering)
      != (costs.function, costs.policy, costs.lowering)):
    raise ValueError(
        f'the report and the costs differ: the report is of {said(report)}, the costs of '
        f'{said(costs)}; pass analyze() and compile_costs() of the same function, '
        'policy and lowering.')


def _describe(buffer: Buffer, unused: list[Residual], policy: str) -> PeakBuffer:
  made_by = pass_of(buffer.op_name)
  if buffer.is_residual:
    residual, rule = _match(buffer, unused)
    if residual is not None:
      unused.remove(residual)
    source = (residual.source if residual is not None and residual.source
              else _hlo_source(buffer))
    return PeakBuffer(buffer.name, buffer.bytes, 'residual', made_by, residual,
                      rule, source, policy)
  kind = ('parameter' if buffer.is_parameter else 'output' if buffer.is_output
          else 'temporary')
  if buffer.is_parameter:
    made_by = ''  # an argument of the step, made by no pass
  return PeakBuffer(buffer.name, buffer.bytes, kind, made_by,
                    source=_hlo_source(buffer), policy=policy)


def _hlo_source(buffer: Buffer) -> str:
  if not buffer.source:
    return ''
  file, _, line = buffer.source.rpartition(':')
  return f'{relative_path(file)}:{line}'


def _match(buffer, residuals):
  # Buffers of a partitioned program hold one device's shard.
  same_size = [r for r in residuals if r.device_bytes == buffer.bytes]
  if buffer.source:
    file, _, line = buffer.source.rpartition(':')
    for r in same_size:
      if r.site is not None and (r.site.file, str(r.site.line)) == (relative_path(file), line):
        return r, 'source line'
  kind = buffer.op_name.rsplit('/', 1)[-1].split('.')[0]
  for r in same_size:
    # A value a loop carries out of its body is the loop's output in HLO.
    made_by = 'while' if r.carried_out_of else _HLO_KIND_OF.get(r.primitive, r.primitive)
    if made_by == kind:
      return r, 'instruction kind'
  if same_size:
    return same_size[0], 'size'
  return None, 'unmatched'
