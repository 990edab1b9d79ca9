"""Lowering strategies of a differentiated block: same numbers, different HLO."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from tests.parity import assert_trees_equal

RNG = np.random.default_rng(99)
W = jnp.asarray(RNG.standard_normal((3, 8, 8)) * 0.4, jnp.float32)
X = jnp.asarray(RNG.standard_normal((4, 8)), jnp.float32)

EXPECTED_OP = {'barrier': 'stablehlo.optimization_barrier', 'cond': 'stablehlo.case',
               'while': 'stablehlo.while', 'none': None}
PROTECTIONS = [op for op in EXPECTED_OP.values() if op]


def model(checkpoint=rx.checkpoint, **checkpoint_kwargs):
  def loss(ws, x):
    layer = checkpoint(lambda h, w: jnp.tanh(jnp.sin(h @ w)) * h, **checkpoint_kwargs)
    for w in ws:
      x = layer(x, w)
    return jnp.sum(x ** 2)
  return loss


def protections_in(text):
  return {op for op in PROTECTIONS if op in text}


@pytest.mark.parametrize('lowering', list(EXPECTED_OP))
def test_each_strategy_lowers_to_its_op_and_gives_the_same_gradients(lowering):
  loss = model(lowering=lowering)
  grad = jax.jit(jax.grad(loss, (0, 1)))
  text = grad.lower(W, X).as_text()
  expected = EXPECTED_OP[lowering]
  assert protections_in(text) == ({expected} if expected else set())
  # The forward pass alone is never protected.
  assert protections_in(jax.jit(loss).lower(W, X).as_text()) == set()
  reference = jax.jit(jax.grad(model(), (0, 1)))(W, X)
  assert_trees_equal(grad(W, X), reference, exact=False)
  assert_trees_equal(jax.jit(loss)(W, X), jax.jit(model())(W, X))
  # And the same as jax.checkpoint.
  jax_loss = model(jax.checkpoint)
  assert_trees_equal(jax.grad(loss, (0, 1))(W, X), jax.grad(jax_loss, (0, 1))(W, X), exact=False)


def test_lowering_strategy_context_sets_the_default_for_a_block():
  with rx.lowering_strategy('while'):
    inside = jax.jit(jax.grad(model())).lower(W, X).as_text()
    explicit = jax.jit(jax.grad(model(lowering='cond'))).lower(W, X).as_text()
  after = jax.jit(jax.grad(model())).lower(W, X).as_text()
  assert protections_in(inside) == {'stablehlo.while'}
  assert protections_in(explicit) == {'stablehlo.case'}  # its own choice wins
  assert protections_in(after) == {'stablehlo.optimization_barrier'}


def test_a_function_jitted_outside_the_context_follows_it_inside():
  grad = jax.jit(jax.grad(model()))
  outside = grad.lower(W, X).as_text()
  with rx.lowering_strategy('cond'):
    inside = grad.lower(W, X).as_text()
    np.testing.assert_allclose(grad(W, X), jax.grad(model())(W, X), rtol=1e-5, atol=1e-7)
  assert protections_in(outside) == {'stablehlo.optimization_barrier'}
  assert protections_in(inside) == {'stablehlo.case'}
  assert protections_in(grad.lower(W, X).as_text()) == {'stablehlo.optimization_barrier'}


def test_cond_and_while_refuse_effects_and_say_which_lowering_works():
  def noisy(x):
    jax.debug.callback(lambda v: None, x)
    return jnp.sin(jnp.sin(x))
  for lowering in ('cond', 'while'):
    grad = jax.jit(jax.grad(rx.checkpoint(noisy, lowering=lowering)))
    with pytest.raises(NotImplementedError, match='use lowering="barrier"'):
      grad.lower(1.0)
  assert 'optimization_barrier' in jax.jit(jax.grad(rx.checkpoint(noisy))).lower(1.0).as_text()


def test_prevent_cse_false_means_no_protection_whatever_the_strategy():
  text = jax.jit(jax.grad(model(lowering='cond', prevent_cse=False))).lower(W, X).as_text()
  assert protections_in(text) == set()


def test_unknown_strategy_is_a_clear_error():
  with pytest.raises(ValueError, match=r"`lowering` argument of checkpoint must be one of .*'tpu'"):
    rx.checkpoint(jnp.sin, lowering='tpu')
  with pytest.raises(ValueError, match='must be one of'):
    with rx.lowering_strategy('fast'):
      pass
