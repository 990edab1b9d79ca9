"""Bad input gets a clear error naming what was wrong, where it was made."""

import functools
import re

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer.analysis.context import compiles_run
from tests.parity import printed_residuals

X = jnp.asarray(np.random.default_rng(7).standard_normal(3), jnp.float32)


def _grad(f, *args):
  return jax.grad(lambda x: jnp.sum(f(x, *args)))(X)


@pytest.mark.parametrize('bad', ['1', 1.5, (0, 'x'), None, True, (False,)])
def test_static_argnums_must_be_ints(bad):
  with pytest.raises(TypeError, match=r'`static_argnums`.* takes an int or a tuple or '
                                      r'list of ints .*bools are refused'):
    rx.checkpoint(lambda x, n: x, static_argnums=bad)


@pytest.mark.parametrize('good', [1, -1, (1,), [0, 1]])
def test_static_argnums_takes_an_int_a_tuple_or_a_list(good):
  f = rx.checkpoint(lambda x, n: x * n, static_argnums=good)
  np.testing.assert_allclose(f(2, 3), 6)


@pytest.mark.parametrize('bad', [2, -3, (0, 5)])
def test_static_argnums_out_of_range(bad):
  f = rx.checkpoint(lambda x, n: x * n, static_argnums=bad)
  with pytest.raises(ValueError, match=r'`static_argnums`.*passes 2 positional '
                                       r'argument.*between -2 and 1'):
    f(X, 2)


def test_static_argnums_without_positional_arguments():
  f = rx.checkpoint(lambda *, n: n, static_argnums=0)
  with pytest.raises(ValueError, match=r'`static_argnums`.*passes 0 positional '
                                       r'argument.*no position to mark static'):
    f(n=X)


def test_unhashable_static_value_names_the_argument():
  f = rx.checkpoint(lambda x, sizes: x * len(sizes), static_argnums=(1,))
  with pytest.raises(ValueError, match=r'positional argument 1 .*unhashable list.*tuple'):
    f(X, [1, 2])
  np.testing.assert_allclose(f(X, (1, 2)), X * 2)


def test_policy_that_raises_is_named_in_the_error():
  def broken_policy(prim, *avals, **params):
    raise KeyError('no such layer')
  f = rx.checkpoint(lambda x: jnp.sin(jnp.sin(x)), policy=broken_policy)
  with pytest.raises(TypeError, match=r"policy broken_policy \(.*test_errors.py:\d+\).*"
                                      r"`policy=`.*raised KeyError.*primitive 'sin'.*"
                                      r"no such layer") as info:
    _grad(lambda x: f(x))
  assert isinstance(info.value.__cause__, KeyError)
  assert '\n' not in str(info.value)


@pytest.mark.parametrize('answer', ['yes', 1, np.bool_(True), None])
def test_policy_must_return_a_bool_or_remat_case(answer):
  f = rx.checkpoint(lambda x: jnp.sin(jnp.sin(x)), policy=lambda *_, **__: answer)
  with pytest.raises(TypeError, match=r'remat policy .*`policy=` argument.*must return a bool'):
    _grad(lambda x: f(x))


def test_policy_returning_remat_cases_is_accepted():
  f = rx.checkpoint(lambda x: jnp.sin(jnp.sin(x)), policy=lambda *_, **__: rx.Saveable)
  g = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)), policy=lambda *_, **__: rx.Saveable)
  np.testing.assert_array_equal(_grad(lambda x: f(x)), _grad(lambda x: g(x)))


@pytest.mark.parametrize('bad', [None, 3, 'f'])
def test_fun_must_be_callable(bad):
  with pytest.raises(TypeError, match='checkpoint expects a callable `fun`'):
    rx.checkpoint(bad)


def test_policy_must_be_callable():
  with pytest.raises(TypeError, match='`policy` argument of checkpoint must be callable'):
    rx.checkpoint(jnp.sin, policy='dots_saveable')


def test_prevent_cse_type():
  with pytest.raises(TypeError, match=r'`prevent_cse`.* takes a bool, or a tuple or '
                                      r'list of bools.*got int: 1'):
    rx.checkpoint(jnp.sin, prevent_cse=1)
  with pytest.raises(TypeError, match='`prevent_cse`.*got str'):
    rx.checkpoint(jnp.sin, prevent_cse='yes')


def test_concrete_is_gone_with_an_explanation():
  with pytest.raises(NotImplementedError, match='`concrete`.*removed.*static_argnums'):
    rx.checkpoint(jnp.sin, concrete=True)
  with pytest.raises(NotImplementedError):
    rx.remat(jnp.sin, concrete=False)


def test_concretization_error_suggests_static_argnums():
  def block(x, n):
    return x if n > 0 else -x
  with pytest.raises(jax.errors.ConcretizationTypeError,
                     match='(?s)for checkpoint.*mark it static with `static_argnums`'):
    rx.checkpoint(block)(X, 1)


def test_checkpoint_name_requires_a_string():
  with pytest.raises(TypeError, match='checkpoint_name expects `name` to be a str'):
    rx.checkpoint_name(X, 3)


def test_offload_names_must_not_overlap():
  with pytest.raises(ValueError, match=r"both saved and offloaded.*\['a'\]"):
    rx.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=['a', 'b'], names_which_can_be_offloaded=['a'],
        offload_src='device', offload_dst='pinned_host')


def test_saved_residuals_requires_a_callable():
  with pytest.raises(TypeError, match='saved_residuals expects a callable'):
    rx.saved_residuals(X, X)


@pytest.mark.parametrize('entry', ['saved_residuals', 'print_saved_residuals'])
def test_a_keyword_the_function_does_not_take_is_refused_before_tracing(entry):
  """The residual listings pass their keywords on to the function, as
  JAX's do: ``policy=`` given to one (an option of the analysis) reached
  JAX as an argument it could not read as an array, deep in tracing. It is
  refused by name, and the function never runs; a keyword it takes is
  passed on."""
  calls = []

  def loss(w, scale=1.0):
    calls.append(1)
    return jnp.sum(jnp.sin(w @ w)) * scale
  with pytest.raises(TypeError, match=re.escape(
      f'{entry}: policy= is not an argument of ') + '.*loss.*' + re.escape(
      'To see the residuals under another policy')):
    getattr(rx, entry)(loss, W, policy=rx.checkpoint_policies.dots_saveable)
  assert calls == []
  with pytest.raises(TypeError, match=re.escape(f'{entry}: scael= is not an argument')):
    getattr(rx, entry)(loss, W, scael=2.0)
  assert calls == []
  # A keyword it takes is passed on, as JAX's own listing passes it.
  assert (printed_residuals(functools.partial(rx.print_saved_residuals, scale=2.0), loss, W)
          == printed_residuals(functools.partial(jax.ad_checkpoint.print_saved_residuals,
                                                 scale=2.0), loss, W))
  assert calls


# -- the analysis' entry points fail early --------------------------------------------

W = jnp.asarray(np.random.default_rng(11).standard_normal((4, 4)), jnp.float32)


def _counted_loss():
  calls = []

  def loss(w, scale=1.0):
    calls.append(1)
    return jnp.sum(jnp.sin(w @ w)) * scale
  return loss, calls


@pytest.mark.parametrize('entry, extra, meant', [
    ('analyze', {}, 'policy= (an option of analyze)'),
    ('compile_costs', {}, 'policy= (an option of compile_costs)'),
    ('compare', {}, 'policies= (an option of compare)'),
    ('estimate_costs', {}, 'policy= (an option of estimate_costs)'),
    ('search_policy', {'memory_budget': 0.5}, 'policy= (an option of analyze, '
                                               'compile_costs and estimate_costs, not '
                                               'of search_policy)'),
])
def test_a_misspelt_option_is_refused_before_tracing(entry, extra, meant):
  loss, calls = _counted_loss()
  with pytest.raises(TypeError, match=re.escape(f'got the keyword polciy=') + '.*'
                     + re.escape(f'Did you mean {meant}?')):
    getattr(rx, entry)(loss, W, polciy=None, **extra)
  assert calls == []


def test_an_option_of_another_entry_point_is_named_and_the_functions_own_pass():
  loss, calls = _counted_loss()
  with pytest.raises(TypeError, match=r'Did you mean memory_budget= \(an option of '
                                      r'search_policy, not of analyze\)'):
    rx.analyze(loss, W, budget=0.5)
  with pytest.raises(TypeError, match=r'Did you mean scale= \(an argument of loss\)'):
    rx.analyze(loss, W, scal=2.0)
  # Spelt right but given to the wrong entry point: said so, not "did you mean".
  with pytest.raises(TypeError, match=r'got the keyword policy=.* policy= is an option of '
                                      r'analyze, compile_costs and estimate_costs, not of '
                                      r'search_policy\.$'):
    rx.search_policy(loss, W, memory_budget=0.5, policy=None)
  # Even where it is close to one of this entry point's own options.
  with pytest.raises(TypeError, match=r'got the keyword donate_argnums=.* donate_argnums= '
                                      r'is an option of .*compile_costs.*, not of analyze\.$'):
    rx.analyze(loss, W, donate_argnums=0)
  assert calls == []
  scaled = rx.analyze(loss, W, scale=2.0)  # the function's own keyword reaches it
  assert calls and scaled.residuals


def test_an_option_that_is_also_an_argument_of_the_function_is_refused():
  def loss(w, policy=1.0):
    return jnp.sum(jnp.sin(w @ w)) * policy
  with pytest.raises(TypeError, match=r'policy= is an option of analyze and also an '
                                      r'argument of loss'):
    rx.analyze(loss, W, policy=jax.checkpoint_policies.dots_saveable)
  assert rx.analyze(loss, W).residuals  # not given: nothing to confuse


def test_a_policy_given_by_name_is_the_policy():
  def loss(w):
    return jnp.sum(jnp.tanh(jnp.sin(w @ w) @ w))
  by_name = rx.analyze(loss, W, policy='dots_saveable')
  built = rx.analyze(loss, W, policy=jax.checkpoint_policies.dots_saveable)
  nothing = rx.analyze(loss, W, policy='nothing_saveable')
  assert by_name.residual_bytes == built.residual_bytes != nothing.residual_bytes
  with pytest.raises(ValueError, match="policy= 'dots_savable' is not in"):
    rx.analyze(loss, W, policy='dots_savable')


def test_a_policy_that_raises_is_one_error_naming_it():
  f = rx.checkpoint(lambda w: jnp.sum(jnp.sin(w @ w)), policy=lambda prim: True)
  with pytest.raises(TypeError) as info:
    rx.analyze(f, W)
  message = str(info.value)
  assert '\n' not in message and '<lambda> (' in message and 'test_errors.py' in message
  assert "primitive 'dot_general'" in message and 'policy(prim, *avals, **params)' in message


@pytest.mark.parametrize('entry, extra', [
    ('analyze', {}), ('compile_costs', {}), ('compare', {}),
    ('search_policy', {'memory_budget': 0.5})])
def test_a_python_number_output_without_has_aux_is_one_error(entry, extra):
  def loss(w):
    return jnp.sum(jnp.sin(w @ w)), 3
  with pytest.raises(TypeError, match=r"'loss' returned the Python int 3 at output\[1\].*"
                                      r'pass has_aux=True'):
    getattr(rx, entry)(loss, W, **extra)


@pytest.mark.parametrize('entry, extra', [
    ('analyze', {}), ('compile_costs', {}), ('estimate_costs', {}), ('compare', {}),
    ('search_policy', {'memory_budget': 0.5})])
def test_loss_and_aux_without_has_aux_is_refused_before_any_compile(entry, extra):
  def loss(w):
    return jnp.sum(jnp.sin(w @ w)), jnp.cos(w)
  before = compiles_run()
  with pytest.raises(TypeError, match=r'loss returns a pair .*pass has_aux=True') as info:
    getattr(rx, entry)(loss, W, **extra)
  assert '\n' not in str(info.value)
  assert compiles_run() == before
  # With has_aux, the same function is one loss and its aux.
  assert rx.analyze(loss, W, has_aux=True).has_aux


@pytest.mark.parametrize('entry', ['analyze', 'compile_costs', 'compare', 'estimate_costs'])
def test_a_misspelt_keyword_names_the_entry_point_and_the_function(entry):
  def my_loss(w):
    return jnp.sum(jnp.sin(w))
  with pytest.raises(TypeError) as info:
    getattr(rx, entry)(my_loss, W, polciy=None)
  assert str(info.value).startswith(f'{entry} got the keyword polciy=, which is neither '
                                    f'one of its options nor an argument of my_loss.')


@pytest.mark.parametrize('bad', [42, 'loss', None])
def test_explore_needs_a_function(bad):
  with pytest.raises(TypeError, match=f'explore takes a function .*not {type(bad).__name__}'):
    rx.explore(bad, W)


def test_live_at_peak_is_at_top_level():
  from remat_explorer import analysis
  assert rx.live_at_peak is analysis.live_at_peak


def _never_called():
  raise AssertionError('--fn was loaded although --out is unusable')


def _returns_a_loss_only():
  return lambda w: jnp.sum(w)


def test_cli_checks_out_before_anything_else(tmp_path, capsys):
  from remat_explorer.__main__ import main
  fn = 'tests.test_errors:_never_called'
  assert main(['report', '--fn', fn, '--out', str(tmp_path / 'no' / 'r.html')]) == 2
  assert 'does not exist' in capsys.readouterr().err
  assert main(['report', '--fn', fn, '--out', str(tmp_path)]) == 2
  assert 'is a directory' in capsys.readouterr().err


def test_cli_names_what_fn_returned(tmp_path):
  from remat_explorer.__main__ import main
  with pytest.raises(SystemExit, match=r'must return \(loss_fn, args\).*returned a function'):
    main(['report', '--fn', 'tests.test_errors:_returns_a_loss_only',
          '--out', str(tmp_path / 'r.html')])
