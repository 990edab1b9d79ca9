"""What is alive at the peak, as the Costs tab and the report show it: the
peak table, the timeline's bands and the data each embeds for hover and
click, the forward/backward boundary, and the matplotlib timeline."""

import html
import json
import random
import re

import pytest

from remat_explorer.analysis import NO_REMAT, analyze, compile_costs, explain_peak, live_at_peak
from remat_explorer.viz.html import tables, timeline_html
from remat_explorer.viz.charts import timeline_view
from remat_explorer.viz.charts.timeline_chart import plot_memory_timeline
from remat_explorer.viz.text import format_bytes
from remat_explorer.viz.charts.timeline_view import forward_backward_boundary
from tests.framework_models import nnx_transformer
from tests.programs import named_by_user

HOSTILE = '<img src=x onerror=alert(1)>&"</script>'


@pytest.fixture(scope='module')
def nnx():
  """The NNX transformer as written: its report, compiled costs and no
  remat's."""
  f, args = nnx_transformer()
  return (analyze(f, *args), compile_costs(f, *args),
          compile_costs(f, *args, policy=NO_REMAT))


def _row_of(document: str, text: str) -> str:
  """The table row of `document` that holds `text` (escaped)."""
  for row in re.findall(r'<tr[^>]*>.*?</tr>', document.replace('<wbr>', ''), re.S):
    if html.escape(text, quote=True) in row:
      return row
  raise AssertionError(f'no row holds {text!r}')


# -- the peak table ------------------------------------------------------------------

def test_the_costs_view_says_what_the_listed_buffers_leave_of_the_peak(nnx):
  """The sum of the buffers listed at the peak and the gap to XLA's peak
  (explain_peak: the buffer assignment's own offsets) are said under the
  table, in the page's units."""
  report, costs, _ = nnx
  explained = explain_peak(report, costs)
  page = timeline_html.timeline_html(timeline_view.timeline_view(report, costs))
  (said,) = re.findall(r'<p class="remat-caption remat-peak-gap">(.*?)</p>', page, re.S)
  said = html.unescape(said)
  assert format_bytes(explained.listed_bytes) in said
  assert format_bytes(costs.timeline.peak_bytes) in said
  # The listed buffers are what live_at_peak returns, their sum is theirs.
  assert explained.listed_bytes == sum(b.bytes for b in live_at_peak(report, costs))
  if explained.gap_bytes > 0:
    assert format_bytes(explained.gap_bytes) in said and explained.gap_reason in said



def test_peak_table_lists_the_top_residual_with_its_user_source_line(nnx):
  report, costs, _ = nnx
  rows = live_at_peak(report, costs)
  top = next(r for r in rows if r.kind == 'residual')
  # The premise: the analysis traced it to the model's own code.
  assert top.source.startswith('tests/framework_models.py:'), top.source
  document = tables.peak_table_html(rows)
  row = _row_of(document, top.buffer)
  for cell in (top.source, f'{top.bytes:,}', top.made_by, top.name or '', top.module_path):
    assert html.escape(cell, quote=True) in row, (cell, row)
  assert 'remat-live-residual' in row


def test_every_residual_at_the_peak_says_what_it_holds(nnx):
  """The "holds" cell of a residual is never empty: its checkpoint name,
  else the argument it is, else the output of the primitive that made it
  (the nnx model saves unnamed matmul outputs beside its named values)."""
  report, costs, _ = nnx
  rows = [r for r in live_at_peak(report, costs) if r.kind == 'residual' and r.residual]
  assert any(r.name is None for r in rows), [r.name for r in rows]
  for r in rows:
    said = r.holds()
    assert said, r
    expected = r.residual.name or r.residual.argument or f'output of {r.residual.primitive}'
    assert said.startswith(expected), (said, expected)
    assert html.escape(said, quote=True) in _row_of(tables.peak_table_html(rows), r.buffer)


def test_peak_table_lists_the_largest_and_sums_up_the_rest(nnx):
  report, costs, _ = nnx
  rows = live_at_peak(report, costs)
  document = tables.peak_table_html(rows, top=3, residuals=2)
  shown = tables.shown_buffers(rows, 3, 2)
  residuals = [r for r in rows if r.kind == 'residual']
  assert {id(r) for r in rows[:3]} <= {id(r) for r in shown}
  assert all(any(s is r for s in shown) for r in residuals[:2])
  assert len(re.findall(r'<tr class="remat-live-(?!rest)', document)) == len(shown)
  rest = [r for r in rows if not any(s is r for s in shown)]
  summary = re.search(r'class="remat-live-rest"><td[^>]*>(.*?)</td>', document).group(1)
  assert summary.startswith(f'… {len(rest)} more buffers, '
                            f'{format_bytes(sum(r.bytes for r in rest))}')
  caption = re.search(r'<caption>(.*?)</caption>', document).group(1)
  assert caption.startswith(f'{len(rows)} buffers, {format_bytes(sum(r.bytes for r in rows))}')


# -- the boundary between the passes ----------------------------------------------------

def _agreement(passes, cut):
  return (sum(p == 'forward' for p in passes[:cut])
          + sum(p in ('backward', 'recompute') for p in passes[cut:]))


def test_the_boundary_is_the_cut_most_steps_agree_with():
  # XLA hoists small backward instructions (zeros, constants) forward.
  passes = ['forward'] * 5 + ['backward'] + ['forward'] * 3 + ['', 'backward'] * 6
  assert forward_backward_boundary(passes) == 9
  assert forward_backward_boundary(['forward', '', 'forward']) is None
  rng = random.Random(7)
  for _ in range(200):
    passes = [rng.choice(['forward', 'backward', 'recompute', ''])
              for _ in range(rng.randint(1, 30))]
    cut = forward_backward_boundary(passes)
    if not any(p in ('backward', 'recompute') for p in passes):
      assert cut is None
      continue
    best = max(_agreement(passes, c) for c in range(len(passes) + 1))
    assert _agreement(passes, cut) == best, passes


# -- the timeline's bands and what they embed ---------------------------------------------

def _key(rows):
  return [(r.buffer, r.bytes, r.kind) for r in rows]


@pytest.mark.parametrize('max_bands', [timeline_view.MAX_BANDS, 12])
def test_each_band_holds_the_buffers_live_at_its_highest_step(nnx, max_bands):
  report, costs, _ = nnx
  timeline = costs.timeline
  view = timeline_view.timeline_view(report, costs, max_bands=max_bands)
  bands = view.bands
  assert len(bands) <= max_bands + 3  # cut at the boundary and the peak too
  assert bands[0].first == 0 and bands[-1].last == len(timeline.steps) - 1
  assert all(a.last + 1 == b.first for a, b in zip(bands, bands[1:]))
  for band in bands:
    heights = timeline.height[band.first:band.last + 1]
    assert band.height == max(heights) == timeline.height[band.step]
    assert _key(view.buffers[band.buffers]) == _key(live_at_peak(report, costs, band.step))
    # No band straddles the start of the backward pass.
    assert not band.first < view.boundary <= band.last
  assert view.peak.first <= timeline.peak_step <= view.peak.last
  assert view.peak.height == view.peak_bytes == timeline.peak_bytes
  assert len({tuple(_key(b)) for b in view.buffers}) == len(view.buffers)  # each once


def test_the_page_embeds_each_bands_rows_for_hover_and_click(nnx):
  report, costs, baseline = nnx
  view = timeline_view.timeline_view(report, costs, reference=('no remat', baseline))
  document = timeline_html.timeline_html(view)
  data = json.loads(re.search(r'<script type="application/json" class="remat-live-data">'
                              r'(.*?)</script>', document, re.S).group(1))
  bands = re.findall(r'<g class="remat-band" data-at="([^"]+)" data-band="(\d+)"', document)
  assert len(bands) == len(view.bands)
  for key, index in bands:
    band = view.bands[int(index)]
    rows = list(view.buffers[band.buffers])
    if key == 'peak':  # the peak's table is in the page as HTML
      assert band.buffers == view.peak.buffers
      continue
    embedded = data['lists'][key]
    shown = tables.shown_buffers(rows, timeline_html.BAND_ROWS, 2)
    assert [data['rows'][i][1:] for i in embedded['rows']] == [
        tables.peak_cells(r) for r in shown]
    assert embedded['caption'] == tables.live_summary(rows)
    assert embedded['rest'] == tables.rest_text(rows, shown)
  # Without a script, the peak's table shows, with the top residual's line.
  top = next(r for r in live_at_peak(report, costs) if r.kind == 'residual')
  peak = re.search(r'<div class="remat-at" data-at="peak">(.*?)</div>',
                   document.replace('<wbr>', ''), re.S)
  assert html.escape(top.source, quote=True) in peak.group(1)
  assert f'peak {format_bytes(view.peak_bytes)} at step {view.peak.step}' in document


def test_the_reference_lines_up_its_passes_with_these(nnx):
  report, costs, baseline = nnx
  steps = len(baseline.timeline.steps)
  # As many bands as steps: a point per step of the reference.
  view = timeline_view.timeline_view(report, costs, reference=('no remat', baseline),
                                     max_bands=steps)
  label, peak, points = view.reference
  assert (label, peak) == ('no remat', baseline.timeline.peak_bytes)
  theirs = forward_backward_boundary(baseline.timeline.step_passes)
  assert len(points) == steps + 1
  assert points[theirs][0] == pytest.approx(view.boundary)
  assert all(a[0] < b[0] for a, b in zip(points, points[1:]))
  assert points[0][0] == 0 and points[-1][0] == view.steps
  assert max(h for _, h in points) == peak


def test_user_text_in_the_timeline_is_escaped_and_cannot_end_its_script():
  f, args = named_by_user(HOSTILE)
  report, costs = analyze(f, *args), compile_costs(f, *args)
  view = timeline_view.timeline_view(report, costs, max_bands=4)
  named = [r for rows in view.buffers for r in rows if r.name == HOSTILE]
  assert named, 'premise: the named residual is live somewhere'
  document = timeline_html.timeline_html(view)
  assert HOSTILE not in document and '<img' not in document
  assert document.count('</script>') == 1
  data = json.loads(re.search(r'class="remat-live-data">(.*?)</script>', document,
                              re.S).group(1))
  peak_rows = html.unescape(document)
  assert HOSTILE in peak_rows or any(HOSTILE in cell for row in data['rows'] for cell in row)


# -- the matplotlib timeline ---------------------------------------------------------------

def test_timeline_chart_names_the_passes_and_marks_the_boundary_and_peak(nnx):
  _, costs, baseline = nnx
  fig = plot_memory_timeline({'as written': costs, 'no remat': baseline})
  ax, = fig.axes
  boundary = forward_backward_boundary(costs.timeline.step_passes)
  dashed = [l for l in ax.get_lines() if l.get_linestyle() == '--']
  assert [l.get_xdata()[0] for l in dashed] == [boundary]
  ticks = [t.get_text() for t in ax.get_xticklabels()]
  assert ticks[0].startswith('forward') and ticks[1].startswith('backward')
  assert f'steps {boundary}–' in ticks[1]
  notes = [t.get_text() for t in ax.texts]
  assert f'peak {format_bytes(costs.timeline.peak_bytes)}' in notes
  assert f'peak {format_bytes(baseline.timeline.peak_bytes)}' in notes
  runs = [p for p in costs.timeline.passes() if p[2]]
  assert len(ax.patches) >= len(runs)  # the pass strip, one bar a run
