"""What is wrong with a comparison row's figures, in words: the analysis'
warnings of its policy (names the program does not have), a checkpointed
scan whose temporaries its schedule does not explain, FLOPs that are a
range or unknown, a peak that did not drop below no remat's (with the
residuals that hold it up), and what the lowering that keeps a merged
recompute would save. Each ``PolicyRow`` of ``compare`` carries its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from remat_explorer.analysis.policies.policy_info import NO_REMAT, policy_warnings
from remat_explorer.analysis.units import format_bytes, format_flops


def with_warnings(rows: list) -> list:
  """`rows` (``PolicyRow``s), each with its ``warnings`` set."""
  baseline = next((r for r in rows if r.policy is NO_REMAT and not r.failed), None)
  return [dataclasses.replace(r, warnings=tuple(dict.fromkeys(_row_warnings(r, baseline))))
          for r in rows]


def _row_warnings(row, baseline) -> list[str]:
  """A checkpointed scan whose compiled temporaries its schedule does not
  explain; a policy whose compiled peak is not below no remat's, with the
  residuals that hold it up (and XLA's merge of the recompute, if any)."""
  layouts = [c.temp_warning for c in row.scan_layouts if c.temp_warning]
  # The policy's own warnings first: one naming values the program does not
  # have (a typo) saves nothing it was meant to.
  analysis = _policy_warnings(row)
  return (analysis + layouts + _unknown_flops_warnings(row) + _branch_warnings(row)
          + _peak_warnings(row, baseline) + _kept_recompute_warnings(row))


def _policy_warnings(row) -> list[str]:
  """The analysis' warnings of the row's policy, worded for the row (which
  names the policy); a choice per block, as the analysis words them."""
  if row.report is None:
    return []
  if row.policy is None or row.policy is NO_REMAT or isinstance(row.policy, Mapping):
    return list(row.report.warnings)
  own = policy_warnings([row.policy], row.report.names_in_program, subject='this policy')
  others = policy_warnings([row.policy], row.report.names_in_program)
  return own + [w for w in row.report.warnings if w not in others]


def _kept_recompute_warnings(row) -> list[str]:
  kept = row.kept_recompute
  if kept is None or kept.peak_bytes is None or row.peak_bytes is None:
    return []
  keeps = (f"lowering='{kept.lowering}' keeps the recompute (XLA cannot merge work "
           'across a conditional)')
  if kept.peak_bytes >= row.peak_bytes:
    return [f'{keeps}, but its peak is no lower: {format_bytes(kept.peak_bytes)}.']
  flops = ''
  if kept.compiled_flops is not None and row.compiled_flops:
    flops = (f' at {format_flops(kept.compiled_flops)} '
             f'({kept.compiled_flops / row.compiled_flops - 1:+.0%} FLOPs)')
  return [f'{keeps}: peak {format_bytes(kept.peak_bytes)}, '
          f'{format_bytes(row.peak_bytes - kept.peak_bytes)} below this row\'s{flops}.']


def _branch_warnings(row) -> list[str]:
  low, high = row.costs.executed_flops_low, row.compiled_flops
  if row.failed or low is None or high is None or high - low <= 0.01 * high:
    return []
  return [f'FLOPs between {format_flops(low)} and {format_flops(high)}: a conditional '
          'runs one of its branches, decided as the program runs, and XLA counts the '
          'costliest; the front and the search rank by that upper count.']


def _unknown_flops_warnings(row) -> list[str]:
  if row.failed or not row.flops_unknown:
    return []
  count = row.costs.loops_of_unknown_trip_count
  return [f'FLOPs unknown: {count} loop(s) of the compiled program end on a value '
          '(a while_loop), so XLA cannot count their trips and each body is counted '
          'once; left off the Pareto front and the recommendation.']


def _peak_warnings(row, baseline) -> list[str]:
  if (baseline is None or row is baseline or row.failed or row.peak_bytes is None
      or row.peak_bytes < baseline.peak_bytes):
    return []
  return [f'compiled peak {row.peak_bytes:,} bytes is not below no remat\'s '
          f'{baseline.peak_bytes:,} bytes. Largest residuals besides arguments: '
          f'{_largest_residuals(row.report) or "none"}.'
          + (f' {row.recompute_eliminated}' if row.recompute_eliminated else '')]


def _largest_residuals(report, count: int = 3) -> str:
  """The `count` largest residuals besides arguments (alive anyway), those
  alike (a residual of every layer) as one item with how many."""
  if report is None:
    return ''
  alike: dict[str, list] = {}
  for r in report.residuals:
    if r.kind != 'argument':
      alike.setdefault(f'{r.type_string} {r.description}', []).append(r.device_bytes)
  largest = sorted(alike.items(), key=lambda kv: -max(kv[1]))[:count]
  return '; '.join(text + (f' (×{len(sizes)})' if len(sizes) > 1 else '')
                   for text, sizes in largest)
