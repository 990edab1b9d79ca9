"""The Explorer's what-ifs of the user's own policies: a policy for one block,
a policy written as an expression, offload policies, picked names, each a
row of the comparison, and any of them copied as code.

Each view is checked against the program rebuilt by hand with
``jax.checkpoint`` and the policy the Explorer says it shows.
"""

import html

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat_explorer as rx
from remat_explorer.analysis import NO_REMAT, analyze, compile_costs, policy_source
from remat_explorer.viz.text import format_bytes
from remat_explorer.viz.widget._policy_controls import ALL_BLOCKS, NAMED

cp = jax.checkpoint_policies
# One worker: the tests' Explorers share the compiles they cache.
pytestmark = pytest.mark.xdist_group('explorer-policies')
_rng = np.random.default_rng(23)
W = jnp.asarray(_rng.standard_normal((24, 24)), jnp.float32)
X = jnp.asarray(_rng.standard_normal((16, 24)), jnp.float32)


def attention(x, w):
  scores = checkpoint_name(jnp.tanh(x @ w), 'scores')
  return jnp.sin(scores @ w.T)


def mlp(x, w):
  hidden = checkpoint_name(jnp.cos(x @ w), 'hidden')
  return jnp.tanh(hidden @ w)


def built(attention_policy=None, mlp_policy=None, remat=(True, True)):
  """The two-block program, each block checkpointed with its policy (or
  called plainly where `remat` says no)."""
  def wrap(fn, policy, on):
    return jax.checkpoint(fn, policy=policy) if on else fn

  def loss(w, x):
    h = wrap(attention, attention_policy, remat[0])(x, w)
    return jnp.sum(wrap(mlp, mlp_policy, remat[1])(h, w) ** 2)
  return loss


LOSS = built()


def _residuals(report):
  return sorted((r.type_string, r.name or "", r.memory_space) for r in report.residuals)


@pytest.fixture
def explorer():
  # A fresh Explorer for each test (its compiles are cached: LOSS, W and X
  # are the module's), so no test depends on what another chose.
  e = rx.explore(LOSS, W, X)
  e.wait(300)
  yield e
  e.stop()


def test_a_block_picked_gets_the_policy_alone(explorer):
  e = explorer
  assert e.block.options == (ALL_BLOCKS, 'attention', 'mlp')
  e.block.value = 'attention'
  e.policy.value = 'everything_saveable'
  # The views are the program with attention's checkpoint given the policy
  # and mlp's left as written.
  by_hand = analyze(built(attention_policy=cp.everything_saveable), W, X)
  assert _residuals(e.current_report()) == _residuals(by_hand)
  assert _residuals(by_hand) != _residuals(analyze(LOSS, W, X))
  caption = 'as written, with attention: everything_saveable'
  assert caption in e.split_note.value and caption in e.residual_view.value
  assert 'attention: everything_saveable' in e.controls.per_block.value
  # The other block shows what it runs under; back on the first, its own.
  e.block.value = 'mlp'
  assert e.policy.value == 'as written'
  e.policy.value = 'no remat'
  by_hand = analyze(built(attention_policy=cp.everything_saveable, remat=(True, False)), W, X)
  assert _residuals(e.current_report()) == _residuals(by_hand)
  e.block.value = 'attention'
  assert e.policy.value == 'everything_saveable'
  # Its compiled peak is the rebuilt program's.
  e.wait(300)
  by_hand_costs = compile_costs(
      built(attention_policy=cp.everything_saveable, remat=(True, False)), W, X)
  assert f'{by_hand_costs.peak_bytes:,}' in e.costs_view.value
  # The code copied builds the same program.
  namespace = {}
  exec(e.controls.copy.code, namespace)
  policies = namespace['policies']
  assert set(policies) == {'attention'}  # mlp: no remat, said in a comment
  assert '# mlp: no remat' in e.controls.copy.code
  rebuilt = analyze(built(attention_policy=policies['attention'], remat=(True, False)), W, X)
  assert _residuals(rebuilt) == _residuals(e.current_report())
  # "One policy for all blocks" drops the blocks' own choices.
  e.controls.reset.click()
  assert e.block.value == ALL_BLOCKS and not e.controls.own
  assert _residuals(e.current_report()) == _residuals(analyze(LOSS, W, X))
  e.wait(300)


def layer(x, w):
  return jnp.tanh(jnp.sin(x @ w) @ w)


def layers(policy=None):
  """Two layers of one function, each call checkpointed: two blocks that
  run `layer`."""
  def loss(w, x):
    for _ in range(2):
      x = jax.checkpoint(layer, policy=policy)(x, w)
    return jnp.sum(x ** 2)
  return loss


def test_a_function_run_by_several_blocks_takes_its_choice_in_all_and_says_so():
  """Picking the second of two layers of one function: the choice is the
  function's, as ``jax.checkpoint`` code can write it. Every block that
  runs it changes, the captions say how many, and the copied code, run,
  builds the program the view shows."""
  e = rx.explore(layers(), W, X)
  try:
    assert e.block.options == (ALL_BLOCKS, 'layer', 'layer#2')
    e.block.value = 'layer#2'
    e.policy.value = 'dots_saveable'
    shown = e.current_report()
    assert [b.policy for b in shown.blocks] == ['dots_saveable', 'dots_saveable']
    assert 'layer (all 2 blocks): dots_saveable' in e.controls.per_block.value
    assert 'with layer (all 2 blocks): dots_saveable' in e.split_note.value
    namespace = {}
    exec(e.controls.copy.code, namespace)
    rebuilt = analyze(layers(namespace['policies']['layer']), W, X)
    assert _residuals(rebuilt) == _residuals(shown)
    assert _residuals(shown) != _residuals(analyze(layers(), W, X))
  finally:
    e.stop()


def test_a_policy_written_as_an_expression(explorer):
  e = explorer
  text = "save_from_both_policies(dots_saveable, save_only_these_names('hidden'))"
  e.controls.expression.value = text
  policy = cp.save_from_both_policies(cp.dots_saveable, cp.save_only_these_names('hidden'))
  assert e.policy.value == text and e.controls.expression_note.value == ''
  assert _residuals(e.current_report()) == _residuals(analyze(built(policy, policy), W, X))
  namespace = {}
  exec(e.controls.copy.code, namespace)
  assert _residuals(analyze(built(namespace['policy'], namespace['policy']), W, X)) == \
      _residuals(e.current_report())
  # A wrong expression is one line that says what is accepted; nothing in
  # it runs, and the view stays.
  before = e.residual_view.value
  e.controls.expression.value = "__import__('os').system('false')"
  note = e.controls.expression_note.value
  assert 'is not a policy' in note or 'not in jax.checkpoint_policies' in note, note
  assert note.count('\n') == 0 and e.policy.value == text
  e.controls.expression.value = 'dots_savable'
  assert 'dots_savable' in e.controls.expression_note.value
  assert e.residual_view.value == before
  e.wait(300)


def test_offload_policies_are_options_that_move_residuals_to_the_host(explorer):
  e = explorer
  label = "offload_dot_with_no_batch_dims('device', 'pinned_host')"
  assert label in e.policy.options
  e.policy.value = label
  spaces = {r.memory_space for r in e.current_report().residuals}
  by_hand = analyze(built(cp.offload_dot_with_no_batch_dims('device', 'pinned_host'),
                          cp.offload_dot_with_no_batch_dims('device', 'pinned_host')), W, X)
  assert _residuals(e.current_report()) == _residuals(by_hand)
  assert spaces != {'device'}
  e.controls.select('as written')
  e.wait(300)


def test_every_choice_tried_is_a_row_of_the_comparison(explorer):
  e = explorer
  e.block.value = 'mlp'
  e.policy.value = 'dots_saveable'
  per_block = e.controls.label()
  e.controls.select('as written')
  e.policy.value = NAMED
  e.names_select.value = ('scores',)
  named = "save_only_these_names('scores')"
  text = "save_from_both_policies(dots_saveable, save_only_these_names('hidden'))"
  e.controls.expression.value = text
  e.controls.select('as written')
  e.policy.value = NAMED
  e.wait(300)
  assert html.escape(named) in e.split_note.value  # the caption names what was picked
  e.compare_button.click()
  e.wait(600)
  rows = {r.label: r for r in e.comparison.rows}
  for label in (per_block, named, text, 'dots_saveable', 'as written', 'no remat'):
    assert label in rows, (label, sorted(rows))
    assert not rows[label].failed
  # A row's figures are its choice's, compiled by hand.
  by_hand = compile_costs(built(mlp_policy=cp.dots_saveable), W, X)
  assert rows[per_block].costs.peak_bytes == by_hand.peak_bytes
  assert rows[named].costs.peak_bytes == compile_costs(
      built(cp.save_only_these_names('scores'), cp.save_only_these_names('scores')),
      W, X).peak_bytes
  # Shown from the comparison, a per-block row is the same choice again.
  e.pareto_pick.value = per_block
  assert e.controls.label() == per_block
  assert _residuals(e.current_report()) == _residuals(
      analyze(built(mlp_policy=cp.dots_saveable), W, X))
  assert policy_source(rows[per_block].policy) == policy_source(
      {'mlp': cp.dots_saveable})
  e.wait(300)


def test_the_names_picker_adds_the_names_picked_not_each_click(explorer):
  """Names are picked a click at a time: what is compared is the pick, not
  each set of names on the way to it; a choice of another kind stays."""
  e = explorer
  e.controls.select('as written')
  e.policy.value = 'dots_saveable'
  e.wait(300)
  text = "save_from_both_policies(dots_saveable, save_only_these_names('scores'))"
  e.controls.expression.value = text
  e.wait(300)
  e.policy.value = NAMED
  for picked in (('scores',), ('hidden', 'scores'), ('hidden',)):
    e.names_select.value = picked
    e.wait(300)
  tried = e.controls.tried  # the rows compared beside the built-ins
  named = [label for label in tried if label.startswith('save_only_these_names(')]
  assert named == ["save_only_these_names('hidden')"], sorted(tried)
  assert text in tried and text in e.controls.comparison_rows()
  e.controls.select('as written')
  e.wait(300)


def test_policy_source_writes_what_the_search_and_the_copy_write():
  assert policy_source(None).startswith('# The program as written')
  assert policy_source(NO_REMAT).startswith('# No remat')
  own = lambda prim, *_, **__: prim.name == 'sin'  # noqa: E731
  assert 'a policy of your own' in policy_source(own)
  code = policy_source({'attention': cp.dots_saveable, 'mlp': NO_REMAT})
  namespace = {}
  exec(code, namespace)
  assert namespace['policies'] == {'attention': cp.dots_saveable}


def test_the_budget_of_each_layout_spans_its_own_compiled_peaks():
  """Layouts are different programs: the bytes the budget stands for under
  one are not another's."""
  def shallow(w, x):
    return jnp.sum(jax.checkpoint(mlp)(x, w) ** 2)

  def deep(w, x):  # wider intermediates: other peaks
    h = jax.checkpoint(attention)(jnp.tile(x, (4, 1)), w)
    return jnp.sum(jax.checkpoint(mlp)(h, w) ** 2)
  e = rx.explore({'shallow': shallow, 'deep': deep}, W, X)
  e.wait(300)
  e.layout.value = 'deep'
  e.budget.value = 0.25
  e.wait(300)
  peaks = [compile_costs(deep, W, X, policy=p, lowering='barrier').peak_bytes
           for p in (cp.nothing_saveable, cp.everything_saveable, None, NO_REMAT)]
  expected = min(peaks) + 0.25 * (max(peaks) - min(peaks))
  assert f'≈ {format_bytes(expected)}' in e.budget_note.value, e.budget_note.value
  e.stop()
