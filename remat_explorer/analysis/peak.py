"""Why is this buffer alive at the peak? Residual buffers at the compiled
program's memory peak, linked back to the residuals the analysis found.

The compiled program names buffers by HLO instruction; the analysis names
residuals by the JAX equation (and source line) that produced them. A
buffer is matched to a residual of the same size, preferring one from the
same source line (from the HLO metadata) and then one whose producer is the
buffer's instruction kind; the match says which rule made it.
"""

from __future__ import annotations

from dataclasses import dataclass

from remat_explorer.analysis.compiled import CompiledCosts
from remat_explorer.analysis.origins import relative_path
from remat_explorer.analysis.report import RematReport, Residual

# HLO instruction kinds that implement a JAX primitive under another name.
_HLO_KIND_OF = {'scan': 'while', 'while': 'while', 'dot_general': 'dot',
                'conv_general_dilated': 'convolution'}


@dataclass(frozen=True)
class PeakResidual:
  """A residual buffer live at the peak, with where it comes from."""
  buffer: str
  bytes: int
  residual: Residual | None
  matched_by: str
  """'source line', 'instruction kind', 'size', or 'unmatched'."""
  policy: str

  @property
  def recompute_flops_to_drop(self) -> int | None:
    """At least this many FLOPs would be recomputed if it were not saved."""
    return None if self.residual is None else self.residual.producer_flops


def residuals_at_peak(report: RematReport, costs: CompiledCosts) -> list[PeakResidual]:
  """Residual buffers live at the timeline's peak, largest first."""
  if costs.failed or costs.timeline is None:
    return []
  timeline = costs.timeline
  live = timeline.residuals_at(timeline.peak_step)
  unused = [r for r in report.residuals if r.kind != 'argument']
  found = []
  for buffer in sorted(live, key=lambda b: -b.bytes):
    residual, rule = _match(buffer, unused)
    if residual is not None:
      unused.remove(residual)
    found.append(PeakResidual(buffer.name, buffer.bytes, residual, rule, report.policy))
  return found


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
