"""Charts, tables, the HTML report, the command line and the Explorer widget,
checked for what they show on small example models."""

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
from remat_explorer.viz import charts, tables
from remat_explorer.viz.explorer import _NAMED
from remat_explorer.viz.text import byte_unit

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = '<img src=x onerror=alert(1)>&"'


def small_transformer():
  """Two unrolled layers, small enough to compile every policy in seconds;
  ``--fn tests.test_viz:small_transformer`` uses it too."""
  return examples.transformer(num_layers=2, d_model=32, seq_len=16, batch=2)


@pytest.fixture(scope='module')
def problem():
  return small_transformer()


@pytest.fixture(scope='module')
def comparison(problem):
  return compare(*problem[:1], *problem[1])


def _hostile_problem():
  def block(x, w):
    h = rx.checkpoint_name(jnp.sin(x @ w), HOSTILE)
    return jnp.sum(jnp.cos(h) * x)
  x = jax.random.normal(jax.random.key(1), (8, 8))
  w = jax.random.normal(jax.random.key(2), (8, 8))
  return rx.checkpoint(block, policy=rx.checkpoint_policies.save_only_these_names(HOSTILE)), (x, w)


# -- charts -----------------------------------------------------------------------

def test_breakdown_parts_add_up_to_xla_accounting(comparison):
  for row in comparison.rows:
    parts = charts.memory_breakdown(row)
    c = row.costs
    assert sum(parts.values()) == c.argument_bytes + c.output_bytes + c.temp_bytes
    assert 0 <= parts['residuals at peak'] <= c.temp_bytes
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
  labels = [t.get_text() for t in ax.texts]
  assert sorted(labels) == sorted(charts.short_label(p[0]) for p in points)
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


def test_memory_timeline_overlays_policies(comparison):
  chosen = {r.label: r.costs for r in comparison.rows[:3]}
  ax = viz.plot_memory_timeline(chosen).axes[0]
  lines = [l for l in ax.get_lines() if '(peak' in l.get_label()]
  assert len(lines) == 3
  scale = byte_unit(max(c.timeline.peak_bytes for c in chosen.values()))
  for line, costs in zip(lines, chosen.values()):
    assert np.max(line.get_ydata()) == pytest.approx(costs.timeline.peak_bytes / scale)
    residual = np.array(costs.timeline.residual_bytes_by_step())
    assert np.all(residual <= np.array(costs.timeline.live_bytes))
  assert 'residual' in ax.get_title()


def test_per_device_memory_chart_of_a_one_device_comparison(comparison):
  ax = viz.plot_per_device_memory(comparison).axes[0]
  rows = [r for r in comparison.rows if not r.failed]
  assert [t.get_text() for t in ax.get_yticklabels()] == [
      charts.short_label(r.label, 48) for r in rows]
  assert '1 device' in ax.get_title() and 'per device' in ax.get_xlabel()
  scale = byte_unit(max(charts.total_per_device(r.costs) for r in rows))
  for i, row in enumerate(rows):  # each bar ends at XLA's total for its program
    ends = [p.get_x() + p.get_width() for p in ax.patches[i::len(rows)]]
    assert max(ends) == pytest.approx(charts.total_per_device(row.costs) / scale)


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
  html = viz.comparison_table_html(comparison)
  assert html.count('<tr') - 1 == len(comparison.rows)  # minus the header
  assert html.count('class="pareto"') == len(comparison.pareto_front)
  for row in comparison.rows:
    assert tables.html_text(row.label) in html


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
  f, args = _hostile_problem()
  report = analyze(f, *args)
  assert any(r.name == HOSTILE for r in report.residuals)
  for html in (viz.residual_table_html(report), viz.report_jaxprs_html(report),
               viz.to_svg(viz.split_graph(report))):
    assert '<img src=x' not in html
  comparison = compare(f, *args, policies=['nothing_saveable'])
  document = viz.report_html(comparison, report)
  assert '<img src=x' not in document and 'onerror=alert(1)>' not in document


# -- the HTML report and the command line -------------------------------------------

def test_report_has_every_section(comparison):
  report = comparison.row('dots_saveable').report
  document = viz.report_html(comparison, report)
  for heading in ('Policies compared', 'Memory along the compiled schedule',
                  'Split under dots_saveable', 'Residuals under dots_saveable', 'Program'):
    assert f'<h2>{heading}</h2>' in document
  assert document.count('<img class="chart"') >= 4
  assert '<svg' in document and 'cluster' in document
  assert '<script' not in document
  assert 'src="http' not in document  # self-contained


def test_command_line_report(tmp_path):
  out = tmp_path / 'report.html'
  run = subprocess.run(
      [sys.executable, '-m', 'remat_explorer', 'report', '--fn',
       'tests.test_viz:small_transformer', '--policy',
       "jax.checkpoint_policies.save_only_these_names('query', 'mlp_hidden')",
       '--out', str(out)],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr
  assert re.search(r'\[1/\d+\] compiled under ', run.stdout)
  assert 'compiled under as written' in run.stdout
  assert 'wrote' in run.stdout
  assert "Split under save_only_these_names(&#x27;mlp_hidden&#x27;, &#x27;query&#x27;)" in out.read_text()


def test_command_line_rejects_an_unknown_policy_before_compiling(tmp_path):
  run = subprocess.run(
      [sys.executable, '-m', 'remat_explorer', 'report', '--fn',
       'tests.test_viz:small_transformer', '--policy', 'dots_savable',
       '--out', str(tmp_path / 'r.html')],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 2
  assert "'dots_savable' is not in jax.checkpoint_policies" in run.stderr
  assert 'compiled' not in run.stdout


# -- the Explorer ---------------------------------------------------------------------

def test_explorer_controls_change_the_views(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  assert isinstance(e, rx.Explorer)
  assert [e.tabs.get_title(i) for i in range(5)] == list(viz.explorer.TABS)
  nothing = e.residual_view.value
  assert 'cluster' in e.split_view.value and '<svg' in e.split_view.value
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


def test_explorer_compare_and_pick_from_the_front(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  e.compare_button.click()
  e.wait(600)
  assert 'remat-comparison-table' in e.compare_view.value
  assert 'no remat' in e.pareto_pick.options and 'dots_saveable' in e.pareto_pick.options
  e.pareto_pick.value = 'dots_saveable'
  assert e.policy.value == 'dots_saveable'
  assert 'dots_saveable' in e.residual_view.value


def test_explorer_search_adds_its_policy(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  e.budget.value = 0.3
  e.search_button.click()
  e.wait(600)
  assert e.search_result is not None
  assert e.policy.value == e.search_result.label
  assert e.search_result.label in e.policy.options


def test_explorer_shows_errors_and_keeps_the_last_view(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  before = e.split_view.value
  e.policies['broken'] = lambda *a, **k: 1 / 0  # a policy that raises
  e.policy.options = [*e.policy.options, 'broken']
  e.policy.value = 'broken'
  e.wait(300)
  assert 'ZeroDivisionError' in e.error.value or 'division' in e.error.value
  assert e.split_view.value == before


def test_static_view_without_widgets(problem):
  report = analyze(*problem[:1], *problem[1])
  html = viz.StaticView(report)._repr_html_()
  assert '<svg' in html and 'remat-residual-table' in html


def test_explorer_falls_back_to_static_html_where_widgets_do_not_run(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  bundle = e._repr_mimebundle_()
  assert bundle['application/vnd.jupyter.widget-view+json']['model_id'] == e.widget.model_id
  static = bundle['text/html']
  assert '<svg' in static and 'remat-residual-table' in static
  assert f'under policy {e.policy.value}' in static


def test_explorer_keeps_only_the_latest_compile(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.policy.value = 'everything_saveable'
  e.policy.value = 'dots_saveable'  # before the first compile ends
  e.wait(600)
  assert 'compiled under dots_saveable' in e.costs_view.value
  assert 'everything_saveable' not in e.costs_view.value
  assert e.progress.layout.visibility == 'hidden'


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
