"""Other primitives inside and around our checkpoint: custom_vjp (with and
without optimize_remat), custom_jvp, control flow, jit, and effects."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import remat_explorer as rx
from tests.parity import assert_trees_equal

RNG = np.random.default_rng(2024)
X = jnp.asarray(RNG.standard_normal(5), jnp.float32)
W = jnp.asarray(RNG.standard_normal((5, 5)) * 0.5, jnp.float32)
CHECKPOINTS = [pytest.param(rx.checkpoint, id='ours'), pytest.param(jax.checkpoint, id='jax')]


def _custom_vjp_with_opaque_fwd(calls, optimize_remat):
  """exp, whose fwd rule computes its residual through an opaque host call
  (which XLA can neither see through nor dead-code-eliminate)."""
  def host_exp(x):
    calls.append(1)
    return np.exp(x)

  f = jax.custom_vjp(jnp.exp)

  def fwd(x):
    y = jax.pure_callback(host_exp, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return y, y

  f.defvjp(fwd, lambda y, g: (g * y,), optimize_remat=optimize_remat)
  return f


@pytest.mark.parametrize('ck', CHECKPOINTS)
def test_optimize_remat_runs_the_custom_vjp_forward_rule_once(ck):
  runs = {}
  results = {}
  for optimize in (False, True):
    calls = []
    f = _custom_vjp_with_opaque_fwd(calls, optimize)
    g = ck(lambda x: jnp.sum(jnp.sin(f(jnp.tanh(x)))))
    results[optimize] = jax.jit(jax.value_and_grad(g))(X)
    runs[optimize] = len(calls)
  # Without optimize_remat the forward pass runs fwd for its primal output,
  # and the backward pass runs it again to recompute the residual.
  assert runs == {False: 2, True: 1}
  assert_trees_equal(results[True], results[False], exact=False)
  expected = jax.value_and_grad(lambda x: jnp.sum(jnp.sin(jnp.exp(jnp.tanh(x)))))(X)
  assert_trees_equal(results[True], expected, exact=False)


def test_custom_vjp_forward_rule_counts_match_jax():
  counts = []
  for ck in (rx.checkpoint, jax.checkpoint):
    for optimize in (False, True):
      calls = []
      f = _custom_vjp_with_opaque_fwd(calls, optimize)
      jax.jit(jax.value_and_grad(ck(lambda x: jnp.sum(f(x) * x))))(X)
      counts.append(len(calls))
  assert counts[:2] == counts[2:]


def test_custom_jvp_inside():
  @jax.custom_jvp
  def softplus(x):
    return jnp.log1p(jnp.exp(x))
  softplus.defjvp(lambda p, t: (softplus(p[0]), t[0] * jax.nn.sigmoid(p[0])))
  block = lambda w, x: jnp.sum(softplus(x @ w) ** 2)
  for mode in (jax.grad, lambda f: jax.jit(jax.grad(f))):
    assert_trees_equal(mode(rx.checkpoint(block))(W, X), mode(jax.checkpoint(block))(W, X))


def _control_flow_block(w, x):
  x = jax.lax.cond(jnp.sum(x) > 0, jnp.sin, jnp.cos, x @ w)
  x = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w)),
                         (0, x))[1]
  x, _ = jax.lax.scan(lambda h, _: (jnp.sin(h) @ w, None), x, None, length=2)
  return jnp.sum(jax.jit(lambda v: v * jnp.exp(v))(x))


@pytest.mark.parametrize('policy', [None, 'dots_saveable'])
def test_control_flow_and_jit_inside_and_around(policy):
  ours_policy = policy and getattr(rx.checkpoint_policies, policy)
  jax_policy = policy and getattr(jax.checkpoint_policies, policy)
  ours = rx.checkpoint(_control_flow_block, policy=ours_policy)
  theirs = jax.checkpoint(_control_flow_block, policy=jax_policy)
  # while_loop is forward-differentiable only: use jvp; the rest under grad.
  assert_trees_equal(jax.jvp(lambda x: ours(W, x), (X,), (X,)),
                     jax.jvp(lambda x: theirs(W, x), (X,), (X,)))
  no_while = lambda w, x: jnp.sum(jax.lax.cond(
      jnp.sum(x) > 0, jnp.sin, jnp.cos, jax.lax.scan(
          lambda h, _: (jnp.sin(h) @ w, None), x, None, length=2)[0]))
  around = lambda ck, p: jax.jit(jax.grad(lambda w: jax.lax.scan(
      lambda c, _: (c + ck(no_while, policy=p)(w, X), None), 0.0, None, length=3)[0]))
  assert_trees_equal(around(rx.checkpoint, ours_policy)(W), around(jax.checkpoint, jax_policy)(W))


@pytest.mark.parametrize('ordered', [False, True])
def test_debug_callback_inside_runs_as_often_as_under_jax(ordered):
  counts = {}
  for name, ck in (('ours', rx.checkpoint), ('jax', jax.checkpoint)):
    seen = []

    def block(x):
      y = jnp.sin(x)
      jax.debug.callback(lambda v: seen.append(np.asarray(v)), y, ordered=ordered)
      return jnp.sum(jnp.cos(y))
    grad = jax.grad(ck(block))(X)
    jax.block_until_ready(grad)
    jax.effects_barrier()
    counts[name] = len(seen)
    np.testing.assert_allclose(seen[0], np.sin(X), rtol=1e-6)
  assert counts['ours'] == counts['jax'] >= 1


# -- a block whose outputs are unused, with a debug callback inside -----------
#
# A deliberate difference (docs/pages/matches_jax_checkpoint.md): ours keeps such
# a block, so its callback runs as it would without remat, whether or not the
# callback reads the block's inputs. JAX 0.10.2's DCE rule drops the block
# when the callback reads none of them.

def _callback_calls(ck, situation, ordered, reads_input, output_used=False):
  """How often a debug callback inside `ck(block)` runs; by default the
  caller discards the block's output."""
  calls = []

  def block(x):
    if reads_input:
      jax.debug.callback(lambda v: calls.append(None), x, ordered=ordered)
    else:
      jax.debug.callback(lambda: calls.append(None), ordered=ordered)
    return jnp.sin(x)

  def caller(x):
    y = ck(block)(x)
    return jnp.sum(x * (y if output_used else x))

  run = {'eager': caller, 'jit': jax.jit(caller), 'grad': jax.grad(caller),
         'jit(grad)': jax.jit(jax.grad(caller))}[situation]
  jax.block_until_ready(run(X))
  jax.effects_barrier()
  return len(calls)


# (ours, JAX's) call counts when the callback reads none of the block's inputs.
_DISCARDED_BLOCK_CALLS = {'eager': (1, 1), 'jit': (1, 0), 'grad': (2, 1), 'jit(grad)': (2, 1)}


@pytest.mark.parametrize('ordered', [False, True], ids=['unordered', 'ordered'])
@pytest.mark.parametrize('situation', list(_DISCARDED_BLOCK_CALLS))
def test_a_discarded_block_still_runs_its_callback(situation, ordered):
  def count(ck, reads_input=False, **kw):
    return _callback_calls(ck, situation, ordered, reads_input, **kw)
  ours, theirs = count(rx.checkpoint), count(jax.checkpoint)
  assert (ours, theirs) == _DISCARDED_BLOCK_CALLS[situation]
  # Ours does not depend on what the callback reads; JAX agrees with ours
  # when the callback reads an input of the block.
  assert count(rx.checkpoint, reads_input=True) == ours
  assert count(jax.checkpoint, reads_input=True) == ours
  # Nor on whether the output is used: as often as JAX runs it then.
  assert count(rx.checkpoint, output_used=True) == ours
  assert count(jax.checkpoint, output_used=True) == ours
  if situation in ('eager', 'jit'):
    # Without differentiation, once: as often as without remat.
    assert ours == count(lambda f: f) == 1


@pytest.mark.parametrize('ordered', [True, False], ids=['ordered', 'unordered'])
def test_io_callback_is_refused_naming_the_effect_like_jax(ordered):
  # io_callback has no JVP, so it reads nothing differentiated here; its
  # effect alone is what remat cannot split, ordered or not.
  effect = 'OrderedIOEffect' if ordered else 'IOEffect'
  scale_value = np.float32(RNG.uniform(1, 3))

  def block(x):
    scale = io_callback(lambda: scale_value, jax.ShapeDtypeStruct((), jnp.float32),
                        ordered=ordered)
    return jnp.sum(jnp.sin(x)) * scale
  with pytest.raises(NotImplementedError, match='Effects not supported') as ours:
    jax.grad(rx.checkpoint(block))(X)
  with pytest.raises(NotImplementedError, match='Effects not supported') as theirs:
    jax.grad(jax.checkpoint(block))(X)
  assert effect in str(theirs.value)
  assert ('Effects not supported in partial-eval of `checkpoint`/`remat`: '
          f'{effect} (') in str(ours.value)
  # Without differentiation nothing needs splitting: it simply runs.
  np.testing.assert_allclose(rx.checkpoint(block)(X), jnp.sum(jnp.sin(X)) * scale_value,
                             rtol=1e-6)
