"""HTML tables and jaxpr listings: pure functions from analysis data to HTML.

Every value that comes from the user's program (names, sources, shapes of
their arrays, jaxpr text) goes through ``html_text``.
"""

from __future__ import annotations

import re
from typing import Iterable

from remat_explorer.analysis import Comparison, RematReport, Residual, full_path, mesh_text
from remat_explorer.viz.charts._figures import short_label
from remat_explorer.viz.text import (MISSING, format_bytes, format_flops, format_seconds,
                                     html_text, memory_share_text, unique_lines)

RESIDUAL_SORT_KEYS = {
    'bytes': lambda r: r.bytes,
    'index': lambda r: r.index,
    'origin': lambda r: (r.kind, r.name or '', r.primitive or '', r.index),
    'block': lambda r: (r.block or '', r.index),
    'source': lambda r: (r.source or '', r.index),
}
"""How ``residual_table_html`` can order its rows."""
MAX_JAXPR_LINES = 4000

TABLE = 'remat-table'
"""Class of every table here; `TABLE_CSS` lays them out."""
WRAP = 'remat-wrap'
"""Class of a cell whose text may break anywhere: names, module paths,
source lines and policy expressions, which often hold no space."""
LABEL = 'remat-label'
"""Class of a row's label (a policy, a layout): wraps, within a width."""
TABLE_CSS = f"""
/* Tables fit their container (the report's page, a notebook cell): figures
   stay on one line, text that can be long wraps (at spaces, and after the
   '_', '/', '.' of names and paths, ``breakable_html``; inside a word only
   where one is wider than its column), and a label column keeps a
   readable width. */
table.{TABLE} {{ width: 100%; border-collapse: collapse; }}
table.{TABLE} th {{ white-space: normal; vertical-align: bottom; }}
table.{TABLE} td {{ white-space: nowrap; vertical-align: top; }}
table.{TABLE} td.{WRAP}, table.{TABLE} td.{LABEL} {{ white-space: normal;
  overflow-wrap: break-word; }}
/* The label column takes up to 30% of the table (its text breaks inside
   names only when a name is wider than that); the figures share the rest. */
table.{TABLE} td.{LABEL} {{ min-width: 8em; width: 30%; }}
/* A row's notes span the table under its figures: a long warning takes a
   few wide lines rather than a narrow column many lines tall. */
table.{TABLE} tr.remat-notes td {{ white-space: normal; overflow-wrap: anywhere;
  color: #555; font-size: 0.9em; padding-left: 1.5em; border-top: none; }}
table.{TABLE} tr.remat-has-notes td {{ border-bottom: none; }}
"""
"""The tables' layout, in the Explorer's and the report's style alike."""


# After these, a name or path may break: module paths, source lines,
# policy expressions and buffer names have few spaces.
_BREAK_AFTER = re.compile(r'([_/.,:(\[=·])(?=\w)')


def breakable_html(text) -> str:
  """`text` escaped, with a ``<wbr>`` (a line break the browser may take;
  not copied with the text) after each '_', '/', '.', ... inside it."""
  return _BREAK_AFTER.sub(r'\1<wbr>', html_text(text))


class Titled(str):
  """A cell's text with its tooltip: what the cell shortens, in full."""
  tooltip: str

  def __new__(cls, text: str, tooltip: str):
    cell = super().__new__(cls, text)
    cell.tooltip = tooltip
    return cell


def source_cell(source: str | None) -> str:
  """A source line's cell (``file:line (function)``): where its file is
  shown shortened (relative to the user's project, or by its module's
  name), the line with the file's whole path as its tooltip."""
  whole = full_path(source) if source else None
  if whole is None:
    return source or ''
  return Titled(source, whole)


def cells_html(cells, classes=()) -> str:
  """``<td>``s of `cells` (escaped), each with its class from `classes`
  (positionally; '' or missing: none) and its tooltip if it has one
  (``Titled``); a wrapping cell's text breaks after the '_', '/', '.' of
  its names (``breakable_html``)."""
  def cell(css, value):
    text = breakable_html(value) if css in (WRAP, LABEL) else html_text(value)
    tooltip = getattr(value, 'tooltip', None)
    attributes = (f' class="{css}"' if css else '') + (
        f' title="{html_text(tooltip)}"' if tooltip else '')
    return f'<td{attributes}>{text}</td>'
  classes = list(classes) + [''] * (len(cells) - len(classes))
  return ''.join(map(cell, classes, cells))


def residual_table_html(report: RematReport, *, sort_by: str = 'bytes',
                        descending: bool | None = None) -> str:
  """The residuals of `report` as an HTML table, one row each: shape, dtype,
  bytes, origin, ``checkpoint_name``, block and source line; for a sharded
  program also each residual's sharding and the shard one device keeps.

  `sort_by` is one of ``RESIDUAL_SORT_KEYS``; bytes sort largest first
  unless `descending` says otherwise.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> report = rx.analyze(loss_fn, *args)
    >>> html = viz.residual_table_html(report, sort_by='bytes')
    >>> html.count('<tr') == len(report.residuals) + 1, 'layer_<wbr>output' in html
    (True, True)
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
  headings, cells = drop_empty_columns(headings, [_residual_cells(r, sharded) for r in rows],
                                       keep=('#',))
  head = ''.join(f'<th>{h}</th>' for h in headings)
  wrapped = [WRAP if h in _RESIDUAL_WRAPPED else '' for h in headings]
  body = ''.join('<tr>' + cells_html(row, wrapped) + '</tr>' for row in cells)
  total = sum(r.bytes for r in report.residuals)
  caption = (f'{len(rows)} residuals, {format_bytes(total)} under policy '
             f'{html_text(report.policy)} (lowering {html_text(report.lowering)}), '
             f'sorted by {sort_by}')
  if sharded:
    caption += (f'; {format_bytes(report.residual_bytes_per_device)} per device on '
                f'{report.num_devices} device(s)'
                + (f', mesh {html_text(mesh_text(report.mesh_shape))}'
                   if report.mesh_shape else ''))
  return (f'<table class="{TABLE} remat-residual-table"><caption>{caption}</caption>'
          f'<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


_RESIDUAL_WRAPPED = ('sharding', 'origin', 'name', 'block', 'source line')
"""Residual columns that may break anywhere (argument paths, module
paths, source lines); shapes and figures stay on one line."""


def _residual_cells(r: Residual, sharded: bool = False) -> list[str]:
  origin = r.argument if r.kind == 'argument' and r.argument else (r.primitive or r.kind)
  if r.memory_space != 'device':
    origin += f' (offloaded to {r.memory_space})'
  cells = [str(r.index), str(r.shape), r.dtype, f'{r.bytes:,} ({format_bytes(r.bytes)})',
           origin, r.name or '', r.block or '', source_cell(r.source)]
  if sharded:
    cells[4:4] = [r.sharding or MISSING, _per_device_cell(r)]
  return cells


def drop_empty_columns(headings: list[str], rows: list[list[str]], *,
                       keep: Iterable[str] = ()) -> tuple[list[str], list[list[str]]]:
  """`headings` and `rows` without the columns that hold nothing (blank or
  ``MISSING``) in any row, such as run times when nothing was run; the
  columns named in `keep` stay."""
  keep = set(keep)
  kept = [i for i, h in enumerate(headings)
          if h in keep or any(row[i] not in ('', MISSING) for row in rows)]
  return [headings[i] for i in kept], [[row[i] for i in kept] for row in rows]


def _per_device_cell(r: Residual) -> str:
  if r.per_device_shape is None:
    return MISSING
  return (f'{r.per_device_shape} {r.per_device_bytes:,} '
          f'({format_bytes(r.per_device_bytes)})')


LABEL_CHARS = 64
"""The most of a policy's label its cell shows: a few lines of its column."""


def comparison_table_html(comparison: Comparison) -> str:
  """One row per policy: residual, temp and peak bytes, FLOPs (what the
  compiled program executes, loops counted, and what the jaxpr asks for),
  compile and run time and the Pareto front; for a program partitioned
  over several devices also the residual bytes per device and the
  collectives (those the recompute re-runs in brackets). A policy's notes
  (``row_note``: why it failed, its warnings) follow its row, across the
  table; a label longer than `LABEL_CHARS` is cut in its cell and given
  whole there, so that no row grows tall.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> html = viz.comparison_table_html(rx.compare(loss_fn, *args, policies=['dots_saveable']))
    >>> html.startswith('<table'), 'dots_<wbr>saveable' in html
    (True, True)
  """
  sharded = comparison.num_devices > 1
  headings = ['policy', 'residual bytes', 'compiled temp', 'compiled peak',
              'FLOPs (compiled)', 'FLOPs (jaxpr)', 'recompute FLOPs', 'compile', 'run', 'Pareto',
              'of device memory']
  if sharded:
    headings[2:6] = ['residual bytes / device', 'compiled temp / device',
                     'compiled peak / device', 'collectives (recompute)',
                     'FLOPs (compiled) / device', 'FLOPs (jaxpr)']
  rows, classes, notes = [], [], []
  for r in comparison.rows:
    label = short_label(r.label, LABEL_CHARS)
    cells = [label, format_bytes(r.residual_bytes), format_bytes(r.temp_bytes),
             format_bytes(r.peak_bytes), format_flops(r.compiled_flops), format_flops(r.flops),
             format_flops(r.recompute_flops), format_seconds(r.compile_seconds),
             format_seconds(r.run_seconds), '✓' if r.on_pareto_front else '',
             memory_share_text(r.peak_bytes, comparison.device_memory_bytes)]
    if sharded:
      collectives = (MISSING if r.collectives is None
                     else f'{r.collectives} ({r.recompute_collectives})')
      cells[2:4] = [format_bytes(r.residual_bytes_per_device), *cells[2:4], collectives]
    rows.append(cells)
    note = row_note(r)
    if label != r.label:
      note = f'policy {r.label}' + (f': {note}' if note else '')
    notes.append(note)
    classes.append((['pareto'] if r.on_pareto_front else [])
                   + (['remat-has-notes'] if notes[-1] else []))
  headings, rows = drop_empty_columns(headings, rows, keep=('policy',))
  head = ''.join(f'<th>{h}</th>' for h in headings)
  body = []
  for css, cells, note in zip(classes, rows, notes):
    body.append((f'<tr class="{" ".join(css)}">' if css else '<tr>')
                + cells_html(cells, [LABEL]) + '</tr>')
    if note:
      body.append(f'<tr class="remat-notes"><td colspan="{len(headings)}">'
                  f'{html_text(note)}</td></tr>')
  lowering = comparison_lowering(comparison)
  memory = comparison.device_memory_bytes
  caption = (f'{html_text(comparison.function)} on {html_text(comparison.device_kind)}'
             + (f' ({format_bytes(memory)} each)' if memory else '')
             + (f', lowering {html_text(lowering)}' if lowering else '')
             + f'; charts use the {html_text(comparison.flops_used_by_charts)} FLOP count')
  if sharded:
    caption += (f'; partitioned over {comparison.num_devices} devices'
                + (f' (mesh {html_text(mesh_text(comparison.mesh_shape))})'
                   if comparison.mesh_shape else '')
                + ', compiled figures per device')
  return (f'<table class="{TABLE} remat-comparison-table"><caption>{caption}</caption>'
          f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def comparison_lowering(comparison: Comparison) -> str | None:
  """The lowering the comparison's rows were analyzed under (one for all)."""
  lowerings = {r.report.lowering for r in comparison.rows if r.report is not None}
  return lowerings.pop() if len(lowerings) == 1 else None


def row_note(row) -> str:
  """The notes cell of a comparison row: why it failed (the first line of
  XLA's message: an XLA:GPU error can quote a page of HLO, which
  ``row.costs.error`` holds whole), else its warnings (repeats folded,
  ``text.unique_lines``), else XLA's merge of its recompute (which a
  warning repeats when there is one)."""
  if row.failed:
    return f'compile failed: {row.costs.error_line}'
  return ' '.join(unique_lines(row.warnings)) or row.recompute_eliminated or ''


def costs_table_html(costs, baseline=None) -> str:
  """XLA's figures for one compiled step (``CompiledCosts``), exact and
  humanised: device, compiled peak, temporaries, arguments and outputs,
  no remat's peak beside it (`baseline`), FLOPs executed (loops counted)
  and XLA's own count (loop bodies once), compile time."""
  def both(value, formatter):
    return f'{value:,} ({formatter(value)})' if value is not None else MISSING
  no_remat = (MISSING if baseline is None or baseline.failed
              else both(baseline.peak_bytes, format_bytes))
  rows = [('device', costs.device_kind),
          ('device memory', both(costs.device_memory_bytes, format_bytes)),
          ('peak bytes', both(costs.peak_bytes, format_bytes)),
          ('peak of device memory',
           memory_share_text(costs.peak_bytes, costs.device_memory_bytes) or MISSING),
          ('temp bytes', both(costs.temp_bytes, format_bytes)),
          ('argument bytes', both(costs.argument_bytes, format_bytes)),
          ('output bytes', both(costs.output_bytes, format_bytes)),
          ('no-remat peak bytes', no_remat),
          ('FLOPs executed (loops counted)',
           both(costs.executed_flops and int(costs.executed_flops), format_flops)),
          ('XLA cost_analysis FLOPs (loop bodies once)',
           both(costs.xla_flops and int(costs.xla_flops), format_flops)),
          ('compile time', format_seconds(costs.compile_seconds))]
  body = ''.join(f'<tr><td>{k}</td><td>{html_text(v)}</td></tr>' for k, v in rows)
  return f'<table class="remat-costs-table"><tbody>{body}</tbody></table>'


# -- what is live at a step --------------------------------------------------------------

PEAK_TOP = 10
"""Rows of the peak table: the largest buffers, ..."""
PEAK_RESIDUALS = 5
"""... and the largest residuals, whatever their rank."""


def shown_buffers(rows, top: int = PEAK_TOP, residuals: int = PEAK_RESIDUALS) -> list:
  """The rows a table of live buffers lists: the `top` largest and the
  `residuals` largest residuals (the buffers a policy decides), largest
  first; `rows` are ``live_at_peak``'s, largest first."""
  keep = set(range(min(top, len(rows))))
  keep.update([i for i, r in enumerate(rows) if r.kind == 'residual'][:residuals])
  return [rows[i] for i in sorted(keep)]


PEAK_HEADINGS = ('bytes', 'kind', 'holds', 'module path', 'source line', 'made by',
                 'FLOPs to drop', 'buffer')
"""The columns of a table of live buffers; `peak_cells` fills them."""
PEAK_WRAPPED = ('holds', 'source line', 'buffer')
"""Columns whose text may break anywhere (long paths without spaces, what
a loop's temporaries hold); the others (figures, kinds, module paths) stay
on one line."""


def peak_cells(r) -> list[str]:
  """A live buffer (``PeakBuffer``) as the text of `PEAK_HEADINGS`' columns."""
  return [f'{r.bytes:,} ({format_bytes(r.bytes)})', r.kind, r.holds(), r.module_path,
          source_cell(r.source), r.made_by, format_flops(r.recompute_flops_to_drop), r.buffer]


def live_summary(rows) -> str:
  """'58 buffers, 736 KiB; residuals 145 KiB'."""
  held = sum(r.bytes for r in rows if r.kind == 'residual')
  return (f'{len(rows)} buffers, {format_bytes(sum(r.bytes for r in rows))}; residuals '
          f'{format_bytes(held)}')


def peak_table_html(rows, *, caption: str = '', top: int = PEAK_TOP,
                    residuals: int = PEAK_RESIDUALS) -> str:
  """The buffers live at one step (``live_at_peak``), as an HTML table:
  bytes, kind, ``checkpoint_name``, module path, user source line, the
  pass that made it, the FLOPs dropping it would cost (a residual's
  producer), XLA's buffer. The largest rows are listed
  (``shown_buffers``); the rest are summed up by kind in a last row.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> report, costs = rx.analyze(loss_fn, *args), rx.compile_costs(loss_fn, *args)
    >>> html = viz.peak_table_html(rx.live_at_peak(report, costs))
    >>> html.startswith('<table'), 'params[' in html
    (True, True)
  """
  shown = shown_buffers(rows, top, residuals)
  headings, cells = drop_empty_columns(list(PEAK_HEADINGS), [peak_cells(r) for r in shown],
                                       keep=('bytes', 'kind', 'buffer'))
  head = ''.join(f'<th>{h}</th>' for h in headings)
  wrapped = [WRAP if h in PEAK_WRAPPED else '' for h in headings]
  body = ''.join(f'<tr class="remat-live-{html_text(r.kind)}">' + cells_html(row, wrapped)
                 + '</tr>' for r, row in zip(shown, cells))
  rest = rest_text(rows, shown)
  if rest:
    body += f'<tr class="remat-live-rest"><td colspan="{len(headings)}">{html_text(rest)}</td></tr>'
  summary = live_summary(rows)
  caption = f'{html_text(caption)}: {summary}' if caption else summary
  return (f'<table class="remat-peak-table"><caption>{caption}</caption>'
          f'<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def rest_text(rows, shown) -> str:
  """'… 41 more buffers, 1.2 MiB: parameter 800 KiB, output 400 KiB'."""
  listed = {id(r) for r in shown}
  rest = [r for r in rows if id(r) not in listed]
  if not rest:
    return ''
  kinds: dict[str, int] = {}
  for r in rest:
    kinds[r.kind] = kinds.get(r.kind, 0) + r.bytes
  parts = ', '.join(f'{k} {format_bytes(b)}' for k, b in
                    sorted(kinds.items(), key=lambda kv: -kv[1]))
  return (f'… {len(rest)} more buffer{"s" * (len(rest) != 1)}, '
          f'{format_bytes(sum(r.bytes for r in rest))}: {parts}')


# -- jaxprs -------------------------------------------------------------------------------

def jaxpr_html(jaxpr, *, highlight_inputs: Iterable[int] = (),
               highlight_outputs: Iterable[int] = ()) -> str:
  """`jaxpr` as escaped, preformatted text, with the variables that are its
  inputs or outputs at the given positions marked wherever they appear."""
  # Without colour: in a notebook JAX prints jaxprs with terminal colour
  # codes, which HTML would show raw.
  text = jaxpr.pretty_print(use_color=False)
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
