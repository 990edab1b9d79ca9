"""HTML tables and jaxpr listings: pure functions from analysis data to HTML.

Every value that comes from the user's program (names, sources, shapes of
their arrays, jaxpr text) goes through ``html_text``.
"""

from __future__ import annotations

import re
from typing import Iterable

from remat_explorer.analysis.compare import Comparison
from remat_explorer.analysis.report import RematReport, Residual
from remat_explorer.analysis.sharding import mesh_text
from remat_explorer.viz.text import (MISSING, format_bytes, format_flops, format_seconds,
                                     html_text)

RESIDUAL_SORT_KEYS = {
    'bytes': lambda r: r.bytes,
    'index': lambda r: r.index,
    'origin': lambda r: (r.kind, r.name or '', r.primitive or '', r.index),
    'block': lambda r: (r.block or '', r.index),
    'source': lambda r: (r.source or '', r.index),
}
"""How ``residual_table_html`` can order its rows."""
MAX_JAXPR_LINES = 4000


def residual_table_html(report: RematReport, *, sort_by: str = 'bytes',
                        descending: bool | None = None) -> str:
  """The residuals of `report` as an HTML table, one row each: shape, dtype,
  bytes, origin, ``checkpoint_name``, block and source line; for a sharded
  program also each residual's sharding and the shard one device keeps.

  `sort_by` is one of ``RESIDUAL_SORT_KEYS``; bytes sort largest first
  unless `descending` says otherwise.
  """
  if sort_by not in RESIDUAL_SORT_KEYS:
    raise ValueError(f'sort_by={sort_by!r} is not one of {sorted(RESIDUAL_SORT_KEYS)}')
  if descending is None:
    descending = sort_by == 'bytes'
  rows = sorted(report.residuals, key=RESIDUAL_SORT_KEYS[sort_by], reverse=descending)
  sharded = any(r.sharding is not None for r in report.residuals)
  headings = ['#', 'shape', 'dtype', 'bytes', 'origin', 'name', 'block', 'source line']
  if sharded:
    headings[4:4] = ['sharding', 'per device']
  head = ''.join(f'<th>{h}</th>' for h in headings)
  body = ''.join(_residual_row(r, sharded) for r in rows)
  total = sum(r.bytes for r in report.residuals)
  caption = (f'{len(rows)} residuals, {format_bytes(total)} under policy '
             f'{html_text(report.policy)}, sorted by {sort_by}')
  if sharded:
    caption += (f'; {format_bytes(report.residual_bytes_per_device)} per device on '
                f'{report.num_devices} device(s)'
                + (f', mesh {html_text(mesh_text(report.mesh_shape))}'
                   if report.mesh_shape else ''))
  return (f'<table class="remat-residual-table"><caption>{caption}</caption>'
          f'<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def _residual_row(r: Residual, sharded: bool = False) -> str:
  origin = r.argument if r.kind == 'argument' and r.argument else (r.primitive or r.kind)
  if r.memory_space != 'device':
    origin += f' (offloaded to {r.memory_space})'
  cells = [str(r.index), str(r.shape), r.dtype, f'{r.bytes:,} ({format_bytes(r.bytes)})',
           origin, r.name or '', r.block or '', r.source or '']
  if sharded:
    cells[4:4] = [r.sharding or MISSING, _per_device_cell(r)]
  return '<tr>' + ''.join(f'<td>{html_text(c)}</td>' for c in cells) + '</tr>'


def _per_device_cell(r: Residual) -> str:
  if r.per_device_shape is None:
    return MISSING
  return (f'{r.per_device_shape} {r.per_device_bytes:,} '
          f'({format_bytes(r.per_device_bytes)})')


def comparison_table_html(comparison: Comparison) -> str:
  """One row per policy: residual, temp and peak bytes, FLOPs (the jaxpr's
  and XLA's), compile and run time, the Pareto front and any flag; for a
  program partitioned over several devices also the residual bytes per
  device and the collectives (those the recompute re-runs in brackets)."""
  sharded = comparison.num_devices > 1
  headings = ['policy', 'residual bytes', 'compiled temp', 'compiled peak', 'FLOPs (jaxpr)',
              'FLOPs (XLA)', 'recompute FLOPs', 'compile', 'run', 'Pareto', 'notes']
  if sharded:
    headings[2:6] = ['residual bytes / device', 'compiled temp / device',
                     'compiled peak / device', 'collectives (recompute)', 'FLOPs (jaxpr)',
                     'FLOPs (XLA) / device']
  head = ''.join(f'<th>{h}</th>' for h in headings)
  body = []
  for r in comparison.rows:
    if r.failed:
      note = f'compile failed: {r.costs.error}'
    else:
      note = r.recompute_eliminated or ''
    cells = [r.label, format_bytes(r.residual_bytes), format_bytes(r.temp_bytes),
             format_bytes(r.peak_bytes), format_flops(r.flops), format_flops(r.xla_flops),
             format_flops(r.recompute_flops), format_seconds(r.compile_seconds),
             format_seconds(r.run_seconds), '✓' if r.on_pareto_front else '', note]
    if sharded:
      collectives = (MISSING if r.collectives is None
                     else f'{r.collectives} ({r.recompute_collectives})')
      cells[2:4] = [format_bytes(r.residual_bytes_per_device), *cells[2:4], collectives]
    css = ' class="pareto"' if r.on_pareto_front else ''
    body.append(f'<tr{css}>' + ''.join(f'<td>{html_text(c)}</td>' for c in cells) + '</tr>')
  caption = (f'{html_text(comparison.function)} on {html_text(comparison.device_kind)}; '
             f'charts use the {html_text(comparison.flops_used_by_charts)} FLOP count')
  if sharded:
    caption += (f'; partitioned over {comparison.num_devices} devices'
                + (f' (mesh {html_text(mesh_text(comparison.mesh_shape))})'
                   if comparison.mesh_shape else '')
                + ', compiled figures per device')
  return (f'<table class="remat-comparison-table"><caption>{caption}</caption>'
          f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


# -- jaxprs -------------------------------------------------------------------------------

def jaxpr_html(jaxpr, *, highlight_inputs: Iterable[int] = (),
               highlight_outputs: Iterable[int] = ()) -> str:
  """`jaxpr` as escaped, preformatted text, with the variables that are its
  inputs or outputs at the given positions marked wherever they appear."""
  text = str(jaxpr)
  lines = text.splitlines()
  if len(lines) > MAX_JAXPR_LINES:
    cut = len(lines) - MAX_JAXPR_LINES
    half = MAX_JAXPR_LINES // 2
    lines = lines[:half] + [f'    … {cut} lines not shown …'] + lines[-half:]
  names = _names_at(text, highlight_inputs, highlight_outputs)
  escaped = html_text('\n'.join(lines))
  if names:
    pattern = re.compile(r'(?<![\w.])(' + '|'.join(map(re.escape, sorted(names))) + r')(?![\w\[])')
    escaped = pattern.sub(r'<mark class="residual">\1</mark>', escaped)
  return f'<pre class="remat-jaxpr">{escaped}</pre>'


def report_jaxprs_html(report: RematReport) -> str:
  """The forward and backward jaxprs of `report`, residuals marked: the
  forward pass's last outputs and the backward pass's first inputs."""
  forward, backward = report.forward_jaxpr, report.backward_jaxpr
  n = len(report.residuals)
  num_fwd_outs = len(forward.jaxpr.outvars)
  return ('<h4>Forward (known)</h4>'
          + jaxpr_html(forward, highlight_outputs=range(num_fwd_outs - n, num_fwd_outs))
          + '<h4>Backward (staged)</h4>'
          + jaxpr_html(backward, highlight_inputs=range(n)))


_HEADER = re.compile(r'\{\s*lambda\s*([^;]*);([^.]*)\.\s*let', re.S)
_OUTPUTS = re.compile(r'\bin\s*\(([^()]*)\)\s*\}\s*$', re.S)


def _names_at(text: str, inputs: Iterable[int], outputs: Iterable[int]) -> set[str]:
  """Printed variable names of the top-level inputs/outputs at the given
  positions, read from the jaxpr's text (its header and final ``in (...)``)."""
  names: set[str] = set()
  inputs, outputs = list(inputs), list(outputs)
  header = _HEADER.search(text)
  if inputs and header:
    invars = [tok.split(':')[0] for tok in header.group(2).split()]
    names.update(invars[i] for i in inputs if i < len(invars))
  tail = _OUTPUTS.search(text)
  if outputs and tail:
    outvars = [tok.strip() for tok in tail.group(1).split(',') if tok.strip()]
    names.update(outvars[i] for i in outputs
                 if i < len(outvars) and re.fullmatch(r'[a-z_]\w*', outvars[i]))
  names.discard(MISSING)
  return names
