"""Layouts of one long scan compared side by side, each schedule's
predicted costs beside what its jaxpr and XLA show."""

import re
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer.analysis import analyze, compare
from remat_explorer.analysis.tradeoffs.layouts import scan_layouts

N, BATCH, HIDDEN, FEATURES = 24, 4, 32, 8


def _rnn(schedule, **options):
  """A small RNN over N steps; `schedule` None is plain ``lax.scan``."""
  rng = np.random.default_rng(11)
  w = jnp.asarray(rng.standard_normal((HIDDEN, HIDDEN)) / HIDDEN ** 0.5, jnp.float32)
  u = jnp.asarray(rng.standard_normal((FEATURES, HIDDEN)) / FEATURES ** 0.5, jnp.float32)
  xs = jnp.asarray(rng.standard_normal((N, BATCH, FEATURES)), jnp.float32)

  def loss(params, xs):
    w, u = params
    h0 = jnp.zeros((BATCH, HIDDEN))
    scan = (jax.lax.scan if schedule is None else
            lambda f, c, x: rx.checkpointed_scan(f, c, x, schedule=schedule, **options))
    h, _ = scan(lambda h, x: (jnp.tanh(h @ w + x @ u), None), h0, xs)
    return jnp.mean(h ** 2)
  return loss, ((w, u), xs)


LAYOUTS = {'lax.scan': (None, {}), 'every': ('every', {}), 'sqrt': ('sqrt', {}),
           'segments=3': ('segments', {'segments': 3}),
           'binomial s=3': (('binomial', 3), {})}


@pytest.fixture(scope='module')
def comparison():
  layouts = {label: _rnn(schedule, **options)[0]
             for label, (schedule, options) in LAYOUTS.items()}
  return compare(layouts, *_rnn(None)[1])


def test_one_row_per_layout_on_one_pareto_front(comparison):
  assert [r.label for r in comparison.rows] == list(LAYOUTS)
  assert all(r.policy is None and not r.failed for r in comparison.rows)
  assert comparison.pareto_front
  # More recompute the fewer carries a schedule keeps; plain scan keeps all
  # of every step's intermediates.
  by_label = {r.label: r for r in comparison.rows}
  assert by_label['lax.scan'].residual_bytes > by_label['every'].residual_bytes
  assert (by_label['lax.scan'].flops < by_label['every'].flops < by_label['sqrt'].flops
          < by_label['binomial s=3'].flops)
  # So is the recompute the rows report, the binomial loop's (no blocks) too,
  # and what the compiled programs execute.
  assert (0 == by_label['lax.scan'].recompute_flops < by_label['every'].recompute_flops
          < by_label['sqrt'].recompute_flops < by_label['binomial s=3'].recompute_flops)
  assert (by_label['lax.scan'].compiled_flops < by_label['every'].compiled_flops
          < by_label['sqrt'].compiled_flops < by_label['binomial s=3'].compiled_flops)


def test_each_schedule_shows_its_prediction_beside_the_measurement(comparison):
  """The predicted recompute, in steps, against two measurements: the
  FLOPs XLA's compiled program executes beyond plain ``lax.scan`` (the
  same step, nothing recomputed; each loop body once per trip) and the
  recompute the jaxpr shows, each over the FLOPs of one step. XLA executes
  the prediction within half a step, plus at most 5% for the binomial
  loop's bookkeeping (its counters and branches)."""
  plain = comparison.row('lax.scan')
  assert plain.scan_layouts == ()
  for row in comparison.rows:
    if row is plain:
      continue
    (check,) = row.scan_layouts
    assert check.steps == N and check.carry == f'f32[{BATCH},{HIDDEN}]'
    # The layouts are labelled with their schedules' names.
    assert check.schedule == check.predicted.schedule == row.label
    predicted = check.predicted.recomputed_steps
    executed = (row.compiled_flops - plain.compiled_flops) / check.step_flops
    assert predicted - 0.5 <= executed <= 1.05 * predicted, row.label
    assert check.recomputed_steps == pytest.approx(predicted, abs=0.5), row.label
    assert check.forward_carries > 0 and check.temp_carries > 0


def test_the_forward_pass_keeps_fewer_carries_under_deeper_schedules(comparison):
  # Residuals of the carry's shape: every step's carry under 'every' (and
  # the last step's output), a segment's under 'sqrt', fewer still nested.
  by_label = {r.label: r.scan_layouts[0] for r in comparison.rows if r.scan_layouts}
  assert by_label['every'].forward_carries in (N, N + 1)
  assert by_label['sqrt'].forward_carries < by_label['every'].forward_carries
  assert by_label['binomial s=3'].forward_carries < by_label['every'].forward_carries


def test_a_schedule_whose_temp_xla_does_not_keep_is_warned_of(comparison):
  """'sqrt' nests its blocks, and XLA keeps copies per level: it holds more
  temporaries than 'every', which keeps a carry per step. The binomial loop
  holds no more than its carries, one step and its inputs' cotangents."""
  rows = {r.label: r for r in comparison.rows}
  sqrt, every, binomial = (rows[k].scan_layouts[0] for k in ('sqrt', 'every', 'binomial s=3'))
  assert sqrt.temp_carries > every.temp_carries > every.predicted.stored_carries
  assert sqrt.temp_carries > 1.25 * sqrt.expected_temp_carries
  (warning,) = rows['sqrt'].warnings
  assert 'checkpointed_scan[sqrt; n=24]' in warning and 'more than 1.25 times' in warning
  assert f'sqrt: {warning}' in comparison.warnings
  assert binomial.temp_carries <= binomial.expected_temp_carries
  assert rows['binomial s=3'].warnings == () and rows['every'].warnings == ()
  # The expected temp's parts: the schedule's carries, one step's values
  # (a few carries: h @ w, x @ u, their sum, tanh) and the inputs (w, u, xs
  # and the carry), in carries of BATCH x HIDDEN floats.
  inputs = (HIDDEN * HIDDEN + FEATURES * HIDDEN + N * BATCH * FEATURES) / (BATCH * HIDDEN) + 1
  assert every.input_carries == pytest.approx(inputs)
  assert 3 <= every.step_carries <= 6


def test_a_mapping_of_functions_takes_no_policies():
  loss, args = _rnn('every')
  with pytest.raises(TypeError, match='for a mapping of functions, each is compared as written'):
    compare({'every': loss}, *args, policies=['dots_saveable'])
  with pytest.raises(TypeError, match="maps 'every' to 3"):
    compare({'every': 3}, *args)


def test_a_program_without_a_checkpointed_scan_has_no_layout_to_check():
  loss, args = _rnn(None)
  assert scan_layouts(analyze(loss, *args)) == ()


def test_nested_layouts_report_each_level():
  loss, args = _rnn('sqrt')
  report = analyze(loss, *args)
  segments = rx.scan_schedule_costs(N, 'sqrt').stored_carries  # ~ k + n // k
  names = {b.name for b in report.blocks}
  assert 'checkpointed_scan_block' in names  # the layout's blocks, named as such
  outer, inner = report.levels()
  assert (outer.level, inner.level) == (0, 1)
  # Every step runs once inside the segments. Under sqrt each step is
  # evaluated twice more: once in its segment's recompute, once in its own:
  # the two levels recompute about as much.
  assert inner.runs == N and 0 < outer.runs < segments
  assert outer.recompute_flops == pytest.approx(inner.recompute_flops, rel=0.2)
  assert sum(level.recompute_flops for level in report.levels()) == report.recompute_flops


def test_the_tables_set_theory_beside_measurement(comparison):
  from remat_explorer.viz.html.layout_tables import nesting_levels_html, scan_layouts_html
  html = scan_layouts_html(comparison)
  for row in comparison.rows:
    for check in row.scan_layouts:
      assert f'<td>{check.schedule}</td>' in html
      assert f'<td>{check.predicted.recomputed_steps}</td>' in html
      assert f'<td>{check.recomputed_steps:.1f}</td>' in html
  assert html.count('<tr>') == 1 + sum(len(r.scan_layouts) for r in comparison.rows)
  sqrt = comparison.row('sqrt').report
  levels = nesting_levels_html(sqrt)
  assert levels.count('<tr>') == 1 + len(sqrt.levels()) == 3
  assert nesting_levels_html(comparison.row('lax.scan').report) == ''


def test_the_report_shows_layouts_in_theory_and_measured(comparison):
  from remat_explorer.viz.html.html_report import report_html
  sqrt = comparison.row('sqrt')
  html = report_html(comparison, sqrt.report).replace('<wbr>', '')  # break points
  assert re.search(r'<table class="[^"]*\bremat-layouts\b', html)
  assert re.search(r'<table class="[^"]*\bremat-levels\b', html)
  for row in comparison.rows:
    assert re.search(rf'<td[^>]*>{re.escape(row.label)}</td>', html), row.label


def test_the_explorer_switches_between_layouts_and_compares_them():
  layouts = {label: _rnn(schedule, **options)[0]
             for label, (schedule, options) in LAYOUTS.items()
             if label in ('lax.scan', 'every', 'sqrt')}
  args = _rnn(None)[1]
  e = rx.explore(layouts, *args)
  assert list(e.layout.options) == ['lax.scan', 'every', 'sqrt']
  assert e.layout.layout.display == ''
  assert e.f is layouts['lax.scan'] and e.policy.value == 'as written (no remat)'
  plain_residuals = e.current_report().residual_bytes
  e.layout.value = 'sqrt'
  e.wait(300)
  report = e.current_report()
  assert report.residual_bytes == analyze(layouts['sqrt'], *args).residual_bytes
  assert report.residual_bytes != plain_residuals
  assert 'checkpointed_scan_block' in e.block.options  # the layout's own blocks
  assert 'sqrt' in e.costs_view.value and e.error.value == ''
  # Every view's caption names the layout it shows.
  for view in (e.split_note, e.residual_view, e.program_view):
    assert 'under sqrt · ' in view.value, view.value[:200]

  e.compare_button.click()
  e.wait(600)
  assert [r.label for r in e.comparison.rows] == list(layouts)
  assert re.search(r'<table class="[^"]*\bremat-layouts\b', e.compare_view.value)
  assert e.pareto_pick.value == 'sqrt'
  e.pareto_pick.value = 'every'  # a pick on the chart's rows shows that layout
  e.wait(300)
  assert e.layout.value == 'every' and e.f is layouts['every']


def test_explore_names_a_bad_mapping():
  loss, args = _rnn('every')
  with pytest.raises(ValueError, match='empty mapping'):
    rx.explore({}, *args)
  with pytest.raises(TypeError, match="maps 'every' to int"):
    rx.explore({'every': 3}, *args)
