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


def model(**checkpoint_kwargs):
  def loss(ws, x):
    layer = rx.checkpoint(lambda h, w: jnp.tanh(jnp.sin(h @ w)) * h, **checkpoint_kwargs)
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
  jax_loss = lambda ws, x: model()(ws, x)
  assert_trees_equal(jax.grad(loss, (0, 1))(W, X), jax.grad(jax_loss, (0, 1))(W, X), exact=False)


def test_lowering_strategy_context_sets_the_default_for_a_block():
  with rx.lowering_strategy('while'):
    inside = jax.jit(jax.grad(model())).lower(W, X).as_text()
    explicit = jax.jit(jax.grad(model(lowering='cond'))).lower(W, X).as_text()
  after = jax.jit(jax.grad(model())).lower(W, X).as_text()
  assert protections_in(inside) == {'stablehlo.while'}
  assert protections_in(explicit) == {'stablehlo.case'}  # its own choice wins
  assert protections_in(after) == {'stablehlo.optimization_barrier'}


def test_prevent_cse_false_means_no_protection_whatever_the_strategy():
  text = jax.jit(jax.grad(model(lowering='cond', prevent_cse=False))).lower(W, X).as_text()
  assert protections_in(text) == set()


def test_unknown_strategy_is_a_clear_error():
  with pytest.raises(ValueError, match=r"`lowering` argument of checkpoint must be one of .*'tpu'"):
    rx.checkpoint(jnp.sin, lowering='tpu')
  with pytest.raises(ValueError, match='must be one of'):
    with rx.lowering_strategy('fast'):
      pass
