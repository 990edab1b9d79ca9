"""Behaviour of the engine beyond plain parity: what is recomputed, names and
policies across both libraries, nesting, logging, lowering and caching."""

import contextlib
import logging

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer.engine import checkpoint_p
from remat_explorer.engine._jax_internals import pe
from tests.parity import assert_trees_equal, printed_residuals

RNG = np.random.default_rng(1234)


def _normal(*shape):
  return jnp.asarray(RNG.standard_normal(shape), jnp.float32)


@contextlib.contextmanager
def counting(*prims):
  """Count evaluations of each primitive's impl."""
  counts = {p.name: 0 for p in prims}
  originals = {p: p.impl for p in prims}

  def counted(p):
    def impl(*args, **params):
      counts[p.name] += 1
      return originals[p](*args, **params)
    return impl
  try:
    for p in prims:
      p.def_impl(counted(p))
    yield counts
  finally:
    for p, impl in originals.items():
      p.def_impl(impl)


def _sin_sin(ck, **kw):
  @ck_(ck, **kw)
  def g(x):
    return jax.lax.sin(jax.lax.sin(x)), 3.0
  return lambda x: g(x)[0]


def ck_(ck, **kw):
  return lambda f: ck(f, **kw)


@pytest.mark.parametrize('ck', [rx.checkpoint, jax.checkpoint], ids=['ours', 'jax'])
def test_linearize_recomputes_under_default_policy(ck):
  f = _sin_sin(ck)
  x = float(RNG.uniform(0.5, 2.0))
  with counting(jax.lax.sin_p, jax.lax.cos_p) as forward:
    y, f_lin = jax.linearize(f, x)
  np.testing.assert_allclose(y, np.sin(np.sin(x)), rtol=1e-6)
  # The forward pass computes the primal only: two sines, no cosines.
  assert forward == {'sin': 2, 'cos': 0}
  with counting(jax.lax.sin_p, jax.lax.cos_p) as backward:
    t = f_lin(3.0)
  np.testing.assert_allclose(t, np.cos(np.sin(x)) * np.cos(x) * 3.0, rtol=1e-6)
  # The linear function recomputes sin(x), then the two cosines it needs.
  assert backward == {'sin': 1, 'cos': 2}


@pytest.mark.parametrize('ck', [rx.checkpoint, jax.checkpoint], ids=['ours', 'jax'])
def test_everything_saveable_recomputes_nothing(ck):
  f = _sin_sin(ck, policy=rx.checkpoint_policies.everything_saveable)
  _, f_lin = jax.linearize(f, 1.3)
  with counting(jax.lax.sin_p, jax.lax.cos_p) as backward:
    f_lin(3.0)
  assert backward == {'sin': 0, 'cos': 0}


def test_primitive_is_our_own_and_shows_in_jaxprs():
  f = rx.checkpoint(lambda x: jnp.sin(x) * x)
  jaxpr = jax.make_jaxpr(f)(1.0)
  assert [e.primitive for e in jaxpr.eqns] == [checkpoint_p]
  assert 'checkpoint[' in str(jaxpr) and 'remat2' not in str(jaxpr)
  grad_jaxpr = jax.make_jaxpr(jax.grad(f))(1.0)
  staged = [e for e in grad_jaxpr.eqns if e.primitive is checkpoint_p]
  assert len(staged) == 1 and staged[0].params['differentiated'] is True


# -- names and policies are one notion across both libraries -------------------

JAX_0_10_2 = tuple(jax.__version_info__[:3]) >= (0, 10, 2)

def _named_block(name_fn):
  def block(w, x):
    h = name_fn(jnp.sin(x @ w), 'hidden')
    return jnp.sum(jnp.tanh(h @ w) * h)
  return block


@pytest.mark.parametrize('name_fn', [rx.checkpoint_name, jax.ad_checkpoint.checkpoint_name],
                         ids=['our_name', 'jax_name'])
@pytest.mark.parametrize('ck', [rx.checkpoint, jax.checkpoint], ids=['our_ck', 'jax_ck'])
@pytest.mark.parametrize('policies', [rx.checkpoint_policies, jax.checkpoint_policies],
                         ids=['our_policy', 'jax_policy'])
def test_names_and_policies_interchange(name_fn, ck, policies):
  w, x = _normal(4, 4), _normal(3, 4)
  reference = jax.checkpoint(_named_block(jax.ad_checkpoint.checkpoint_name),
                             policy=jax.checkpoint_policies.save_only_these_names('hidden'))
  f = ck(_named_block(name_fn), policy=policies.save_only_these_names('hidden'))
  lines = printed_residuals(rx.print_saved_residuals, f, w, x)
  # JAX words the named residual by its name from 0.10.2; before, by the
  # rounding the split puts on it. Ours follows the JAX installed.
  wording = "named 'hidden'" if JAX_0_10_2 else 'output of reduce_precision'
  assert any(wording in line for line in lines), lines
  assert lines == printed_residuals(jax.ad_checkpoint.print_saved_residuals, reference, w, x)
  assert_trees_equal(jax.grad(f, (0, 1))(w, x), jax.grad(reference, (0, 1))(w, x))


def test_checkpoint_name_on_pytrees_and_tangent_unnamed():
  tree = {'a': _normal(3), 'b': (_normal(2), _normal(1))}
  named = jax.make_jaxpr(lambda t: rx.checkpoint_name(t, 'n'))(tree)
  assert [e.params['name'] for e in named.eqns] == ['n'] * 3
  jvp_jaxpr = jax.make_jaxpr(lambda x, t: jax.jvp(lambda y: rx.checkpoint_name(y, 'n'), (x,), (t,)))(
      1.0, 2.0)
  # One name equation, on the primal; the tangent passes through unnamed.
  assert sum(e.primitive.name == 'name' for e in jvp_jaxpr.eqns) == 1
  assert rx.checkpoint_name(tree, 'n') is not tree
  assert_trees_equal(rx.checkpoint_name(tree, 'n'), tree)


# -- nesting in other transformations and in remat blocks ---------------------

def test_nests_inside_while_loop_and_jax_remat():
  w = _normal(4, 4)

  def body(ck_outer, ck_inner):
    inner = ck_inner(lambda h: jnp.sin(h @ w), policy=rx.checkpoint_policies.dots_saveable)

    def f(x):
      def step(i, h):
        return ck_outer(lambda h: jnp.tanh(inner(h)) + h)(h)
      h = jax.lax.fori_loop(0, 3, step, x)
      return jnp.sum(h ** 2)
    return f

  x = _normal(2, 4)
  expected = jax.grad(body(jax.checkpoint, jax.checkpoint))(x)
  for outer, inner in [(rx.checkpoint, jax.checkpoint), (jax.checkpoint, rx.checkpoint),
                       (rx.checkpoint, rx.checkpoint)]:
    assert_trees_equal(jax.grad(body(outer, inner))(x), expected)
    assert_trees_equal(jax.jit(jax.grad(body(outer, inner)))(x),
                       jax.jit(jax.grad(body(jax.checkpoint, jax.checkpoint)))(x))


def test_vmap_of_grad_and_grad_of_vmap():
  w = _normal(4, 4)
  xs = _normal(5, 4)

  def both_orders(ck):
    f = ck(lambda w, x: jnp.sum(jnp.sin(x @ w) ** 2))
    per_example = jax.vmap(jax.grad(f), in_axes=(None, 0))(w, xs)
    batched = jax.grad(lambda w: jnp.sum(jax.vmap(f, in_axes=(None, 0))(w, xs)))(w)
    return per_example, batched

  ours = both_orders(rx.checkpoint)
  assert_trees_equal(ours, both_orders(jax.checkpoint))
  np.testing.assert_allclose(ours[0].sum(0), ours[1], rtol=1e-5, atol=1e-5)


def test_second_order_derivatives():
  block = lambda x: jnp.sin(jnp.cos(x)) * x
  f_ours, f_jax = rx.checkpoint(block), jax.checkpoint(block)
  x = float(RNG.standard_normal())
  assert_trees_equal(jax.grad(jax.grad(f_ours))(x), jax.grad(jax.grad(f_jax))(x))
  v = _normal(3)
  assert_trees_equal(jax.hessian(lambda v: jnp.sum(f_ours(v)))(v),
                     jax.hessian(lambda v: jnp.sum(f_jax(v)))(v))


def test_linear_transpose_of_checkpointed_linear_function():
  a = _normal(3, 3)
  f = rx.checkpoint(lambda x: a @ x * 2.0)
  ct = _normal(3)
  (t,), = [jax.linear_transpose(f, jnp.zeros(3))(ct)]
  np.testing.assert_allclose(t, 2.0 * a.T @ ct, rtol=1e-5)


def test_dce_drops_unused_outputs_and_their_work():
  f = rx.checkpoint(lambda x: (jnp.sin(x), jnp.exp(jnp.cos(x))))
  jaxpr = jax.make_jaxpr(jax.jit(lambda x: f(x)[0]))(1.0)
  inner = jaxpr.eqns[0].params['jaxpr'].jaxpr
  dced, _ = pe.dce_jaxpr(inner, [True])
  block = [e for e in dced.eqns if e.primitive is checkpoint_p][0]
  names = [e.primitive.name for e in block.params['jaxpr'].eqns]
  assert names == ['sin'] and len(block.outvars) == 1


# -- the lowering --------------------------------------------------------------

def test_differentiated_block_lowers_behind_optimization_barrier():
  f = rx.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
  grad_hlo = jax.jit(jax.grad(f)).lower(1.0).as_text()
  assert 'stablehlo.optimization_barrier' in grad_hlo
  # The primal alone, and prevent_cse=False, need no barrier.
  assert 'optimization_barrier' not in jax.jit(f).lower(1.0).as_text()
  g = rx.checkpoint(lambda x: jnp.sin(jnp.sin(x)), prevent_cse=False)
  assert 'optimization_barrier' not in jax.jit(jax.grad(g)).lower(1.0).as_text()


def test_prevent_cse_per_argument_protects_only_chosen_inputs():
  def block(x, y):
    return jnp.sin(x) * jnp.cos(y)
  args = (_normal(3), _normal(3))
  loss = lambda ck: (lambda x, y: jnp.sum(ck(block, prevent_cse=(True, False))(x, y)))
  ours = jax.jit(jax.grad(loss(rx.checkpoint), (0, 1))).lower(*args).as_text()
  theirs = jax.jit(jax.grad(loss(jax.checkpoint), (0, 1))).lower(*args).as_text()
  barrier = lambda text: [l.split('=')[1].split(':')[0].strip() for l in text.splitlines()
                          if 'optimization_barrier' in l]
  assert barrier(ours) == barrier(theirs) and len(barrier(ours)) == 1
  assert_trees_equal(jax.grad(loss(rx.checkpoint), (0, 1))(*args),
                     jax.grad(loss(jax.checkpoint), (0, 1))(*args))


# -- static_argnums ------------------------------------------------------------

def test_static_argnums_caches_traces_per_static_value():
  traces = []

  def block(x, n):
    traces.append(n)
    for _ in range(n):
      x = jnp.sin(x)
    return x
  f = rx.checkpoint(block, static_argnums=(1,))
  x = _normal(3)
  for n in (2, 2, 3, 2, 3):
    np.testing.assert_allclose(f(x, n), jax.checkpoint(block, static_argnums=1)(x, n))
  assert traces.count(2) == 2 and traces.count(3) == 2  # ours once each, JAX's once each
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(x, 2)))(x),
                             jnp.cos(jnp.sin(x)) * jnp.cos(x), rtol=1e-6)


def test_static_argnums_negative_index_and_static_argnames():
  f = rx.checkpoint(lambda x, flip: -x if flip else x, static_argnums=-1)
  assert float(f(2.0, True)) == -2.0 and float(f(2.0, False)) == 2.0
  g = rx.checkpoint(lambda x, *, flip: -x if flip else x, static_argnames='flip')
  assert float(g(2.0, flip=True)) == -2.0


# -- logging -------------------------------------------------------------------

def test_residual_logging_follows_jax_config_like_jax(caplog):
  block = lambda w, x: jnp.sin(x @ w) @ w
  w, x = _normal(3, 3), _normal(2, 3)

  def differentiate(ck):
    f = ck(block, policy=rx.checkpoint_policies.dots_saveable)
    jax.grad(lambda w: jnp.sum(f(w, x)))(w)

  with caplog.at_level(logging.WARNING):
    differentiate(rx.checkpoint)
  assert not caplog.records  # off unless jax_log_checkpoint_residuals is set
  jax.config.update('jax_log_checkpoint_residuals', True)
  try:
    with caplog.at_level(logging.WARNING):
      differentiate(rx.checkpoint)
      differentiate(jax.checkpoint)
  finally:
    jax.config.update('jax_log_checkpoint_residuals', False)
  ours = [r.getMessage() for r in caplog.records if r.name == 'remat_explorer.engine']
  theirs = [r.getMessage() for r in caplog.records if r.name.startswith('jax')]
  assert len(ours) == 1 and ours == theirs
  assert 'saving these intermediates:\n  float32[2,3] from output of dot_general' in ours[0]


# -- state discharge -----------------------------------------------------------

def _ref_programs(ck):
  def internal(x):
    r = jax.new_ref(jnp.zeros_like(x))
    r[...] += jnp.sin(x)
    return r[...] * x

  @jax.jit
  def closed_over(x):
    r = jax.new_ref(x)

    def inner(y):
      r[...] = jnp.sin(r[...]) + y
      return y * 2
    return ck(inner)(x), r[...]
  return ck(internal), jax.jit(ck(internal)), closed_over


def test_refs_inside_blocks_discharge_like_jax():
  x = _normal(4)
  ours, theirs = _ref_programs(rx.checkpoint), _ref_programs(jax.checkpoint)
  for f_ours, f_theirs in zip(ours, theirs):
    assert_trees_equal(f_ours(x), f_theirs(x))
  out, final = ours[2](x)
  np.testing.assert_allclose(final, np.sin(x) + x, rtol=1e-6)
  # Under jit the ref's writes become values flowing out of our primitive.
  jaxpr = jax.make_jaxpr(ours[2])(x)
  assert 'checkpoint[' in str(jaxpr)
