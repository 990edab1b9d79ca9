"""The interactive memory timeline as HTML: an inline SVG chart of a
``TimelineView`` and, under it, the buffers live at one step (and the
chart alone as a standalone SVG, ``timeline_svg``, for an image).

Pure: the chart, each band's tooltip (an SVG ``<title>``: shown on hover
with no script at all) and each band's buffer table are written here. By
default the table of the peak shows; ``static/timeline.js`` (the
Explorer's Costs view, or inlined once in the report by
``timeline_assets_html``) builds the hovered band's table from the data
embedded beside the chart (``live_data``: each buffer's cells once) and
keeps a clicked one. Nothing is fetched: no CDN, no external file.
"""

from __future__ import annotations

import functools
import json
import math

from remat_explorer.viz.html.tables import (PEAK_HEADINGS, PEAK_WRAPPED, live_summary,
                                       peak_cells, peak_table_html, rest_text,
                                       shown_buffers)
from remat_explorer.viz.text import MISSING, byte_unit, format_bytes, html_text
from remat_explorer.viz.charts.timeline_view import PASS_COLORS, Band, TimelineView
from remat_explorer.viz.diagram.viewer import STATIC

WIDTH, HEIGHT = 960, 330
LEFT, RIGHT, TOP, BOTTOM = 70, 16, 46, 250
"""The plot area, in the SVG's own units (it scales to the page's width,
never below 880 px: ``timeline.css``; its text is 12 units, 11 px there)."""
STRIP = 12
"""Height of the strip under the plot that colours each step by its pass."""
MEMORY_COLOR, RESIDUAL_COLOR, REFERENCE_COLOR = '#9ecae1', '#d62728', '#555555'
BAND_ROWS = 6
"""Largest buffers a band's table lists (its largest residuals besides)."""


def timeline_html(view: TimelineView | None) -> str:
  """The chart and the live-buffer tables of `view` (see the module)."""
  if view is None:
    return '<p class="remat-caption">No memory timeline for this program.</p>'
  keys = _panel_keys(view)
  head = f'Live at the peak: {_step_text(view, view.peak)}'
  peak = peak_table_html(list(view.buffers[view.peak.buffers])) + _gap_html(view)
  return (f'<div class="remat-timeline">{_svg(view, keys)}'
          f'<p class="remat-live-head" data-peak="{html_text(head)}">{html_text(head)}'
          '</p><p class="remat-caption remat-live-hint">Hover over the chart for the '
          'buffers live at another step; click to keep them.</p>'
          f'<div class="remat-live"><div class="remat-at" data-at="peak">{peak}</div>'
          '<div class="remat-at" data-at="band" hidden></div></div>'
          f'<script type="application/json" class="remat-live-data">'
          f'{_json_for_html(live_data(view, keys))}</script></div>')


def _gap_html(view: TimelineView) -> str:
  """What the listed buffers leave of XLA's peak, and why."""
  if view.peak_gap is None:
    return ''
  listed, gap, reason = view.peak_gap
  if gap < 0:
    return (f'<p class="remat-caption remat-peak-gap">These buffers add up to '
            f'{html_text(format_bytes(listed))}, {html_text(format_bytes(-gap))} more than '
            f'the peak of {html_text(format_bytes(view.peak_bytes))}: '
            f'{html_text(reason)}.</p>')
  if gap == 0:
    return (f'<p class="remat-caption remat-peak-gap">These buffers add up to '
            f'{html_text(format_bytes(listed))}; the peak is '
            f'{html_text(format_bytes(view.peak_bytes))}.</p>')
  return (f'<p class="remat-caption remat-peak-gap">These buffers hold '
          f'{html_text(format_bytes(listed))} of the peak\'s '
          f'{html_text(format_bytes(view.peak_bytes))}; the other '
          f'{html_text(format_bytes(gap))}: {html_text(reason)}.</p>')


def live_data(view: TimelineView, keys: dict[int, str] | None = None) -> dict:
  """What the page's script needs to list the buffers live at each band,
  as JSON-ready data: each buffer's cells once (``tables.peak_cells``),
  and per buffer list the rows it shows (``shown_buffers``), its columns
  (those with something in them), caption and the rest summed up."""
  keys = _panel_keys(view) if keys is None else keys
  rows: dict[tuple, int] = {}
  cells, lists = [], {}
  for index in sorted({int(k[1:]) for k in keys.values() if k != 'peak'}):
    live = list(view.buffers[index])
    shown = shown_buffers(live, BAND_ROWS, 2)
    ids = []
    for r in shown:
      row = (r.kind, *peak_cells(r))
      if row not in rows:
        rows[row] = len(cells)
        cells.append(list(row))
      ids.append(rows[row])
    used = [i for i, _ in enumerate(PEAK_HEADINGS)
            if PEAK_HEADINGS[i] in ('bytes', 'kind', 'buffer')
            or any(cells[j][1 + i] not in ('', MISSING) for j in ids)]
    lists[f'b{index}'] = {'rows': ids, 'columns': used, 'caption': live_summary(live),
                          'rest': rest_text(live, shown)}
  # A source line's whole path, once per line (``tables.source_cell``).
  tooltips = {cell: cell.tooltip for row in cells for cell in row if hasattr(cell, 'tooltip')}
  return {'headings': list(PEAK_HEADINGS), 'rows': cells, 'lists': lists,
          'wrapped': [i for i, h in enumerate(PEAK_HEADINGS) if h in PEAK_WRAPPED],
          'tooltips': tooltips}


def _json_for_html(data) -> str:
  """JSON that cannot end the ``<script>`` element holding it."""
  return (json.dumps(data, ensure_ascii=False, separators=(',', ':'))
          .replace('<', '\\u003c').replace('>', '\\u003e').replace('&', '\\u0026'))


def _panel_keys(view: TimelineView) -> dict[int, str]:
  """The list each band shows: 'peak' for the bands whose buffers are
  the peak's (its table is in the page), else its buffer list's."""
  peak = view.peak.buffers
  return {i: 'peak' if b.buffers == peak else f'b{b.buffers}'
          for i, b in enumerate(view.bands)}


def _step_text(view: TimelineView, band: Band) -> str:
  where = f'step {band.step} of {view.steps} ({band.instruction}'
  where += f', {band.pass_name} pass' if band.pass_name else ''
  where += ', a loop: all its iterations' if band.instruction in band.loops else ''
  return f"{where}): {format_bytes(band.height)} in use"


# -- the chart ------------------------------------------------------------------------------

def timeline_svg(view: TimelineView) -> str:
  """The chart of `view` alone, as a standalone SVG of fixed size for an
  ``<img>`` (an untrusted notebook drops inline SVG but keeps images): no
  hover targets, which an image cannot use."""
  return _svg(view, None)


def _svg(view: TimelineView, keys: dict[int, str] | None) -> str:
  """The chart; with `keys` (each band's buffer list), inline at the
  page's width with a hover target per band, else standalone."""
  ref_peak = view.reference[1] if view.reference else 0
  top = max(view.peak_bytes, ref_peak, 1)
  scale = byte_unit(top)
  ticks = _ticks(top / scale)
  ymax = max(ticks[-1], top / scale) * scale
  x = functools.partial(_x, steps=view.steps)
  y = functools.partial(_y, top=ymax)
  size = 'width="100%"' if keys is not None else f'width="{WIDTH}" height="{HEIGHT}"'
  parts = [f'<svg class="remat-timeline-chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'{size} role="img" xmlns="http://www.w3.org/2000/svg" '
           f'font-family="system-ui, sans-serif" font-size="12">',
           f'<title>memory along the compiled schedule under {html_text(view.policy)}</title>']
  parts += _axes(ticks, scale, y)
  parts.append(_area(view, lambda b: b.height, MEMORY_COLOR, 1, x, y))
  parts.append(_area(view, lambda b: b.residual, RESIDUAL_COLOR, 0.55, x, y))
  if view.reference:
    parts.append(_reference_path(view, x, y))
  parts += _pass_strip(view, x)
  parts += _boundary(view, x)
  parts += _peak_mark(view, x, y)
  parts += _legend(view)
  if keys is not None:
    parts.append(f'<line class="remat-cursor" x1="0" x2="0" y1="{TOP}" y2="{BOTTOM + STRIP}" '
                 'stroke="#222" stroke-width="1" visibility="hidden"/>')
    parts += [_hit(view, i, b, keys[i], x) for i, b in enumerate(view.bands)]
  parts.append('</svg>')
  return ''.join(parts)


def _x(step: float, steps: int) -> float:
  return LEFT + step / steps * (WIDTH - LEFT - RIGHT)


def _y(value: float, top: float) -> float:
  return BOTTOM - value / top * (BOTTOM - TOP)


def _ticks(top: float) -> list[float]:
  """Round values from 0 to at least `top`, four or five of them."""
  raw = top / 4 or 1
  step = min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 2.5, 5, 10)),
             key=lambda s: (s < raw, abs(s - raw)))
  count = math.ceil(top / step - 1e-9)
  return [i * step for i in range(count + 1)]


def _axes(ticks, scale, y) -> list[str]:
  unit = format_bytes(scale).split()[-1]
  out = []
  for t in ticks:
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(t * scale):.1f}" '
               f'y2="{y(t * scale):.1f}" stroke="#e4e4e4"/>'
               f'<text x="{LEFT - 6}" y="{y(t * scale) + 4:.1f}" text-anchor="end" '
               f'fill="#444">{t:g}</text>')
  out.append(f'<text x="14" y="{(TOP + BOTTOM) / 2}" text-anchor="middle" fill="#444" '
             f'transform="rotate(-90 14 {(TOP + BOTTOM) / 2})">device memory ({unit})</text>')
  out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}" text-anchor="middle" '
             'fill="#444">instructions of the compiled step in run order (a loop is one '
             'instruction: all its iterations)</text>')
  return out


def _area(view: TimelineView, value, color: str, opacity: float, x, y) -> str:
  """The bands' `value` as one stepped area over the baseline."""
  d = [f'M{x(view.bands[0].first):.2f},{BOTTOM}']
  for b in view.bands:
    d.append(f'V{y(value(b)):.2f}H{x(b.last + 1):.2f}')
  return (f'<path d="{"".join(d)}V{BOTTOM}Z" fill="{color}" fill-opacity="{opacity}" '
          'stroke="none"/>')


def _reference_path(view: TimelineView, x, y) -> str:
  label, _, points = view.reference
  d = [f'M{x(points[0][0]):.1f},{y(points[0][1]):.1f}']
  for px, value in points[1:]:
    d.append(f'H{x(px):.1f}V{y(value):.1f}')
  return (f'<path d="{"".join(d)}" fill="none" stroke="{REFERENCE_COLOR}" '
          f'stroke-width="1.5" stroke-dasharray="4 3"><title>{html_text(label)}: its '
          'forward and backward passes stretched onto these</title></path>')


def _pass_strip(view: TimelineView, x) -> list[str]:
  out = []
  for first, last, name in view.passes:
    out.append(f'<rect x="{x(first):.2f}" y="{BOTTOM + 2}" '
               f'width="{max(x(last + 1) - x(first), 0.5):.2f}" height="{STRIP - 2}" '
               f'fill="{PASS_COLORS.get(name, "#bbbbbb")}"><title>steps {first}–{last}: '
               f'{html_text(name or "no pass recorded")}</title></rect>')
  for b in view.bands:
    if b.loops:  # a tick over the strip: a loop runs here
      cx = (x(b.first) + x(b.last + 1)) / 2
      out.append(f'<path d="M{cx - 4:.1f},{BOTTOM + STRIP + 9}h8l-4,-7z" fill="#333"/>')
  return out


def _boundary(view: TimelineView, x) -> list[str]:
  label_y = BOTTOM + STRIP + 24
  if view.boundary is None:
    return [f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{label_y}" text-anchor="middle" '
            'fill="#444">no backward pass</text>']
  xb = x(view.boundary)
  return [f'<line x1="{xb:.1f}" x2="{xb:.1f}" y1="{TOP}" y2="{BOTTOM + STRIP}" '
          'stroke="#222" stroke-dasharray="5 3"/>',
          f'<text x="{(LEFT + xb) / 2:.1f}" y="{label_y}" text-anchor="middle" '
          f'fill="{PASS_COLORS["forward"]}">forward (steps 0–{view.boundary - 1})</text>',
          f'<text x="{(xb + WIDTH - RIGHT) / 2:.1f}" y="{label_y}" text-anchor="middle" '
          f'fill="{PASS_COLORS["backward"]}">backward (steps {view.boundary}–'
          f'{view.steps - 1})</text>',
          f'<text x="{xb + 4:.1f}" y="{TOP + 12}" fill="#222">'
          'backward starts</text>']


def _peak_mark(view: TimelineView, x, y) -> list[str]:
  band = view.peak
  cx, cy = (x(band.first) + x(band.last + 1)) / 2, y(band.height)
  anchor = 'end' if cx > WIDTH / 2 else 'start'
  dx = -8 if anchor == 'end' else 8
  return [f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4.5" fill="#222"/>',
          f'<text class="remat-peak-label" x="{cx + dx:.1f}" y="{max(cy - 6, TOP + 10):.1f}" '
          f'text-anchor="{anchor}" font-weight="600" fill="#222">peak '
          f'{html_text(format_bytes(view.peak_bytes))} at step {band.step} '
          f'({html_text(band.instruction)})</text>']


def _legend(view: TimelineView) -> list[str]:
  items = [(MEMORY_COLOR, 'rect', 'device memory'),
           (RESIDUAL_COLOR, 'rect', 'residual buffers')]
  if view.reference:
    label, peak, _ = view.reference
    items.append((REFERENCE_COLOR, 'dash', f'{label} (peak {format_bytes(peak)}, its passes '
                                           'aligned)'))
  names = {p for _, _, p in view.passes if p}
  items += [(PASS_COLORS[p], 'rect', f'{p} pass') for p in PASS_COLORS if p in names]
  if any(b.loops for b in view.bands):
    items.append(('#333', 'loop', 'loop'))
  out, cursor, row = [], LEFT, 14
  for color, shape, text in items:
    width = 26 + 7 * len(text)  # about a 12px system font's advance
    if cursor + width > WIDTH - RIGHT and cursor > LEFT:  # on to a second line
      cursor, row = LEFT, row + 17
    if shape == 'dash':
      out.append(f'<line x1="{cursor}" x2="{cursor + 14}" y1="{row}" y2="{row}" '
                 f'stroke="{color}" stroke-width="1.5" stroke-dasharray="4 3"/>')
    elif shape == 'loop':
      out.append(f'<path d="M{cursor + 3},{row + 4}h8l-4,-7z" fill="{color}"/>')
    else:
      out.append(f'<rect x="{cursor}" y="{row - 6}" width="14" height="11" fill="{color}"/>')
    out.append(f'<text x="{cursor + 18}" y="{row + 4}" fill="#333">{html_text(text)}</text>')
    cursor += width
  return out


def _hit(view: TimelineView, index: int, b: Band, key: str, x) -> str:
  """The band's hover target: the plot's full height, its tooltip, which
  table it shows, and what the table's heading says."""
  x0, x1 = x(b.first), x(b.last + 1)
  steps = f'steps {b.first}–{b.last}, highest ' if b.last > b.first else ''
  head = f'Live at {steps}{_step_text(view, b)}'
  largest = '; '.join(_buffer_text(r) for r in view.buffers[b.buffers][:4])
  title = (f'{head}\nbuffers live {format_bytes(b.live)} (XLA places them in '
           f'{format_bytes(b.height)}), residuals {format_bytes(b.residual)}'
           + (f'\nloops here: {", ".join(b.loops)}' if b.loops else '')
           + (f'\nlargest: {largest}' if largest else ''))
  return (f'<g class="remat-band" data-at="{key}" data-band="{index}" '
          f'data-head="{html_text(head)}" data-x="{x0:.2f}" data-w="{x1 - x0:.2f}">'
          f'<title>{html_text(title)}</title><rect x="{x0:.2f}" y="{TOP}" '
          f'width="{max(x1 - x0, 0.5):.2f}" height="{BOTTOM + STRIP - TOP}" fill="none" '
          'pointer-events="all"/></g>')


def _buffer_text(r) -> str:
  what = r.name or r.buffer
  return f'{what} {format_bytes(r.bytes)} ({r.kind})'


# -- the script ------------------------------------------------------------------------------

@functools.cache
def timeline_script() -> str:
  script = (STATIC / 'timeline.js').read_text(encoding='utf-8')
  assert '</script' not in script.lower() and '<!--' not in script, 'unsafe to inline'
  return script


@functools.cache
def timeline_css() -> str:
  return (STATIC / 'timeline.css').read_text(encoding='utf-8')


def timeline_assets_html() -> str:
  """The style and script that make every timeline on a page interactive:
  once per document, after them."""
  return (f'<style>{timeline_css()}</style><script>(function () {{\n{timeline_script()}\n'
          'mountTimelines(document);\n})();</script>')
