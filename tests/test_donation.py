"""Donated arguments reach every compile of a comparison, a search and the
Explorer, as they reach a training step jitted with ``donate_argnums``:
each figure is that step's, compiled by hand; a bad ``donate_argnums`` is
refused before anything is traced."""

import re

import jax
import pytest

import remat_explorer as rx
from remat_explorer import analysis, examples
from tests.by_hand import allocated_bytes, compile_by_hand, xla_compiles
from tests.explorer_views import costs_row

SIZES = dict(num_layers=3, width=32, batch=8, seed=5)
POLICIES = ('nothing_saveable', 'dots_saveable')


def _by_hand(policy_name=None, remat=True):
  """The MLP written with `policy_name`'s policy in its blocks, its step
  jitted with its parameters donated and compiled by hand."""
  policy = None if policy_name is None else getattr(jax.checkpoint_policies, policy_name)
  loss, args = examples.mlp(policy=policy, remat=remat, **SIZES)
  step = jax.jit(jax.value_and_grad(loss), donate_argnums=0)
  return compile_by_hand(step, *args).memory_analysis()


def _figures(costs):
  return costs.peak_bytes, costs.temp_bytes, costs.alias_bytes


def _param_bytes(args):
  return sum(x.nbytes for x in jax.tree_util.tree_leaves(args[0]))


def test_every_row_of_a_comparison_is_the_step_with_its_donations():
  loss, args = examples.mlp(**SIZES)
  donated = analysis.compare(loss, *args, policies=list(POLICIES), donate_argnums=0,
                             suggest_lowering=False)
  kept = analysis.compare(loss, *args, policies=list(POLICIES), suggest_lowering=False)
  for name in POLICIES:
    hand = _by_hand(name)
    row = donated.row(name)
    assert _figures(row.costs) == (allocated_bytes(hand), hand.temp_size_in_bytes,
                                   hand.alias_size_in_bytes), name
    # The gradients are written over the parameters: the donation is seen.
    assert row.costs.alias_bytes == _param_bytes(args)
    assert kept.row(name).costs.alias_bytes == 0
    # The analysis is the same: donating changes what XLA allocates, not
    # what remat saves.
    assert row.report == kept.row(name).report
  no_remat = _by_hand(remat=False)
  assert donated.row('no remat').costs.peak_bytes == allocated_bytes(no_remat)


@pytest.mark.parametrize('rank_by_estimate', [False, True], ids=['compiled', 'by estimate'])
def test_a_search_measures_its_budget_and_its_answer_with_the_donations(rank_by_estimate):
  loss, args = examples.mlp(**SIZES)
  result = analysis.search_policy(loss, *args, memory_budget=0.5, donate_argnums=0,
                                  rank_by_estimate=rank_by_estimate)
  ends = [analysis.compile_costs(loss, *args, policy=getattr(rx.checkpoint_policies, p),
                                 donate_argnums=0).peak_bytes
          for p in ('nothing_saveable', 'everything_saveable')]
  assert result.budget_bytes == int(ends[0] + 0.5 * (ends[1] - ends[0]))
  answer = analysis.compile_costs(loss, *args, policy=result.policy, donate_argnums=0)
  assert (result.peak_bytes, result.costs.alias_bytes) == (answer.peak_bytes,
                                                           _param_bytes(args))
  assert result.fits and result.peak_bytes <= result.budget_bytes


def test_the_explorer_compiles_estimates_and_compares_with_the_donations():
  loss, args = examples.mlp(**SIZES)
  e = rx.explore(loss, *args, donate_argnums=0)
  e.wait(300)
  assert e.error.value == ''
  hand = _by_hand()  # the program as written, the view it opens on
  assert costs_row(e, 'peak bytes') == allocated_bytes(hand)
  assert costs_row(e, 'temp bytes') == hand.temp_size_in_bytes
  assert costs_row(e, 'no-remat peak bytes') == allocated_bytes(_by_hand(remat=False))
  e.policy.value = 'dots_saveable'
  e.wait(300)
  assert costs_row(e, 'peak bytes') == allocated_bytes(_by_hand('dots_saveable'))
  e.compare_button.click()
  e.wait(300)
  assert {r.costs.alias_bytes for r in e.comparison.rows if not r.failed} == {
      _param_bytes(args)}
  e.stop()


@pytest.mark.parametrize('bad, error', [
    (5, r'donate_argnums=\(5,\) is out of range for 2 positional'),
    ('params', r'donate_argnums must be an int or a sequence of ints'),
])
@pytest.mark.parametrize('entry', ['compare', 'search_policy', 'explore', 'Explorer'])
def test_a_bad_donate_argnums_is_refused_before_anything_is_traced(entry, bad, error):
  loss, args = examples.mlp(**SIZES)
  calls = []

  def counted(*a):
    calls.append(1)
    return loss(*a)
  extra = {'memory_budget': 0.5} if entry == 'search_policy' else {}
  with xla_compiles() as compiled, pytest.raises((TypeError, ValueError), match=error):
    getattr(rx, entry)(counted, *args, donate_argnums=bad, **extra)
  assert calls == [] and compiled == []


def test_explorer_built_directly_raises_for_a_bad_option():
  """As explore does, rather than opening on the error."""
  loss, args = examples.mlp(**SIZES)
  with pytest.raises(TypeError, match='has_aux must be True or False, got 1'):
    rx.Explorer(loss, *args, has_aux=1)
  with pytest.raises(ValueError, match=r'argnums=\(2,\) is out of range'):
    rx.Explorer(loss, *args, argnums=2)
  with pytest.raises(TypeError, match=re.escape('Explorer got the keyword polcy=')):
    rx.Explorer(loss, *args, polcy='dots_saveable')
