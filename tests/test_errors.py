"""Bad input gets a clear error naming what was wrong, where it was made."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx

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
