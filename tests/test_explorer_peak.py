"""The Explorer on real models: it opens on the program as written (or on
its error), its Costs tab lists what is live at the peak, its budget says
how many bytes it stands for, and a search explains itself, joins the
comparison and never adds an option twice."""

import html
import re

import jax
import jax.numpy as jnp
import pytest

import remat_explorer as rx
from remat_explorer import examples
from remat_explorer.analysis import (NO_REMAT, analyze, compile_costs, live_at_peak,
                                     policy_source, search_policy)
from remat_explorer.engine.policies import checkpoint_policies as cp
from remat_explorer.viz.widget import _panels, _search
from remat_explorer.viz.text import format_bytes, html_text
from tests.by_hand import xla_compiles
from tests.explorer_views import costs_row
from tests.framework_models import nnx_transformer

# One worker runs the module: its tests share the compiles they cache
# (the same programs under the same policies), which split across two
# workers would each compile again.
pytestmark = pytest.mark.xdist_group('explorer-peak')


def scan_transformer():
  """Two layers in a scan: its policies differ on the CPU, and a search
  finds policies of its own between the built-ins."""
  return examples.transformer(num_layers=2, d_model=32, seq_len=16, batch=2, use_scan=True)


@pytest.fixture(scope='module')
def problem():
  return scan_transformer()


def test_the_explorer_opens_on_the_program_as_written(problem):
  f, args = problem
  e = rx.explore(f, *args)
  assert e.policy.options[0] == e.policy.value == 'as written'
  assert e.current_report().policy == analyze(f, *args).policy
  e.wait(300)
  assert 'compiled under as written' in e.costs_view.value
  # A program without a remat block is as written without remat.
  plain = rx.explore(lambda x: jnp.sum(jnp.sin(x) ** 2), jnp.ones(8))
  assert plain.policy.options[0] == plain.policy.value == 'as written (no remat)'
  plain.wait(300)
  assert plain.error.value == ''


def test_a_loss_with_aux_is_explored_with_has_aux_as_value_and_grad_takes_it():
  """A loss that returns (loss, aux), as one returning its metrics does:
  without has_aux the Explorer opens on the error that says to pass it,
  having compiled nothing; with has_aux=True every view is that of the
  loss alone differentiated, the step jax.value_and_grad(...,
  has_aux=True) compiles."""
  w, x = jax.random.normal(jax.random.key(7), (2, 16, 16))

  def loss(w, x):
    y = rx.checkpoint(lambda h: jnp.tanh(h @ w))(x)
    return jnp.sum(jnp.sin(y @ w)), {'activations': y}
  with xla_compiles() as compiled:  # on any thread: the Explorer's workers too
    forgot = rx.explore(loss, w, x)
    forgot.wait(300)
  assert 'pass has_aux=True' in html.unescape(forgot.error.value)
  assert compiled == [] and forgot.costs_view.value == ''
  e = rx.explore(loss, w, x, has_aux=True)
  e.wait(300)
  assert e.error.value == ''
  assert e.current_report() == analyze(loss, w, x, has_aux=True)
  by_hand = jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(w, x).compile()
  memory = by_hand.memory_analysis()
  assert costs_row(e, 'temp bytes') == memory.temp_size_in_bytes
  assert costs_row(e, 'output bytes') == memory.output_size_in_bytes
  with pytest.raises(TypeError, match='has_aux must be True or False, got 1'):
    rx.explore(loss, w, x, has_aux=1)


def test_a_program_that_fails_as_written_opens_with_its_error_and_recovers():
  def block(x):
    return jnp.sum(jnp.sin(jnp.sin(x)))
  broken = rx.checkpoint(block, policy=lambda *a, **k: 1 / 0)  # a policy that raises
  e = rx.explore(broken, jnp.ones(8))  # no traceback: a widget
  assert isinstance(e, rx.Explorer)
  assert 'ZeroDivisionError' in e.error.value and 'as written' in e.error.value
  assert e.residual_view.value == ''
  e.policy.value = 'nothing_saveable'  # replaces the program's policy
  e.wait(300)
  assert e.error.value == ''
  assert 'nothing_saveable' in e.residual_view.value and 'peak bytes' in e.costs_view.value

  # A program that cannot be traced at all opens too, and says why.
  e = rx.explore(lambda x: jnp.sum(x @ x), jnp.ones((2, 3)))
  e.wait(300)
  assert 'TypeError' in e.error.value and 'dot_general' in e.error.value


def test_the_costs_tab_lists_what_is_live_at_the_peak():
  f, args = nnx_transformer()
  e = rx.explore(f, *args)
  e.wait(300)
  top = next(r for r in live_at_peak(analyze(f, *args), compile_costs(f, *args))
             if r.kind == 'residual')
  costs = e.costs_view.value.replace('<wbr>', '')  # where a line may break
  assert 'class="remat-timeline"' in costs and 'backward starts' in costs
  peak = re.search(r'<div class="remat-at" data-at="peak">(.*?)</div>', costs, re.S).group(1)
  row = next(r for r in re.findall(r'<tr[^>]*>.*?</tr>', peak, re.S) if top.buffer in r)
  assert html_text(top.source) in row and top.source.startswith('tests/framework_models.py')


def test_the_budget_says_the_bytes_it_stands_for(problem):
  f, args = problem
  e = rx.explore(f, *args)
  assert 'compiling' in e.budget_note.value
  e.wait(300)
  # The slider spans every compiled peak known: the two built-in ends, the
  # program as written and without remat.
  peaks = [compile_costs(f, *args, policy=p, lowering='barrier').peak_bytes
           for p in (cp.nothing_saveable, cp.everything_saveable, None, NO_REMAT)]
  ends = (min(peaks), max(peaks))
  assert ends[0] < ends[1]
  for fraction in (0.5, 0.2):
    e.budget.value = fraction
    expected = ends[0] + fraction * (ends[1] - ends[0])
    assert f'≈ {format_bytes(expected)}' in e.budget_note.value
  # Another lowering: other compiles, other ends, learnt once the budget is
  # used there (not on every change of lowering).
  e.lowering.value = 'cond'
  e.wait(300)
  assert 'move the slider' in e.budget_note.value
  assert ('cond' not in {lowering for _, lowering in e._budget.ends})
  e.budget.value = 0.4
  assert 'compiling' in e.budget_note.value
  e.wait(300)
  peaks = [compile_costs(f, *args, policy=p, lowering='cond').peak_bytes
           for p in (cp.nothing_saveable, cp.everything_saveable, None, NO_REMAT)]
  expected = min(peaks) + 0.4 * (max(peaks) - min(peaks))
  assert f'≈ {format_bytes(expected)}' in e.budget_note.value


def test_a_search_explains_itself_joins_the_comparison_and_adds_its_option_once(problem):
  f, args = problem
  e = rx.explore(f, *args)
  e.wait(300)
  e.compare_button.click()
  e.wait(600)
  options = list(e.policy.options)
  e.budget.value = 0.3
  e.search_button.click()
  e.wait(600)
  result = e.search_result
  assert result.fits and result.label not in options  # premise: a policy of its own
  assert result.budget_bytes == _panels.budget_bytes(0.3, e._budget.ends[(None, 'barrier')])
  assert html_text(result.explanation) in e.search_note.value
  assert f'Search within {format_bytes(result.budget_bytes)}' in e.search_note.value
  assert list(e.policy.options) == [*options[:-1], result.label, options[-1]]
  assert e.policy.value == result.label
  row = e.comparison.row(result.label)  # the comparison ran again with it
  assert row.peak_bytes == result.peak_bytes
  assert html_text(result.label) in e.compare_view.value
  # The same search again: the same option, not a second one.
  e.search_button.click()
  e.wait(600)
  assert list(e.policy.options) == [*options[:-1], result.label, options[-1]]
  # A search that lands on an option already there selects it: with the
  # whole range, no remat fits with the fewest FLOPs.
  e.budget.value = 1.0
  e.search_button.click()
  e.wait(600)
  assert e.search_result.label == 'no remat'
  assert e.policy.value == 'no remat'
  assert len(e.policy.options) == len(options) + 1
  # Its code is the search's: the checkpoints kept with a policy it compiled.
  assert e.search_result.kept_checkpoint.fits
  assert e.controls.copy.code == e.search_result.to_source()
  comment = ' '.join(line[2:] for line in e.controls.copy.code.splitlines()
                     if line.startswith('# '))
  assert 'fits the budget' in comment
  assert e.controls.copy.code != policy_source(NO_REMAT)


def test_an_impossible_budget_says_so(problem, monkeypatch):
  f, args = problem
  nothing = compile_costs(f, *args, policy=cp.nothing_saveable, lowering='barrier')
  floor = nothing.argument_bytes + nothing.output_bytes
  budgets = iter([floor + 1, floor - 1])

  def with_bytes(*a, memory_budget, **k):  # what the slider cannot ask for
    return search_policy(*a, memory_budget=next(budgets), **k)
  monkeypatch.setattr(_search, 'search_policy', with_bytes)
  e = rx.explore(f, *args)
  e.wait(300)
  options, selected = list(e.policy.options), e.policy.value
  e.search_button.click()
  e.wait(600)
  assert not e.search_result.fits
  note = html.unescape(e.search_note.value)
  assert f'No policy fits the budget of {format_bytes(floor + 1)}' in note
  assert e.search_result.explanation in note and 'class="error"' in e.search_note.value
  assert (list(e.policy.options), e.policy.value) == (options, selected)
  e.search_button.click()  # fewer bytes than the arguments: search_policy refuses
  e.wait(600)
  note = html.unescape(e.search_note.value)
  assert 'ValueError' in note and 'no policy can fit it' in note
  assert (list(e.policy.options), e.policy.value) == (options, selected)
