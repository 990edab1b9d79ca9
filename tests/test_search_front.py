"""The searched policy is never beaten: no row of a comparison of the same
policies, the program as written and no remat among them, has both a lower
or equal peak and fewer or equal FLOPs while being better on one."""

import pytest

from remat_explorer import examples
from remat_explorer.analysis import clear_caches, compare, search_policy
from remat_explorer.analysis.tradeoffs.rows import AS_WRITTEN, NO_REMAT_LABEL
from tests import framework_models


def _dominates(row, result):
  # Both sides count what the compiled program executes, loops counted.
  return (row.peak_bytes <= result.peak_bytes and row.ranked_flops <= result.flops
          and (row.peak_bytes < result.peak_bytes or row.ranked_flops < result.flops))


def _check_never_dominated(loss_fn, args, budgets, **options):
  # Ranked by estimate first, each from nothing compiled: with a
  # comparison's rows compiled already it would take them in as candidates.
  by_estimate = {}
  for budget in budgets:
    clear_caches()
    by_estimate[budget] = search_policy(loss_fn, *args, memory_budget=budget,
                                        rank_by_estimate=True, **options)
  comparison = compare(loss_fn, *args, **options)
  labels = {r.label for r in comparison.rows}
  assert {AS_WRITTEN, NO_REMAT_LABEL} <= labels
  for budget in budgets:
    result = search_policy(loss_fn, *args, memory_budget=budget, **options)
    assert {AS_WRITTEN, NO_REMAT_LABEL} <= {c.label for c in result.candidates}
    beaten = [r.label for r in comparison.rows if not r.failed and _dominates(r, result)]
    assert not beaten, (budget, result.label, beaten)
    same = comparison.row(result.label)
    assert (same.peak_bytes, same.compiled_flops) == (result.peak_bytes, result.flops)
    fitting = [c for c in result.candidates if c.fits]
    assert all(result.flops <= c.flops for c in fitting)
    # Nor does any row beat the answer ranked by estimate, which compiled
    # only the budget's two ends and its finalist.
    quick = by_estimate[budget]
    beaten = [r.label for r in comparison.rows if not r.failed and _dominates(r, quick)]
    assert not beaten, (budget, quick.label, beaten)
    assert quick.fits and quick.compiles_used <= 3, (budget, quick.label, quick.compiles_used)
    # Where the program itself fits at the fewest FLOPs, that is the answer.
    own = [c for c in fitting if c.label in (AS_WRITTEN, NO_REMAT_LABEL)]
    if own and min(c.flops for c in own) == min(c.flops for c in fitting):
      best_own = min(own, key=lambda c: (c.flops, c.peak_bytes))
      if all((best_own.flops, best_own.peak_bytes) <= (c.flops, c.peak_bytes)
             for c in fitting):
        assert result.label == best_own.label and 'no policy to change' in result.explanation


def test_mlp_search_is_never_dominated():
  loss_fn, args = examples.mlp(num_layers=3, width=32, batch=8, seed=11)
  _check_never_dominated(loss_fn, args, [0.0, 0.5, 1.0], lowering='cond')


@pytest.mark.parametrize('build', ['linen_transformer', 'nnx_transformer',
                                   'equinox_transformer'])
def test_framework_search_is_never_dominated(build):
  loss_fn, args = getattr(framework_models, build)(batch=2, seq=8)
  # The MLP's test searches at the extremes too; a framework's program at
  # half of its peak without remat, where some candidates fit and some do
  # not.
  _check_never_dominated(loss_fn, args, [0.5], lowering='cond')
