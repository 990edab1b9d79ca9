"""checkpointed_scan: lax.scan's values and gradients under every schedule,
under JAX's transformations, and its arguments. (What each schedule costs
is in test_scan_costs.py.)"""

import functools
import subprocess
import sys
from pathlib import Path

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remat_explorer as rx
from tests.parity import assert_trees_equal
from tests.scan_programs import (ACTIVATIONS, assert_close, lax_scan, make_loss,
                                 make_problem, ours, outputs_and_grads, value_and_grads)

ROOT = Path(__file__).resolve().parents[1]


schedules = st.one_of(
    st.sampled_from([{'schedule': 'every'}, {'schedule': 'sqrt'}]),
    st.integers(1, 5).map(lambda k: {'segments': k}),
    st.integers(2, 4).map(lambda s: {'schedule': ('binomial', s)}))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 9), schedule=schedules, reverse=st.booleans(),
       pytree=st.booleans(), with_xs=st.booleans(),
       act=st.sampled_from(sorted(ACTIVATIONS)), seed=st.integers(0, 2**31 - 1))
def test_values_and_gradients_match_lax_scan(n, schedule, reverse, pytree, with_xs,
                                             act, seed):
  problem = make_problem(seed, n, act=act, pytree=pytree, with_xs=with_xs)
  assert_close(outputs_and_grads(ours(reverse, **schedule), problem, n, seed),
               outputs_and_grads(lax_scan(reverse), problem, n, seed))


@pytest.mark.parametrize('n, k', [(1, 1), (7, 3), (9, 20)])
def test_uneven_segments_and_more_segments_than_steps(n, k):
  problem = make_problem(3, n)
  assert_close(value_and_grads(ours(segments=k), problem, n, 3),
               value_and_grads(lax_scan(), problem, n, 3))


def test_weak_typed_initial_carry_takes_the_body_dtype_as_in_lax_scan():
  xs = jnp.asarray(np.random.default_rng(5).uniform(0.5, 1.5, 6), jnp.float32)
  step = lambda c, x: (jnp.sin(c) * x, c * 2)
  expected = jax.lax.scan(step, 1.0, xs)
  for schedule in ('every', 'sqrt', ('binomial', 2)):
    assert_trees_equal(rx.checkpointed_scan(step, 1.0, xs, schedule=schedule), expected,
                       exact=False)


def test_zero_length_scan_is_lax_scan():
  step, params, init, _ = make_problem(4, 0, with_xs=False)
  f = lambda c, x: step(params, c, x)
  assert_trees_equal(rx.checkpointed_scan(f, init, None, 0, schedule=('binomial', 3)),
                     jax.lax.scan(f, init, None, 0))


@pytest.mark.parametrize('schedule', ['every', 'sqrt', ('binomial', 3)], ids=str)
@pytest.mark.parametrize('jit', [False, True], ids=['eager', 'jit'])
def test_a_closed_over_ref_is_written_once_per_step_as_in_lax_scan(schedule, jit):
  """The recompute runs on the values the forward pass saw and writes
  nowhere: the ref ends as lax.scan leaves it, and the gradient (which
  reads the ref) is lax.scan's."""
  rng = np.random.default_rng(8)
  xs = jnp.asarray(rng.uniform(0.5, 1.5, 11), jnp.float32)
  start = jnp.asarray(rng.uniform(-1, 1, (3,)), jnp.float32)
  ref = jax.new_ref(jnp.zeros(3))

  def step(c, x):
    ref[...] += x * jnp.cos(ref[...])  # written every step, read below
    return jnp.sin(c) * x + 0.1 * ref[...], jnp.sum(c)

  def run(scan):
    loss = lambda c: jnp.sum(scan(step, c, xs)[0] ** 2)
    ref[...] = start
    grad = (jax.jit(jax.grad(loss)) if jit else jax.grad(loss))(start * 2)
    return grad, ref[...]

  expected = run(jax.lax.scan)
  got = run(lambda f, c, xs: rx.checkpointed_scan(f, c, xs, schedule=schedule))
  assert_close(got, expected)


# -- the same program as jax.checkpoint written by hand ---------------------------

def jax_nested_scan(f, init, xs, n, k):
  """The usual hand-written sqrt scheme: k checkpointed segments of
  ``lax.scan(jax.checkpoint(f))``, for k dividing n."""
  def segment(carry, seg_xs):
    return jax.lax.scan(jax.checkpoint(f), carry, seg_xs)
  blocks = jax.tree_util.tree_map(lambda a: a.reshape((k, n // k) + a.shape[1:]), xs)
  carry, ys = jax.lax.scan(jax.checkpoint(segment), init, blocks)
  return carry, jax.tree_util.tree_map(lambda a: a.reshape((n,) + a.shape[2:]), ys)


def test_every_is_exactly_scan_of_jax_checkpoint():
  problem = make_problem(11, 10)
  idiom = lambda f, init, xs, n: jax.lax.scan(jax.checkpoint(f), init, xs, length=n)
  assert_trees_equal(value_and_grads(ours(schedule='every'), problem, 10, 11),
                     value_and_grads(idiom, problem, 10, 11))


def test_sqrt_is_exactly_the_hand_written_nested_scan():
  n, k = 16, 4
  problem = make_problem(n, n)
  hand = lambda f, init, xs, n: jax_nested_scan(f, init, xs, n, k)
  assert_trees_equal(value_and_grads(ours(schedule='sqrt'), problem, n, 1),
                     value_and_grads(hand, problem, n, 1))


# -- transformations --------------------------------------------------------------

@functools.cache
def second_order(schedule_key):
  """A Hessian-vector product (forward over reverse) in the initial carry
  and xs, and a gradient of a gradient (reverse over reverse), for lax.scan
  (None) or a schedule."""
  n = 3
  scan = lax_scan() if schedule_key is None else ours(**dict(schedule_key))
  step, params, init, xs = make_problem(13, n)
  loss = make_loss(scan, step, n, 13)
  direction = jax.tree_util.tree_map(lambda a: jnp.cos(3 * a), (init, xs))

  @jax.jit
  def both(params, init, xs):
    g = lambda init, xs: jax.grad(loss, (1, 2))(params, init, xs)
    hvp = jax.jvp(g, (init, xs), direction)
    g_of_g = jax.grad(lambda p: jnp.sum(jnp.sin(jax.grad(loss, 2)(p, init, xs)['u'])))(params)
    return hvp, g_of_g
  return both(params, init, xs)


@pytest.mark.parametrize('schedule', [
    (('schedule', 'sqrt'),), (('schedule', ('binomial', 1)),)], ids=['sqrt', 'binomial1'])
def test_grad_of_grad_and_jvp_match_lax_scan(schedule):
  assert_close(second_order(schedule), second_order(None))


@pytest.mark.parametrize('schedule', [{'schedule': ('binomial', 2)}], ids=['binomial2'])
def test_vmap_of_grad_matches_lax_scan(schedule):
  n = 6
  step, params, init, xs = make_problem(17, n)
  batch = jax.tree_util.tree_map(
      lambda a: jnp.stack([a, jnp.sin(a), a * 0.5]), init)

  def batched(scan):
    loss = make_loss(scan, step, n, 17)
    return jax.jit(jax.vmap(jax.value_and_grad(loss, (0, 1)), (None, 0, None)))(
        params, batch, xs)
  assert_close(batched(ours(**schedule)), batched(lax_scan()))


def test_sharded_inputs_match_lax_scan_on_eight_devices():
  result = subprocess.run([sys.executable, str(ROOT / 'tests' / 'sharded_scan_program.py')],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={'PYTHONPATH': str(ROOT), 'PATH': '/usr/bin:/bin', 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == 'ok'


# -- arguments --------------------------------------------------------------------

@pytest.mark.parametrize('kwargs, message', [
    ({'schedule': 'fast'}, "one of 'every', 'sqrt'"),
    ({'schedule': ('binomial', 0)}, 'int >= 1'),
    ({'schedule': ('binomial', 2.5)}, 's=2.5'),
    ({'schedule': ('revolve', 3)}, '`schedule`'),
    ({'segments': 0}, '`segments`'),
    ({'segments': 2, 'schedule': 'sqrt'}, "schedule='sqrt' and segments=2"),
    ({'segments': 2, 'schedule': ('binomial', 2)}, 'segments=2'),
    ({'schedule': 'segments'}, 'segments=k'),
    ({'length': 5}, '`length`=5'),
    ({'xs': None}, 'needs `length`'),
    ({'xs': (jnp.ones(3), jnp.ones(4))}, 'leading axis size'),
])
def test_bad_arguments_are_named(kwargs, message):
  args = {'xs': jnp.ones(4), **kwargs}
  with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
    rx.checkpointed_scan(lambda c, x: (c, x), 0.0, **args)


def test_bad_step_and_policy_are_named():
  with pytest.raises(TypeError, match='callable step function `f`'):
    rx.checkpointed_scan('f', 0.0, jnp.ones(3))
  with pytest.raises(TypeError, match='`policy`'):
    rx.checkpointed_scan(lambda c, x: (c, x), 0.0, jnp.ones(3), policy='dots')
  with pytest.raises(ValueError, match='`n`'):
    rx.scan_schedule_costs(0)


def test_exported_at_top_level():
  from remat_explorer import engine
  assert rx.checkpointed_scan is engine.checkpointed_scan
  assert rx.scan_schedule_costs is engine.scan_schedule_costs
  assert 'checkpointed_scan' in rx.__all__ and 'scan_schedule_costs' in rx.__all__


def test_unroll_reaches_the_loops_over_steps():
  xs = jnp.asarray(np.random.default_rng(4).uniform(0.5, 1.5, 12), jnp.float32)
  step = lambda c, x: (jnp.sin(c) * x, c)
  f = lambda c: rx.checkpointed_scan(step, c, xs, schedule='sqrt', unroll=2)
  scans = []

  def collect(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'scan':
        scans.append(eqn)
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        collect(sub)
  collect(jax.make_jaxpr(f)(0.5).jaxpr)
  # 4 segments of 3 steps: the loop over segments keeps unroll=1, each
  # segment's loop over its steps gets 2.
  assert sorted((e.params['length'], e.params['unroll']) for e in scans) == [(3, 2), (4, 1)]
  assert_close(f(0.5), jax.lax.scan(step, 0.5, xs))


def test_binomial_data_the_step_closes_over_is_one_constant_of_the_program():
  """A step that reads row i of a data set it closes over (a concrete array,
  so a constant of the program): values and gradients are lax.scan's, and
  the compiled gradient holds the data once, as XLA would not if the step
  carried it into each of its loops (each loop body would hold a copy)."""
  rng = np.random.default_rng(2024)
  n, batch, width = 64, 4, 16
  data = jnp.asarray(rng.standard_normal((n, batch, width)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((width, width)) / width ** 0.5, jnp.float32)
  h0 = jnp.asarray(rng.standard_normal((batch, width)), jnp.float32)

  def loss(scan):
    def f(w, h0):
      def step(carry, _):
        i, h = carry
        return (i + 1, h + 0.1 * jnp.tanh((h + data[i]) @ w)), None
      (_, h), _ = scan(step, (0, h0))
      return jnp.sum(h ** 2)
    return f

  ours = loss(lambda f, c: rx.checkpointed_scan(f, c, length=n, schedule=('binomial', 3)))
  theirs = loss(lambda f, c: jax.lax.scan(f, c, length=n))
  grad = jax.jit(jax.value_and_grad(ours, argnums=(0, 1)))
  value, grads = grad(w, h0)
  expected_value, expected = jax.value_and_grad(theirs, argnums=(0, 1))(w, h0)
  np.testing.assert_allclose(value, expected_value, rtol=1e-5)
  for g, e in zip(grads, expected):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
  text = grad.lower(w, h0).compile().as_text()
  assert text.count(f'f32[{n},{batch},{width}]{{2,1,0}} constant(') == 1
