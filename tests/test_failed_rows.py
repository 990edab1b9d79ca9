"""A policy that fails stays in its row: the other rows complete, and the
reason is one line a user reads, without JAX's traceback note."""

import traceback

import jax
import jax.numpy as jnp
import pytest

import remat_explorer as rx
from remat_explorer.analysis import compare, error_summary
from remat_explorer.viz.charts import costs as charts
from remat_explorer.viz.html import tables


def _loss(w, x):
  block = rx.checkpoint(lambda w, x: jnp.sin(jnp.tanh(x @ w) @ w))
  return jnp.sum(block(w, x) ** 2)


def _args(seed):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return jax.random.normal(k1, (16, 16)), jax.random.normal(k2, (4, 16))


def _raising_policy(prim, *_, **params):
  raise KeyError(f'no rule for {prim}')


def test_a_failing_policy_is_a_failed_row_and_the_others_complete():
  args = _args(1)
  comparison = compare(_loss, *args, policies={
      'dots_saveable': rx.checkpoint_policies.dots_saveable,
      'raises': _raising_policy,
      'nothing_saveable': rx.checkpoint_policies.nothing_saveable})
  by_label = {r.label: r for r in comparison.rows}
  assert set(by_label) == {'as written', 'no remat', 'dots_saveable', 'raises',
                           'nothing_saveable'}
  failed = by_label['raises']
  assert failed.failed and failed.report is None and failed.peak_bytes is None
  assert not failed.on_pareto_front
  reason = failed.costs.error
  assert '\n' not in reason and reason.startswith('TypeError: ')
  assert '_raising_policy' in reason and 'internal frames' not in reason
  for label in ('as written', 'no remat', 'dots_saveable', 'nothing_saveable'):
    row = by_label[label]
    assert not row.failed and row.peak_bytes > 0 and row.flops > 0
  assert comparison.pareto_front  # the front is drawn from the rows that compiled
  # The table shows the failed row with its reason; the chart leaves it out.
  html = tables.comparison_table_html(comparison)
  assert 'raises' in html and 'no rule for' in html
  charts.plot_pareto(comparison)


def test_jax_traceback_note_is_left_out():
  with pytest.raises(TypeError) as info:
    jax.jit(lambda x: x.reshape(7))(jnp.ones(3))
  e = info.value
  full = ''.join(traceback.format_exception_only(type(e), e))
  assert 'removed its internal frames' in full  # what users were shown before
  summary = error_summary(e)
  assert 'internal frames' not in summary and summary.startswith('TypeError: ')
  assert 'reshape' in summary
  first = error_summary(e, one_line=True)
  assert '\n' not in first and summary.startswith(first.rstrip(' …'))


def test_a_row_whose_policy_names_nothing_in_the_program_says_so():
  """A misspelt checkpoint name saves nothing it was meant to save: the row
  says so, as the analysis (and the Explorer's policy box) does, naming the
  names the program has; a correctly spelt name gives no such warning."""
  from remat_explorer import examples
  loss, args = examples.mlp(num_layers=3, width=32, batch=8, seed=11)
  comparison = compare(loss, *args, policies=["save_only_these_names('pre_activaton')",
                                              "save_only_these_names('pre_activation')"],
                       suggest_lowering=False)
  typo = comparison.row("save_only_these_names('pre_activaton')")
  (warning,) = [w for w in typo.warnings if 'do not occur in the program' in w]
  assert 'pre_activaton' in warning and 'pre_activation' in warning.split('names in the program')[1]
  spelt = comparison.row("save_only_these_names('pre_activation')")
  assert not [w for w in spelt.warnings if 'do not occur' in w]
  # What the row saves is what saving nothing saves: the warning is why.
  assert typo.residual_bytes < spelt.residual_bytes


def _loss_xla_cannot_compile(w, x):
  """A step XLA refuses under every policy: its forward pass calls a
  kernel no handler is registered for (the program lowers; the compile
  fails)."""
  bias = jax.ffi.ffi_call('remat_explorer_unregistered_kernel',
                          jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  return _loss(w, x + bias)


@pytest.mark.parametrize('memory_budget, rank_by_estimate',
                         [(0.5, False), (1 << 20, False), (1 << 20, True)],
                         ids=['fraction', 'bytes', 'bytes, by estimate'])
def test_a_search_where_xla_compiles_nothing_says_xlas_reason(memory_budget, rank_by_estimate):
  """No candidate compiled is no answer: the search says so with XLA's
  first line, rather than failing on a missing peak (a fraction) or
  answering that nothing fits with a peak of "—" (bytes). Ranked by
  estimate, it compiles finalists, then the least memory, and says the same."""
  args = _args(4)
  with pytest.raises(RuntimeError) as info:
    rx.search_policy(_loss_xla_cannot_compile, *args, memory_budget=memory_budget,
                     rank_by_estimate=rank_by_estimate)
  message = str(info.value)
  assert 'remat_explorer_unregistered_kernel' in message and '\n' not in message
  assert ('fraction' in message) == isinstance(memory_budget, float)
  assert 'pass bytes' not in message  # bytes would not compile either
  # The comparison keeps each row, failed, with the same reason.
  rows = compare(_loss_xla_cannot_compile, *args, policies=['nothing_saveable']).rows
  assert rows and all(r.failed and 'remat_explorer_unregistered_kernel' in r.costs.error
                      for r in rows)
  # A row's note is XLA's first line, not the page of HLO XLA:GPU's messages
  # can quote after it (as its Triton matmul tiling's does).
  import dataclasses
  from remat_explorer.viz.html.tables import row_note
  hlo = '\n\t%dot.1134 = f32[1500,256]{1,0} dot(%bitcast.1276, %parameter_1.7)'
  row = dataclasses.replace(rows[0], costs=dataclasses.replace(
      rows[0].costs, error=rows[0].costs.error + hlo))
  note = row_note(row)
  assert 'remat_explorer_unregistered_kernel' in note and '%dot' not in note
  assert '\n' not in note and note.endswith(' …')


def test_views_show_xlas_first_line_and_fold_the_rest():
  """The Explorer's Costs tab, its snapshot and the HTML report say a failed
  compile as XLA's first line, and fold the rest of its message (a page of
  HLO, as XLA:GPU's Triton tiling quotes) beneath it, escaped, rather than
  printing it all as the error."""
  import dataclasses
  import re
  from remat_explorer.viz.html.html_report import report_html
  from remat_explorer.viz.html.snapshot import snapshot_html
  from remat_explorer.viz.widget._panels import costs_html
  comparison = compare(_loss_xla_cannot_compile, *_args(5), policies=['nothing_saveable'])
  row = comparison.row('nothing_saveable')
  assert row.failed and row.report is not None  # lowered and analyzed; XLA refused it
  costs = dataclasses.replace(row.costs, error=row.costs.error + (
      '\n\t%dot.1134 = f32[1500,256]{1,0} dot(%bitcast.1276, %parameter_1.7)'
      '\n\t<script>alert(1)</script>'))
  comparison = dataclasses.replace(comparison, rows=tuple(
      dataclasses.replace(r, costs=costs) for r in comparison.rows))
  views = {'costs tab': costs_html(row.label, row.report.lowering, costs, None, row.report),
           'snapshot': snapshot_html(costs=costs, report=row.report),
           'report': report_html(comparison, row.report)}
  for view, html in views.items():
    errors = re.findall(r'<p class="error"[^>]*>(.*?)</p>', html, re.S)
    assert errors and all('\n' not in e and '%dot' not in e for e in errors), view
    assert all('remat_explorer_unregistered_kernel' in e and e.endswith(' …')
               for e in errors), view
    folded = re.findall(r'<details class="remat-error-message">.*?</details>', html, re.S)
    assert len(folded) == len(errors) and all('%dot.1134' in d for d in folded), view
    assert '<script>alert' not in html and '&lt;script&gt;alert' in html, view
