"""Tables for layouts of nested checkpoints: each ``checkpointed_scan``'s
predicted costs beside the measured ones, and a report's blocks by nesting
level. Pure functions of analysis data to HTML."""

from __future__ import annotations

from remat_explorer.analysis import Comparison, RematReport
from remat_explorer.viz.html.tables import LABEL, TABLE, cells_html
from remat_explorer.viz.text import MISSING, format_bytes, format_flops, html_text

_HEADINGS = ('layout', 'schedule', 'steps', 'carry',
             'carries held at once (predicted)', 'carries kept by the forward pass (jaxpr)',
             'temp memory in carries (XLA)', 'temp memory in carries (expected)',
             'recomputed steps (predicted)',
             'recomputed steps (jaxpr)', 'levels')


def scan_layouts_html(comparison: Comparison) -> str:
  """One row per ``checkpointed_scan`` in the compared programs: the
  schedule's closed-form costs beside what the jaxpr and XLA show; '' when
  none of them runs one."""
  rows = [(row.label, check) for row in comparison.rows for check in row.scan_layouts]
  if not rows:
    return ''
  body = []
  for label, c in rows:
    cells = [label, c.schedule, str(c.steps), c.carry, str(c.predicted.stored_carries),
             str(c.forward_carries),
             MISSING if c.temp_carries is None else f'{c.temp_carries:.1f}',
             MISSING if c.expected_temp_carries is None else f'{c.expected_temp_carries:.1f}',
             str(c.predicted.recomputed_steps),
             MISSING if c.recomputed_steps is None else f'{c.recomputed_steps:.1f}',
             str(c.predicted.levels)]
    body.append('<tr>' + cells_html(cells, [LABEL]) + '</tr>')
  head = ''.join(f'<th>{h}</th>' for h in _HEADINGS)
  caption = ('Checkpointed scans: the schedule in theory (closed form) and as measured. '
             'Recomputed steps (jaxpr) are the backward pass\'s recompute FLOPs over one '
             'step\'s; temp memory in carries is XLA\'s temporaries over one carry; expected '
             'are the schedule\'s carries, one step\'s intermediates and the cotangents of '
             'the scan\'s inputs (more than 1.25 times that is warned of).')
  return (f'<table class="{TABLE} remat-layouts"><caption>{html_text(caption)}</caption>'
          f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def nesting_levels_html(report: RematReport) -> str:
  """The blocks of `report` by nesting depth; '' when none nests."""
  levels = report.levels()
  if len(levels) < 2:
    return ''
  head = ''.join(f'<th>{h}</th>' for h in (
      'level', 'blocks', 'runs per call', 'recompute FLOPs', 'residual bytes'))
  body = ''.join(
      '<tr>' + ''.join(f'<td>{html_text(x)}</td>' for x in (
          level.level, level.blocks,
          f'{level.runs}+' if level.unknown_runs else level.runs,
          format_flops(level.recompute_flops), format_bytes(level.residual_bytes)))
      + '</tr>' for level in levels)
  caption = (f'{report.function}: blocks by nesting level (0: inside no other block); '
             'a nested block\'s residuals are held while the backward pass runs '
             'through its parent')
  return (f'<table class="{TABLE} remat-levels"><caption>{html_text(caption)}</caption>'
          f'<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
