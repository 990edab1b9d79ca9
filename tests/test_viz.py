"""Charts, tables, the HTML report, the command line and the Explorer widget,
checked for what they show on small example models."""

import dataclasses
import html as html_module
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer import examples, viz
from remat_explorer.analysis import analyze, compare, search_policy
from remat_explorer.viz.charts import _labels
from remat_explorer.viz.widget import _panels
from remat_explorer.viz.charts import costs as charts, timeline_chart
from remat_explorer.viz.html import tables
from remat_explorer.viz.widget._policy_controls import NAMED as _NAMED
from remat_explorer.viz.widget.explorer import TABS
from remat_explorer.viz.text import byte_unit, format_bytes
from tests.programs import named_by_user

# One worker runs the module: its tests share the compiles they cache
# (the same programs under the same policies), which split across two
# workers would each compile again.
pytestmark = pytest.mark.xdist_group('viz')

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = '<img src=x onerror=alert(1)>&"'


def small_transformer():
  """Two unrolled layers, small enough to compile every policy in seconds;
  ``--fn tests.test_viz:small_transformer`` uses it too."""
  return examples.transformer(num_layers=2, d_model=32, seq_len=16, batch=2)


def tiny_mlp():
  """Three layers in a scan, every policy compiled in a second or two:
  ``--fn tests.test_viz:tiny_mlp`` for the command line's test."""
  return examples.mlp(num_layers=3, width=16, batch=4)


def test_the_module_runs_on_one_worker(request):
  """Its tests share module fixtures (a comparison compiled once): under
  ``--dist loadgroup`` pytest-xdist sends the group to one worker by a
  suffix it adds to each test's id, which pytest 9.2 no longer lets it add
  (pyproject.toml pins pytest below it). Spread over two workers, every
  module fixture of every group is built twice, quietly."""
  if request.config.getoption('loadgroup', default=False):
    assert request.node.nodeid.endswith('@viz'), (
        f'pytest-xdist could not group {request.node.nodeid} under pytest '
        f'{pytest.__version__}: install the pytest that pyproject.toml names')


@pytest.fixture(scope='module')
def problem():
  return small_transformer()


@pytest.fixture(scope='module')
def comparison(problem):
  return compare(*problem[:1], *problem[1])



# -- charts -----------------------------------------------------------------------

def test_breakdown_residuals_at_peak_are_within_what_the_jaxpr_saves(problem, comparison):
  """The residual share is read off XLA's compiled schedule (buffers a
  forward instruction defines and a backward one reads, live at the peak);
  the jaxpr says, apart, which values the policy saves. XLA may fuse a saved
  elementwise value into its backward reader and compute it again there
  (under everything_saveable here it keeps well under the jaxpr's bytes:
  layer norm's and GELU's pieces), but where it keeps each recompute apart
  from the forward pass it never holds more than the jaxpr saves. The peak
  listing (``live_at_peak``) reads the same residual flag, so it is no
  second measurement of the share; the jaxpr is."""
  args = problem[1]
  bounded = [r for r in comparison.rows if r.recompute_eliminated is None]
  assert comparison.row('everything_saveable') in bounded  # it recomputes nothing
  for row in bounded:
    parts = charts.memory_breakdown(row)
    saved = sum(r.device_bytes for r in row.report.residuals if r.kind == 'equation')
    assert 0 < parts['residuals at peak'] <= saved, row.label
    # The arguments are the arrays passed in, whatever the policy.
    assert parts['arguments'] == sum(x.nbytes for x in jax.tree_util.tree_leaves(args))
  # Saving everything leaves more residual bytes at the peak than saving nothing.
  everything = charts.memory_breakdown(comparison.row('everything_saveable'))
  nothing = charts.memory_breakdown(comparison.row('nothing_saveable'))
  assert everything['residuals at peak'] > nothing['residuals at peak']


def test_breakdown_chart_has_one_stacked_bar_per_policy(comparison):
  fig = viz.plot_memory_breakdown(comparison)
  ax = fig.axes[0]
  rows = [r for r in comparison.rows if not r.failed]
  assert len(ax.patches) == len(charts.BREAKDOWN_PARTS) * len(rows)
  assert [t.get_text() for t in ax.get_yticklabels()] == [
      charts.short_label(r.label) for r in rows]
  scale = byte_unit(max(r.costs.argument_bytes + r.costs.output_bytes + r.costs.temp_bytes
                        for r in rows))
  for i, row in enumerate(rows):  # each bar ends at XLA's total for its row
    ends = [p.get_x() + p.get_width() for p in ax.patches[i::len(rows)]]
    total = row.costs.argument_bytes + row.costs.output_bytes + row.costs.temp_bytes
    assert max(ends) == pytest.approx(total / scale)
  assert 'MiB' in ax.get_xlabel() or 'KiB' in ax.get_xlabel()
  assert comparison.device_kind in ax.get_title()


def test_pareto_chart_has_a_point_per_policy_and_the_front(comparison):
  fig = viz.plot_pareto(comparison, selected='dots_saveable')
  ax = fig.axes[0]
  points = charts.pareto_points(comparison)
  front_line = [l for l in ax.get_lines() if l.get_label() == 'Pareto front']
  assert len(front_line) == 1
  front = sorted((p[1], p[2]) for p in points if p[3])
  assert len(front_line[0].get_xdata()) == len(front) >= 1
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert 'selected: dots_saveable' in legend
  # The front is made of the non-dominated points.
  for _, peak, flops, on_front in points:
    dominated = any(p2 <= peak and f2 <= flops and (p2, f2) != (peak, flops)
                    for _, p2, f2, _ in points)
    assert on_front == (not dominated)


def _drawn(fig):
  fig.canvas.draw()
  return fig.canvas.get_renderer()


def _overlapping(boxes) -> list[tuple[int, int]]:
  """Pairs of indices of `boxes` (matplotlib Bboxes) that overlap."""
  return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
          if boxes[i].overlaps(boxes[j])]


def test_pareto_labels_name_every_policy_once_and_never_overlap(comparison):
  fig = viz.plot_pareto(comparison, selected='dots_saveable')
  ax = fig.axes[0]
  renderer = _drawn(fig)
  texts = [t for t in ax.texts if t.get_visible()]
  footnote = fig._supxlabel.get_text() if fig._supxlabel is not None else ''
  entries = [t.get_text() for t in texts if not t.get_text().isdigit()]
  entries += [line.split(': ', 1)[1] for line in footnote.splitlines() if line]
  names = [charts.short_label(p[0]) for p in charts.pareto_points(comparison)]
  # Every policy named once, in a label or in the footnote.
  assert sorted(', '.join(entries).split(', ')) == sorted(', '.join(names).split(', '))
  assert len(texts) <= len({(p[1], p[2]) for p in charts.pareto_points(comparison)})
  boxes = [t.get_window_extent(renderer) for t in texts]
  assert _overlapping(boxes) == [], [t.get_text() for t in texts]
  area = ax.get_window_extent(renderer)
  assert all(area.contains(b.x0, b.y0) and area.contains(b.x1, b.y1) for b in boxes)


def test_policies_on_one_point_share_one_label(comparison):
  # Three policies compiled to the same peak and FLOPs, as happens when XLA
  # merges the recompute away.
  import dataclasses
  first = comparison.row('nothing_saveable')
  rows = [dataclasses.replace(r, peak_bytes=first.peak_bytes,
                              compiled_flops=first.compiled_flops)
          if r.label in ('nothing_saveable', 'dots_saveable', 'everything_saveable') else r
          for r in comparison.rows]
  ax = viz.plot_pareto(dataclasses.replace(comparison, rows=tuple(rows))).axes[0]
  labels = [t.get_text() for t in ax.texts]
  forced = {'nothing_saveable', 'dots_saveable', 'everything_saveable'}
  assert any(forced <= set(label.split(', ')) for label in labels)
  # One label per point (the program as written may sit on the same one).
  assert len(labels) == len({(r.peak_bytes, r.ranked_flops) for r in rows})


def test_crowded_labels_become_numbers_listed_under_the_chart():
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(3, 2), layout='constrained')
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  points = [(f'a rather long policy label {i}', i * 0.02, i * 0.02) for i in range(8)]
  ax.scatter([p[1] for p in points], [p[2] for p in points])
  groups = _labels.group_points(points, tolerance=0.0)
  footnotes = _labels.label_points(ax, groups)
  assert footnotes and all(re.fullmatch(r'\d+: a rather long policy label \d', f)
                           for f in footnotes)
  renderer = _drawn(fig)
  assert _overlapping([t.get_window_extent(renderer) for t in ax.texts
                       if not t.get_text().isdigit()]) == []
  assert '1: ' in fig._supxlabel.get_text()


def test_coinciding_points_are_grouped():
  groups = _labels.group_points([('a', 1.0, 1.0), ('b', 2.0, 5.0), ('c', 1.0, 1.0),
                                 ('d', 1.001, 1.0)])
  assert [g.labels for g in groups] == [['a', 'c', 'd'], ['b']]


@pytest.mark.parametrize('plot', ['pareto', 'breakdown', 'timeline'])
def test_legends_sit_outside_the_data(comparison, plot):
  fig = {'pareto': lambda: viz.plot_pareto(comparison, selected='dots_saveable'),
         'breakdown': lambda: viz.plot_memory_breakdown(comparison),
         'timeline': lambda: viz.plot_memory_timeline(
             {r.label: r.costs for r in comparison.rows[:2]})}[plot]()
  renderer = _drawn(fig)
  legends = [l for l in fig.legends] + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
  assert legends
  for legend in legends:
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
      assert not box.overlaps(ax.get_window_extent(renderer)), plot


def test_pareto_chart_marks_the_searched_policy(problem):
  f, args = problem
  result = search_policy(f, *args, memory_budget=0.5)
  comparison = compare(f, *args, policies=['nothing_saveable', 'everything_saveable'])
  ax = viz.plot_pareto(comparison, search_result=result).axes[0]
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert any(t.startswith('searched:') for t in legend)
  assert any(t.startswith('budget') for t in legend)


def test_residuals_by_origin_groups_every_byte():
  f, args = examples.transformer(num_layers=1, d_model=32, seq_len=16, batch=2)
  report = analyze(f, *args, policy=rx.checkpoint_policies.save_only_these_names(
      'query', 'mlp_hidden'))
  groups = charts.residual_bytes_by_origin(report)
  assert sum(groups.values()) == sum(r.bytes for r in report.residuals)
  assert 'name: query' in groups and 'name: mlp_hidden' in groups
  ax = viz.plot_residuals_by_origin(report).axes[0]
  assert len(ax.patches) == len(groups)
  assert report.policy in ax.get_title() or charts.short_label(report.policy) in ax.get_title()


def test_memory_timeline_overlays_two_policies(comparison):
  chosen = {r.label: r.costs for r in comparison.rows[:2]}
  ax, = viz.plot_memory_timeline(chosen).axes
  lines = [l for l in ax.get_lines() if '(peak' in l.get_label()]
  assert len(lines) == 2
  scale = byte_unit(max(c.timeline.peak_bytes for c in chosen.values()))
  for line, costs in zip(lines, chosen.values()):
    assert np.max(line.get_ydata()) == pytest.approx(costs.timeline.peak_bytes / scale)
    residual = np.array(costs.timeline.residual_bytes_by_step())
    assert np.all(residual <= np.array(costs.timeline.live_bytes))
  assert 'residual' in ax.get_title()


def test_memory_timeline_of_many_policies_gets_a_panel_each(comparison):
  chosen = {r.label: r.costs for r in comparison.rows if not r.failed}
  assert len(chosen) > timeline_chart.OVERLAY_AT_MOST
  fig = viz.plot_memory_timeline(chosen, reference='no remat')
  panels = [ax for ax in fig.axes if ax.get_visible()]
  assert len(panels) == len(chosen) - 1  # the reference is in every panel instead
  scale = byte_unit(max(c.timeline.peak_bytes for c in chosen.values()))
  for ax, (label, costs) in zip(panels, [(k, c) for k, c in chosen.items()
                                         if k != 'no remat']):
    assert ax.get_title().startswith(charts.short_label(label))
    # This policy, and no remat in grey (the dashed line marks the backward pass).
    lines = [l for l in ax.get_lines() if l.get_linestyle() != '--']
    assert len(lines) == 2
    assert np.max(lines[1].get_ydata()) == pytest.approx(costs.timeline.peak_bytes / scale)
    assert np.max(lines[0].get_ydata()) == pytest.approx(
        chosen['no remat'].timeline.peak_bytes / scale)
  assert 'no remat' in fig._suptitle.get_text()


def test_per_device_memory_chart_of_a_one_device_comparison(comparison):
  ax = viz.plot_per_device_memory(comparison).axes[0]
  rows = [r for r in comparison.rows if not r.failed]
  assert [t.get_text() for t in ax.get_yticklabels()] == [
      charts.short_label(r.label, 48) for r in rows]
  assert '1 device' in ax.get_title() and 'per device' in ax.get_xlabel()
  scale = byte_unit(max(sum(charts.costs_breakdown(r.costs).values()) for r in rows))
  for i, row in enumerate(rows):  # each bar ends at XLA's total for its program
    ends = [p.get_x() + p.get_width() for p in ax.patches[i::len(rows)]]
    assert max(ends) == pytest.approx(sum(charts.costs_breakdown(row.costs).values()) / scale)


def _every_chart(comparison):
  """Each chart function's figure on `comparison`, by name."""
  compiled = {r.label: r.costs for r in comparison.rows if not r.failed}
  return {
      'pareto': viz.plot_pareto(comparison, selected=comparison.rows[0].label),
      'breakdown': viz.plot_memory_breakdown(comparison),
      'per device': viz.plot_per_device_memory(comparison),
      'residuals': viz.plot_residuals_by_origin(comparison.rows[0].report),
      'timeline, two': viz.plot_memory_timeline(dict(list(compiled.items())[:2])),
      'timeline, panels': viz.plot_memory_timeline(compiled, reference='no remat'),
  }


MIN_DISPLAYED_TEXT_PX = 11
CELL_PX = 900
"""The narrowest JupyterLab cell output at a 1440-px window: a chart no
wider is shown unscaled there."""


@pytest.mark.parametrize('chart', ['pareto', 'breakdown', 'per device', 'residuals',
                                   'timeline, two', 'timeline, panels'])
def test_every_chart_text_is_readable_at_the_size_it_is_shown(comparison, chart):
  """Every text a chart draws (titles, ticks, legends, labels, footnotes)
  is at least 11 px at the figure's own dpi, and the figure is no wider
  than a notebook cell, so neither a notebook (IPython draws a figure at
  its dpi) nor the report (``chart_img``, at its natural size) shows it
  smaller; everything it draws lies inside the figure, whose size the
  report's image is. A long policy label (a searched policy's) is among
  the rows, and is the residual chart's policy."""
  import base64
  import struct
  import matplotlib
  from IPython.core.pylabtools import print_figure
  from matplotlib.text import Text
  from remat_explorer.viz.charts._figures import chart_img
  long_label = ("save_only_these_names('attention_scores_of_the_first_block', "
                "'mlp_hidden_activation', 'layer_norm_output_of_the_second_block')")
  rows = list(comparison.rows)
  rows[-1] = dataclasses.replace(rows[-1], label=long_label)
  rows[0] = dataclasses.replace(rows[0], report=dataclasses.replace(rows[0].report,
                                                                    policy=long_label))
  # A notebook may lower matplotlib's dpi to keep its images light: the
  # charts keep their own.
  with matplotlib.rc_context({'figure.dpi': 72}):
    fig = _every_chart(dataclasses.replace(comparison, rows=tuple(rows)))[chart]
  fig.draw_without_rendering()  # tick labels exist once drawn
  texts = [t for t in fig.findobj(Text) if t.get_text().strip()]
  assert len(texts) >= 5, chart
  smallest = min(texts, key=lambda t: t.get_fontsize())
  assert smallest.get_fontsize() * fig.dpi / 72 >= MIN_DISPLAYED_TEXT_PX, (
      chart, smallest.get_text(), smallest.get_fontsize(), fig.dpi)
  drawn, whole = fig.get_tightbbox(fig.canvas.get_renderer()), fig.bbox_inches
  assert (drawn.x0 >= whole.x0 and drawn.y0 >= whole.y0 and drawn.x1 <= whole.x1
          and drawn.y1 <= whole.y1), (chart, drawn, whole)
  for png in (base64.b64decode(chart_img(fig).split('base64,')[1].split('"')[0]),
              print_figure(fig, 'png')):  # the report's, a notebook's
    width = struct.unpack('>I', png[16:20])[0]
    assert 400 < width <= CELL_PX, (chart, width)
  # The report and the widget never scale the image down.
  assert 'style="max-width:none"' in chart_img(fig)


# -- tables -----------------------------------------------------------------------

def test_residual_table_lists_each_residual_sorted(problem):
  report = analyze(*problem[:1], *problem[1], policy=rx.checkpoint_policies.dots_saveable)
  html = viz.residual_table_html(report)
  rows = re.findall(r'<tr><td>(\d+)</td>', html)
  assert len(rows) == len(report.residuals)
  sizes = [report.residuals[int(i)].bytes for i in rows]
  assert sizes == sorted(sizes, reverse=True)
  assert '<th>sharding</th>' not in html  # one device: no per-device columns
  by_index = re.findall(r'<tr><td>(\d+)</td>', viz.residual_table_html(report, sort_by='index'))
  assert [int(i) for i in by_index] == sorted(int(i) for i in by_index)
  with pytest.raises(ValueError, match='sort_by'):
    viz.residual_table_html(report, sort_by='colour')


def test_comparison_table_has_a_row_per_policy(comparison):
  html = viz.comparison_table_html(comparison).replace('<wbr>', '')  # break points
  notes = html.count('<tr class="remat-notes">')
  # A row has a notes line for its notes, or for its label when the cell
  # shortens it (the names policy's label under JAX 0.11).
  assert notes == sum(1 for r in comparison.rows if tables.row_note(r) or tables.short_label(
      r.label, tables.LABEL_CHARS) != r.label)
  assert html.count('<tr') - 1 - notes == len(comparison.rows)  # minus the header
  assert len(re.findall(r'<tr class="pareto\b', html)) == len(comparison.pareto_front)
  for row in comparison.rows:
    assert tables.html_text(row.label) in html


def test_a_long_label_is_cut_in_its_cell_and_whole_under_its_row(comparison):
  names = ', '.join(repr(f'a_value_named_at_length_{i}') for i in range(6))
  long_label = f'save_only_these_names({names})'
  rows = [dataclasses.replace(r, label=long_label) if i == 2 else r
          for i, r in enumerate(comparison.rows)]
  html = viz.comparison_table_html(dataclasses.replace(comparison, rows=tuple(rows)))
  html = html.replace('<wbr>', '')  # where a line may break, not text
  cell = re.search(r'<td class="remat-label">(save_only[^<]*)</td>', html).group(1)
  shown = tables.html_text(long_label)
  assert shown.startswith(cell[:-1]) and cell.endswith('…')
  assert len(html_module.unescape(cell)) == tables.LABEL_CHARS < len(long_label)
  notes = re.search(rf'<tr[^>]*><td class="remat-label">{re.escape(cell)}</td>.*?</tr>'
                    r'<tr class="remat-notes"><td colspan="\d+">(.*?)</td></tr>', html)
  assert notes.group(1).startswith(f'policy {shown}')


def test_jaxpr_listing_marks_the_residuals():
  f = rx.checkpoint(lambda x: jnp.sin(jnp.sin(x)), policy=rx.checkpoint_policies.everything_saveable)
  report = analyze(f, jax.random.normal(jax.random.key(0), (3,)))
  html = viz.report_jaxprs_html(report)
  forward, backward = html.split('<h4>Backward')
  marked_fwd = set(re.findall(r'<mark class="residual">(\w+)</mark>', forward))
  marked_bwd = set(re.findall(r'<mark class="residual">(\w+)</mark>', backward))
  assert len(marked_fwd) == len(report.residuals) == len(marked_bwd) >= 1
  # The listing keeps the jaxpr's lines, escaped one by one.
  assert html.count('\n') >= len(str(report.forward_jaxpr).splitlines()) - 1
  assert '\ufffd' not in html


def test_user_names_are_escaped_everywhere():
  f, args = named_by_user(HOSTILE)
  report = analyze(f, *args)
  assert any(r.name == HOSTILE for r in report.residuals)
  for html in (viz.residual_table_html(report), viz.report_jaxprs_html(report),
               viz.to_svg(viz.split_graph(report))):
    assert '<img src=x' not in html
  comparison = compare(f, *args, policies=['nothing_saveable'])
  document = viz.report_html(comparison, report)
  assert '<img src=x' not in document and 'onerror=alert(1)>' not in document


# -- the HTML report and the command line -------------------------------------------

def test_report_opens_with_as_written_and_the_recommended_policy(comparison):
  document = viz.report_html(comparison, comparison.rows[0].report,
                             shown_because='the program as written')
  summary = document[document.index('<h2>In short</h2>'):document.index('</section>')]
  baseline = comparison.baseline
  # The rule, worked out here from the rows.
  below = [r for r in comparison.rows if r.on_pareto_front and r is not baseline
           and r.peak_bytes < baseline.peak_bytes]
  best = min(below, key=lambda r: (r.compiled_flops, r.peak_bytes), default=None)
  assert html_recommended(best) in summary
  assert 'Rule: ' in summary or best is None
  assert summary.index('<b>as written</b>') < summary.index('ecommend')
  # No warning box comes before the table: each row's warning is in its notes.
  assert 'class="warning"' not in document[:document.index('<h2>Policies compared</h2>')]
  assert ('<h2>Split diagrams</h2>' in document
          and 'below): as written (the program as written)' in document)
  # Its diagram is the one open.
  opened = re.findall(r'<details class="remat-diagram" open><summary>(.*?)</summary>', document)
  assert len(opened) == 1 and '<span class="remat-policy">as written</span>' in opened[0]


def _unrolled_mlp(num_layers=6, width=64, batch=32):
  keys = jax.random.split(jax.random.key(0), num_layers + 1)
  ws = [jax.random.normal(k, (width, width)) / width ** 0.5 for k in keys[:-1]]
  layer = rx.checkpoint(lambda w, x: jnp.tanh(x @ w))

  def mlp(ws, x):
    for w in ws:
      x = layer(w, x)
    return jnp.mean(x ** 2)
  return mlp, (ws, jax.random.normal(keys[-1], (batch, width)))


def test_report_says_in_one_line_where_xla_merged_the_recompute_away():
  f, args = _unrolled_mlp()
  comparison = compare(f, *args, policies=['nothing_saveable', 'dots_saveable',
                                           'everything_saveable'])
  merged = [r.label for r in comparison.rows if r.recompute_eliminated]
  if jax.default_backend() == 'cpu':  # premise: the CPU merges unrolled layers' recompute
    assert 'nothing_saveable' in merged
  document = viz.report_html(comparison, comparison.rows[0].report)
  summary = document[document.index('<h2>In short</h2>'):document.index('</section>')]
  assert summary.count('merged the recompute') == (1 if merged else 0)
  if merged:
    line = re.search(r'<p>[^<]*merged the recompute of ([^<]*) into', summary)
    assert line.group(1).split(', ') == [tables.html_text(label) for label in merged]
  assert 'class="warning"' not in document[:document.index('<h2>Policies compared</h2>')]


def html_recommended(row) -> str:
  if row is None:
    return 'nothing to recommend'
  return f'<b>Recommended: {tables.html_text(row.label)}</b>: compiled peak {viz.format_bytes(row.peak_bytes)}'


def test_report_has_every_section(comparison):
  report = comparison.row('dots_saveable').report
  document = viz.report_html(comparison, report)
  for heading in ('Policies compared', 'Memory along the compiled schedule',
                  'Split diagrams', 'Residuals under dots_saveable', 'Program'):
    assert f'<h2>{heading}</h2>' in document
  assert document.count('<img class="chart"') >= 4
  assert '<svg' in document and 'cluster' in document
  # Every policy's diagram sits in a pan-and-zoom viewer in a <details> that
  # names it (policies whose drawings are the same share one), and the
  # legend says what opens a group on this page; the viewer's script is
  # inlined: nothing is fetched (no CDN), once per document.
  summaries = re.findall(r'<details class="remat-diagram"[^>]*><summary>(.*?)</summary>',
                         document)
  named = [label for summary in summaries
           for label in re.findall(r'<span class="remat-policy">(.*?)</span>', summary)]
  assert sorted(named) == sorted(tables.html_text(r.label) for r in comparison.rows)
  assert document.count('class="remat-viewer-static"') == len(summaries) > 1
  assert 'opens with expand=' in document and 'click to open' not in document
  # Each script once: the viewer's and the timeline's.
  assert document.count('<script>') == 2 and document.count('mountStatic(document)') == 1
  assert document.count('mountTimelines(document);') == 1
  assert 'src="http' not in document and '<script src' not in document
  assert '.diagram svg { max-width: 100%' not in document  # never shrunk to fit


def test_viewer_script_loads_each_vendored_module_with_its_licence():
  from remat_explorer.viz.diagram import viewer
  script = viewer.viewer_script()
  for name in viewer.D3_MODULES:
    assert f"d3Load('{name}'" in script
    assert (viewer.STATIC / 'd3' / f'{name}.LICENSE').read_text().strip()
  assert '</script' not in script.lower()
  assert viewer.widget_module().rstrip().endswith('export default { render: renderWidget };')
  assert 'export default' not in viewer.viewer_assets_html()
  # Packaged: pyproject ships the static files with the module.
  assert '"static/d3/*"' in (ROOT / 'pyproject.toml').read_text()


def test_svg_image_fallback_is_base64_svg_at_natural_size():
  from remat_explorer.viz.diagram.viewer import svg_img_html
  import base64
  svg = '<svg width="3000pt" height="100pt"><text>&lt;x&gt;</text></svg>'
  html = svg_img_html(svg)
  data = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', html).group(1)
  assert base64.b64decode(data).decode() == svg
  assert 'max-width:none' in html and 'overflow:auto' in html
  assert '<svg' not in html  # nothing for a sanitizer to strip


def test_command_line_report(tmp_path):
  out = tmp_path / 'report.html'
  run = subprocess.run(
      [sys.executable, '-m', 'remat_explorer', 'report', '--fn', 'tests.test_viz:tiny_mlp',
       '--policy', "jax.checkpoint_policies.save_only_these_names('pre_activation')",
       '--out', str(out)],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr
  assert re.search(r'\[1/\d+\] compiled under ', run.stdout)
  assert 'compiled under as written' in run.stdout
  assert 'wrote' in run.stdout
  document = out.read_text()
  shown = "save_only_these_names(&#x27;pre_activation&#x27;)"
  assert f'<h2>Residuals under {shown}</h2>' in document
  assert f'below): {shown} (asked for with --policy)' in document
  opened = re.findall(r'<details class="remat-diagram" open><summary>(.*?)</summary>', document)
  assert len(opened) == 1 and f'<span class="remat-policy">{shown}</span>' in opened[0]
  # It opens with the program as written; the shown policy's timeline and
  # what is live at its peak follow the comparison.
  assert document.index('<h2>In short</h2>') < document.index('<h2>Policies compared</h2>')
  assert re.search(r'<h2>In short</h2><p><b>as written</b>: compiled peak', document)
  assert f'<h3>Under {shown}: what is live at each step</h3>' in document
  assert 'class="remat-peak-table"' in document and '\x1b[' not in document


def test_command_line_rejects_an_unknown_policy_before_compiling(tmp_path, capsys):
  from remat_explorer.__main__ import report_main
  from remat_explorer.analysis.context import compiles_run
  before = compiles_run()
  assert report_main(['--fn', 'tests.test_viz:small_transformer', '--policy', 'dots_savable',
                      '--out', str(tmp_path / 'r.html')]) == 2
  said = capsys.readouterr()
  assert "'dots_savable' is not in jax.checkpoint_policies" in said.err
  assert 'compiled' not in said.out and compiles_run() == before
  assert not (tmp_path / 'r.html').exists()


# -- the Explorer ---------------------------------------------------------------------

def test_explorer_controls_change_the_views(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  assert isinstance(e, rx.Explorer)
  assert [e.tabs.get_title(i) for i in range(5)] == list(TABS)
  nothing = e.residual_view.value
  assert 'cluster' in e.diagram.svg and e.diagram.svg.startswith('<svg')
  assert 'Compile failed' not in e.costs_view.value and 'peak bytes' in e.costs_view.value
  e.policy.value = 'everything_saveable'
  e.wait(300)
  everything = e.residual_view.value
  count = lambda html: int(re.search(r'(\d+) residuals', html).group(1))
  assert count(everything) > count(nothing)
  # The named-value policy shows the names found in the program.
  assert e.names_select.layout.display == 'none'
  e.policy.value = _NAMED
  assert e.names_select.layout.display == ''
  assert set(e.names_select.options) == set(analyze(f, *args).names_in_program)
  e.names_select.value = ('query',)
  e.wait(300)
  assert "save_only_these_names(&#x27;query&#x27;)" in e.residual_view.value
  e.lowering.value = 'none'
  e.wait(300)
  assert e.current_report().lowering == 'none'


def test_the_residual_chart_is_drawn_once_for_each_report(problem, monkeypatch):
  """The residual chart is drawn once its tab is open, not while another
  tab is. Sorting the residual table or picking a block redraws the views
  of the same report: its table follows, its chart is the one drawn
  before. Another policy's report gets a chart of its own."""
  from remat_explorer.viz.widget import explorer as explorer_module
  drawn = []
  plot = explorer_module.plot_residuals_by_origin
  monkeypatch.setattr(explorer_module, 'plot_residuals_by_origin',
                      lambda report: drawn.append(report.policy) or plot(report))
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  charts = lambda: e.residual_view.value.count('<div class="remat-chart"')
  chart = lambda: e.residual_view.value[e.residual_view.value.index('<div class="remat-chart"'):]
  table = lambda: re.findall(r'<tr><td>(\d+)</td>', e.residual_view.value)
  assert e.tabs.selected_index != TABS.index('Residuals')
  assert drawn == [] and charts() == 0 and table()
  e.tabs.selected_index = TABS.index('Residuals')
  assert len(drawn) == 1 and charts() == 1
  first_chart, by_bytes = chart(), table()
  e.sort_by.value = 'index'
  assert table() == sorted(by_bytes, key=int) != by_bytes
  e.block.value = e.block.options[-1]
  assert e.block.value != e.block.options[0]
  e.wait(300)
  assert chart() == first_chart and len(drawn) == 1
  e.policy.value = 'everything_saveable'
  e.wait(300)
  assert drawn[1:] == ['everything_saveable'] and chart() != first_chart
  # Another tab open: a new policy's table follows, its chart waits for the tab.
  e.tabs.selected_index = TABS.index('Costs')
  e.policy.value = 'dots_saveable'
  e.wait(300)
  assert drawn[2:] == [] and charts() == 0 and 'dots_saveable' in e.residual_view.value
  e.tabs.selected_index = TABS.index('Residuals')
  assert drawn[2:] == ['dots_saveable'] and charts() == 1


def test_every_caption_names_policy_lowering_and_device(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.lowering.value = 'cond'
  e.policy.value = 'dots_saveable'
  e.wait(300)
  device = jax.devices()[0].device_kind
  for view in (e.split_note, e.residual_view, e.costs_view, e.program_view):
    caption = re.search(r'<p class="remat-caption">(.*?)</p>', view.value).group(1)
    assert 'dots_saveable' in caption and 'lowering cond' in caption, caption
    assert f'device {device}' in caption, caption


def test_a_single_compile_shows_an_indeterminate_bar_and_greys_the_old_costs(problem):
  f, args = problem
  e = rx.explore(f, *args)
  # Straight after a change the compile is running: no count to show.
  assert '<progress></progress>' in e.progress.value
  assert 'compiling under as written · lowering barrier' in e.progress.value
  assert _panels.STALE in e.costs_tab._dom_classes
  e.wait(300)
  assert e.progress.value == '' and _panels.STALE not in e.costs_tab._dom_classes
  e.policy.value = 'dots_saveable'
  assert _panels.STALE in e.costs_tab._dom_classes  # old figures, marked
  assert 'compiled under as written' in e.costs_view.value
  e.wait(300)
  assert _panels.STALE not in e.costs_tab._dom_classes
  assert 'compiled under dots_saveable' in e.costs_view.value


def test_the_costs_tab_shows_the_estimate_until_the_compile_lands(problem):
  """While a policy's compile runs, the Costs tab says what the jaxpr's
  estimate (``estimate_costs``) gives, marked as an estimate; the compiled
  figures replace it, and a late estimate does not come back over them."""
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  shown = []
  e.estimate_view.observe(lambda change: shown.append(change['new']), names='value')
  e.policy.value = 'dots_saveable'
  assert 'estimating under dots_saveable' in e.progress.value
  e.wait(300)
  assert e.estimate_view.value == '' and 'compiled under dots_saveable' in e.costs_view.value
  estimate = rx.estimate_costs(f, *args, policy=jax.checkpoint_policies.dots_saveable)
  said = _panels.estimate_html('dots_saveable', estimate)
  assert 'Estimated from the jaxpr' in said and format_bytes(estimate.peak_bytes) in said
  assert f'XLA:{jax.devices()[0].platform.upper()}' in said
  assert all(value in ('', said) for value in shown)
  # An estimate that lands after the compiled figures is dropped.
  e._show_estimate(e._generation, 'dots_saveable', estimate)
  assert e.estimate_view.value == ''
  # One that lands first is shown, and the compile's figures clear it.
  e._generation += 1
  e._show_estimate(e._generation, 'dots_saveable', estimate)
  assert e.estimate_view.value == said
  e._show_costs(e._generation, e.costs_view.value, dict(e._snapshot_costs))
  assert e.estimate_view.value == ''


def test_progress_is_determinate_only_with_a_known_count():
  from remat_explorer.viz.widget._work import Task
  html = _panels.progress_html([Task('comparing', 2, 6, 'dots_saveable'),
                                Task('compiling under x<y>')])
  assert '<progress value="2" max="6"></progress>' in html
  assert 'comparing: dots_saveable (2/6)' in html
  assert '<progress></progress><span>compiling under x&lt;y&gt;…</span>' in html
  assert _panels.progress_html([]) == ''


def test_explorer_compare_and_pick_from_the_front(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  e.compare_button.click()
  assert _panels.STALE in e.compare_view._dom_classes
  e.wait(600)
  assert _panels.STALE not in e.compare_view._dom_classes
  assert 'remat-comparison-table' in e.compare_view.value
  assert 'no remat' in e.pareto_pick.options and 'dots_saveable' in e.pareto_pick.options
  # Filling the buttons picked nothing: the policy is the user's.
  assert e.policy.value == 'as written'
  e.pareto_pick.value = 'dots_saveable'
  assert e.policy.value == 'dots_saveable'
  assert 'dots_saveable' in e.residual_view.value
  # Another lowering makes the comparison out of date, and says so.
  e.lowering.value = 'cond'
  assert _panels.OUTDATED in e.compare_view._dom_classes
  e.lowering.value = 'barrier'
  assert _panels.OUTDATED not in e.compare_view._dom_classes
  e.wait(300)


def test_the_comparison_charts_are_drawn_once_the_compare_tab_is_open(problem, monkeypatch):
  """A comparison run with another tab open shows its table at once and
  draws its Pareto and memory charts when the Compare tab opens; run with
  the tab open, it draws them on the worker."""
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  first_lowering = e.lowering.value
  assert first_lowering != 'cond'
  charts = lambda: e.compare_view.value.count('<div class="remat-chart"')
  e.compare_button.click()
  e.wait(600)
  assert e.tabs.selected_index != TABS.index('Compare')
  assert 'remat-comparison-table' in e.compare_view.value and charts() == 0
  e.tabs.selected_index = TABS.index('Compare')
  assert charts() == 2 and 'remat-comparison-table' in e.compare_view.value
  drawn = e.compare_view.value
  e.tabs.selected_index = TABS.index('Costs')
  e.tabs.selected_index = TABS.index('Compare')
  assert e.compare_view.value == drawn  # not drawn again
  e.lowering.value = 'cond'
  e.wait(300)
  e.compare_button.click()
  e.wait(600)
  assert charts() == 2 and 'lowering cond' in e.compare_view.value
  # Opened after the comparison's worker found the tab closed: the charts
  # are drawn when its result lands. (Back under the first lowering, whose
  # compiles are cached: only the order matters here.)
  import threading
  from remat_explorer.viz.widget._comparison import ComparisonTab
  checked, is_open = threading.Event(), ComparisonTab.is_open
  def noting(tab):
    if threading.current_thread() is not threading.main_thread():
      checked.set()
    return is_open(tab)
  monkeypatch.setattr(ComparisonTab, 'is_open', noting)
  e.tabs.selected_index = TABS.index('Costs')
  e.lowering.value = first_lowering
  e.wait(300)
  e.compare_button.click()
  assert checked.wait(300)
  e.tabs.selected_index = TABS.index('Compare')
  e.wait(600)
  assert charts() == 2 and f'lowering {first_lowering}' in e.compare_view.value


def test_explorer_search_adds_its_policy_and_wait_covers_what_it_starts(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  e.budget.value = 0.3
  e.search_button.click()
  e.wait(600)  # the search, the policy it selects and that policy's compile
  assert e.search_result is not None
  assert e.policy.value == e.search_result.label
  assert e.search_result.label in e.policy.options
  assert not e._work.tasks and e.progress.value == ''
  assert f'compiled under {e.search_result.label}' in e.costs_view.value


def test_wait_times_out_on_the_whole_wait(problem, monkeypatch):
  # The comparison is held until the wait has timed out: with its compiles
  # cached it could end first.
  import threading
  from remat_explorer.viz.widget import _comparison
  release, real = threading.Event(), _comparison.compare
  monkeypatch.setattr(_comparison, 'compare',
                      lambda *a, **k: release.wait(60) and real(*a, **k))
  f, args = problem
  e = rx.explore(f, *args)
  e.compare_button.click()
  with pytest.raises(TimeoutError, match='comparing policies'):
    e.wait(0.2)
  release.set()
  e.wait(600)
  assert e.comparison is not None


def test_widgets_change_on_the_main_thread_only(problem, monkeypatch):
  import threading
  import ipywidgets
  threads = set()
  notify = ipywidgets.Widget.notify_change
  def recording(self, change):
    threads.add(threading.current_thread().name)
    return notify(self, change)
  monkeypatch.setattr(ipywidgets.Widget, 'notify_change', recording)
  f, args = problem
  e = rx.explore(f, *args)
  e.compare_button.click()
  e.search_button.click()
  e.wait(600)
  assert e.search_result is not None and e.comparison is not None
  assert threads == {threading.main_thread().name}, threads


def test_explorer_shows_errors_and_keeps_the_last_view(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  before = e.diagram.svg
  e.policies['broken'] = lambda *a, **k: 1 / 0  # a policy that raises
  e.policy.options = [*e.policy.options, 'broken']
  e.policy.value = 'broken'
  e.wait(300)
  assert 'ZeroDivisionError' in e.error.value or 'division' in e.error.value
  assert e.diagram.svg == before
  e.policy.value = 'dots_saveable'  # a working policy clears the error
  e.wait(300)
  assert e.error.value == ''


def test_report_warnings_go_with_their_views_and_clear(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.policies['names nothing'] = rx.checkpoint_policies.save_only_these_names('no_such_name')
  e.policy.options = [*e.policy.options, 'names nothing']
  e.policy.value = 'names nothing'
  warning = 'no_such_name'
  assert warning in e.split_note.value and warning in e.residual_view.value
  assert warning not in e.error.value
  assert e.split_note.value.count('class="warning"') == len(
      set(e.current_report().warnings))
  e.policy.value = 'dots_saveable'
  assert warning not in e.split_note.value and warning not in e.residual_view.value
  e.wait(300)


def test_comparison_warnings_sit_in_their_rows_once(comparison):
  html = viz.comparison_table_html(comparison).replace('<wbr>', '')  # break points
  warned = {r.label: r.warnings for r in comparison.rows if r.warnings}
  assert warned  # on the CPU some policies do not lower the peak
  for label, warnings in warned.items():
    # The notes row right after the policy's row.
    shown = tables.html_text(charts.short_label(label, tables.LABEL_CHARS))
    row = re.search(rf'<tr[^>]*><td[^>]*>{re.escape(shown)}</td>.*?</tr>'
                    r'<tr class="remat-notes">.*?</tr>', html)
    for warning in warnings:
      assert row.group(0).count(tables.html_text(warning)) == 1
  # Every warning of the comparison is one of a row's, which the table shows.
  carried = {f'{r.label}: {w}' for r in comparison.rows for w in r.warnings}
  assert set(comparison.warnings) <= carried


def test_each_row_carries_its_own_warnings(comparison):
  baseline = comparison.baseline
  warned = [r for r in comparison.rows if r.warnings]
  assert warned  # premise: on the CPU some policies do not lower the peak
  for r in comparison.rows:
    # A row warns exactly when its compiled peak is not below no remat's.
    assert bool(r.warnings) == (r is not baseline and r.peak_bytes >= baseline.peak_bytes)
    assert len(set(r.warnings)) == len(r.warnings)
  assert list(comparison.warnings) == [f'{r.label}: {w}' for r in comparison.rows
                                       for w in r.warnings]
  folded = 0
  for r in warned:
    # Residuals alike (one per layer) are one item, with how many.
    alike = {}
    for x in r.report.residuals:
      if x.kind != 'argument':
        alike[f'{x.type_string} {x.description}'] = alike.get(
            f'{x.type_string} {x.description}', 0) + 1
    for text, count in alike.items():
      if text in r.warnings[0] and count > 1:
        assert f'{text} (×{count})' in r.warnings[0]
        folded += 1
    assert tables.row_note(r).startswith(r.warnings[0][:40])
  assert folded  # premise: two layers keep residuals alike


def test_a_click_on_a_collapsed_call_opens_it():
  def block(x):
    y, _ = jax.lax.scan(lambda c, _: (jnp.cos(c) * x, None), x, None, length=3)
    return jnp.sum(jnp.tanh(y))
  e = rx.explore(rx.checkpoint(block), jnp.ones(4))
  calls = re.findall(r'<g id="([^"]+)" class="node sub', e.diagram.svg)
  assert calls, 'no collapsed call drawn'
  before = e.diagram.svg
  e.diagram.clicked = calls[0]
  e.diagram.click_count += 1
  assert e.diagram.svg != before and f'{calls[0]}_j0' in e.diagram.svg
  e.diagram.click_count += 1  # the same node again closes it
  assert e.diagram.svg == before
  e.diagram.clicked = 'f0_i0'  # not a call: the drawing stays
  e.diagram.click_count += 1
  assert e.diagram.svg == before
  e.wait(300)


def test_a_split_graph_shows_in_a_notebook_as_an_image(problem):
  # A Digraph's own image/svg+xml is not rendered in an untrusted notebook.
  digraph = viz.split_graph(analyze(*problem[:1], *problem[1]))
  bundle = digraph._repr_mimebundle_()
  assert set(bundle) == {'text/html', 'text/plain'}
  assert '<img class="diagram"' in bundle['text/html'] and '<svg' not in bundle['text/html']
  # A click on an image opens nothing: its legend and tooltips say so.
  import base64
  image = base64.b64decode(re.search(r'base64,([^"]+)', bundle['text/html']).group(1)).decode()
  assert 'click to open' in digraph.source  # the Explorer's drawing, where a click opens
  assert 'click to open' not in image and 'click (or pass' not in image
  assert 'opens with expand=' in image and 'pass this id in expand= to open it' in image


def test_static_view_without_widgets(problem):
  report = analyze(*problem[:1], *problem[1])
  html = viz.StaticView(report)._repr_html_()
  assert 'data:image/svg+xml;base64,' in html and 'remat-residual-table' in html
  assert '<svg' not in html


def test_explorer_falls_back_to_static_html_where_widgets_do_not_run(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  bundle = e._repr_mimebundle_()
  assert bundle['application/vnd.jupyter.widget-view+json']['model_id'] == e.widget.model_id
  static = bundle['text/html']
  # An image of the diagram: an untrusted notebook's sanitizer strips
  # inline SVG (leaving its text) but keeps images.
  assert '<img class="diagram"' in static and 'data:image/svg+xml;base64,' in static
  assert '<svg' not in static and 'remat-residual-table' in static
  assert f'under policy {tables.html_text(e.current_report().policy)}' in static


def test_explorer_keeps_only_the_latest_compile(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.policy.value = 'everything_saveable'
  e.policy.value = 'dots_saveable'  # before the first compile ends
  e.wait(600)
  assert 'compiled under dots_saveable' in e.costs_view.value
  assert 'everything_saveable' not in e.costs_view.value
  assert e.progress.value == ''


def test_explorer_buttons_are_never_cut(problem):
  f, args = problem
  e = rx.explore(f, *args)
  assert e.compare_button.layout.width == 'auto' and e.search_button.layout.width == 'auto'
  assert e.pareto_pick.style.button_width == 'auto'
  e.wait(300)


# -- text, tables and jaxprs ------------------------------------------------------------

def test_jaxpr_listing_has_no_terminal_colours_where_jax_would_print_them(monkeypatch):
  from jax._src import pretty_printer
  monkeypatch.setattr(pretty_printer, 'CAN_USE_COLOR', True)  # as in a notebook
  f = rx.checkpoint(lambda x: jnp.sin(jnp.sin(x)),
                    policy=rx.checkpoint_policies.everything_saveable)
  report = analyze(f, jax.random.normal(jax.random.key(0), (3,)))
  assert '\x1b[' in str(report.forward_jaxpr)  # what JAX prints there
  html = viz.report_jaxprs_html(report)
  assert '\x1b' not in html and '\ufffd' not in html
  assert len(re.findall(r'<mark class="residual">', html)) >= 2


def test_html_text_drops_terminal_escapes():
  from remat_explorer.viz.text import html_text
  assert html_text('a\x1b[35m:f32[8,32]\x1b[39m<b>') == 'a:f32[8,32]&lt;b&gt;'


def test_repeated_warning_lines_and_items_show_once():
  from remat_explorer.viz.text import unique_lines
  line = 'p: peak is not below. Largest: f32[8] a at m.py:3; f32[8] a at m.py:3; f32[8] a at m.py:3.'
  assert unique_lines([line, line, 'q']) == [
      'p: peak is not below. Largest: f32[8] a at m.py:3 (×3).', 'q']


def test_columns_without_data_are_hidden(comparison, problem):
  html = viz.comparison_table_html(comparison)  # compared without running
  assert all(r.run_seconds is None for r in comparison.rows)
  assert '<th>run</th>' not in html and '<th>compile</th>' in html
  cells = re.search(r'<tr class="pareto[^"]*">(.*?)</tr>', html).group(1)
  assert cells.count('<td') == html.split('<tbody>')[0].count('<th>')
  no_names = analyze(*problem[:1], *problem[1], policy=rx.checkpoint_policies.nothing_saveable)
  assert all(r.name is None for r in no_names.residuals)
  assert '<th>name</th>' not in viz.residual_table_html(no_names)
  named = analyze(*problem[:1], *problem[1],
                  policy=rx.checkpoint_policies.save_only_these_names('query'))
  assert '<th>name</th>' in viz.residual_table_html(named)


def test_graphviz_warnings_are_kept_not_printed(capfd):
  from remat_explorer.viz.diagram.render import graphviz_notes_html, render_svg
  import graphviz
  g = graphviz.Digraph()
  g.node('a', shape='no_such_shape')  # dot warns (twice, kept once) and draws
  g.node('b', shape='no_such_shape')
  rendered = render_svg(g)
  out, err = capfd.readouterr()
  assert out == '' and err == ''
  assert rendered.svg.lstrip().startswith('<?xml')
  assert rendered.warnings == ('Warning: using box for unknown shape no_such_shape',)
  note = graphviz_notes_html(rendered.warnings)
  assert '<details' in note and 'layout warning' in note


def test_html_text_keeps_line_breaks_and_drops_other_control_characters():
  from remat_explorer.viz.text import html_text
  assert html_text('a\nb\t<c>') == 'a\nb\t&lt;c&gt;'
  assert html_text('x\x00y\x1b') == 'x\ufffdy\ufffd'


def test_a_dollar_in_a_users_name_prints_as_a_dollar():
  def block(x, w):
    return jnp.sum(rx.checkpoint_name(jnp.sin(x @ w), r'cost$\bad{$') * x)
  x = jax.random.normal(jax.random.key(3), (4, 4))
  w = jax.random.normal(jax.random.key(4), (4, 4))
  report = analyze(rx.checkpoint(block, policy=rx.checkpoint_policies.everything_saveable), x, w)
  fig = viz.plot_residuals_by_origin(report)
  fig.savefig(__import__('io').BytesIO(), format='png')  # mathtext would raise here
  labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
  assert any(r'cost$\bad{$' in label for label in labels)
