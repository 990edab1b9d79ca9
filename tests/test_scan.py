"""checkpointed_scan: lax.scan's values and gradients under every schedule,
the step evaluations and carries each schedule predicts, and bad arguments."""

import functools
import math
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
from remat_explorer.engine import scan_plans
from tests.parity import assert_trees_equal

ROOT = Path(__file__).resolve().parents[1]
ACTIVATIONS = {'tanh': jnp.tanh, 'sin': jnp.sin, 'softsign': lambda h: h / (1 + jnp.abs(h))}


# -- random step functions -------------------------------------------------------

def make_problem(seed, n, *, act='tanh', pytree=True, with_xs=True):
  """A random step function, its parameters, an initial carry and xs."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  params = {'w': 0.6 * normal(3, 3), 'b': 0.3 * normal(3)}
  activation = ACTIVATIONS[act]

  def step(params, carry, x):
    h, z = (carry['h'], carry['z']) if pytree else (carry, jnp.ones(2))
    u, v = (x['u'], x['v']) if with_xs else (0.1, 0.2)
    h_new = activation(h @ params['w'] + u + params['b']) * (1 + 0.1 * jnp.sum(z))
    z_new = z * jnp.cos(jnp.sum(h)) + 0.1 * v
    new = {'h': h_new, 'z': z_new} if pytree else h_new
    return new, (jnp.sum(h_new) * v, z_new)

  init = {'h': normal(3), 'z': normal(2)} if pytree else normal(3)
  xs = {'u': normal(n, 3), 'v': normal(n)} if with_xs else None
  return step, params, init, xs


def make_loss(scan, step, n, seed):
  """A scalar of every output, weighted at random, so each one gets a
  cotangent of its own."""
  rng = np.random.default_rng(seed + 1)

  def loss(params, init, xs):
    carry, ys = scan(lambda c, x: step(params, c, x), init, xs, n)
    leaves = jax.tree_util.tree_leaves((carry, ys))
    weights = [jnp.asarray(rng.standard_normal(np.shape(a)), jnp.float32) for a in leaves]
    return sum(jnp.sum(w * jnp.sin(a)) for w, a in zip(weights, leaves))
  return loss


def lax_scan(reverse=False):
  return lambda f, init, xs, n: jax.lax.scan(f, init, xs, length=n, reverse=reverse)


def ours(reverse=False, **schedule):
  return lambda f, init, xs, n: rx.checkpointed_scan(f, init, xs, n, reverse=reverse,
                                                     **schedule)


def value_and_grads(scan, problem, n, seed, argnums=(0, 1, 2)):
  step, params, init, xs = problem
  loss = make_loss(scan, step, n, seed)
  argnums = tuple(a for a in argnums if a != 2 or xs is not None)
  return jax.jit(jax.value_and_grad(loss, argnums))(params, init, xs)


def outputs_and_grads(scan, problem, n, seed):
  """The scan's outputs, and the loss and its gradients, in one compile."""
  step, params, init, xs = problem
  loss = make_loss(scan, step, n, seed)
  argnums = (0, 1, 2) if xs is not None else (0, 1)

  def both(params, init, xs):
    return (scan(lambda c, x: step(params, c, x), init, xs, n),
            jax.value_and_grad(loss, argnums)(params, init, xs))
  return jax.jit(both)(params, init, xs)


def assert_close(actual, expected):
  assert_trees_equal(actual, expected, exact=False)


# s = 1 nests a checkpoint per step (slow to compile); it has tests of its own.
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


# -- counting step evaluations ----------------------------------------------------
#
# The step is made to call a debug callback on its input carry, and we count
# the calls. Effects are never removed as dead code, and the callback reads
# the carry, so it cannot be hoisted out of a loop: each call is one run of
# the step's program (XLA may still drop the parts of a recomputed step whose
# results are unused). Counting the callbacks in the gradient's jaxpr, times
# the trip counts of the loops around them, gives the same number without
# compiling; the compiled count is checked against it on small programs.

@functools.cache
def revolve_optimum(n, s):
  """Fewest evaluations of the step for the VJP of n steps with s carries,
  by dynamic programming over every first split (independent of the closed
  form): a head of m steps is run once and recomputed later with s carries;
  the rest is reversed first, with s - 1."""
  best = {}
  for carries in range(0, s + 1):
    for length in range(1, n + 1):
      if length == 1:
        best[length, carries] = 1
      elif carries == 0:
        best[length, carries] = math.inf
      else:
        best[length, carries] = min(m + best[length - m, carries - 1] + best[m, carries]
                                    for m in range(1, length))
  return best[n, s]


def counted_loss(scan, n, seed=0):
  step, params, init, xs = make_problem(seed, n)
  calls = []

  def counted(params, carry, x):
    jax.debug.callback(lambda h: calls.append(1), carry['h'])
    return step(params, carry, x)
  return make_loss(scan, counted, n, seed), (params, init, xs), calls


def callbacks_in(jaxpr):
  """Callbacks a jaxpr runs: each loop body's count times its trip count."""
  total = 0
  for eqn in jaxpr.eqns:
    total += eqn.primitive.name == 'debug_callback'
    trips = eqn.params['length'] if eqn.primitive.name == 'scan' else 1
    total += trips * sum(callbacks_in(sub)
                         for sub in jax.extend.core.jaxprs_in_params(eqn.params))
  return total


def evaluations_in_gradient(scan, n):
  loss, args, _ = counted_loss(scan, n)
  return callbacks_in(jax.make_jaxpr(jax.grad(loss))(*args).jaxpr)


def evaluations_in_forward_pass(scan, n):
  """Those of the VJP's forward pass alone (the backward pass has the rest)."""
  loss, args, _ = counted_loss(scan, n)
  return callbacks_in(jax.make_jaxpr(lambda *a: jax.vjp(loss, *a)[0])(*args).jaxpr)


def evaluations_run(scan, n):
  loss, args, calls = counted_loss(scan, n)
  jax.block_until_ready(jax.jit(jax.grad(loss))(*args))
  jax.effects_barrier()
  return len(calls)


def plan_evaluations(plan):
  """What a plan runs, by the nesting rule: a checkpointed block runs its
  steps once forward, then again (with its own nesting) for the backward
  pass; a checkpointed step runs twice, a taped one once."""
  if isinstance(plan, scan_plans.Step):
    return 2 if plan.checkpointed else 1
  if isinstance(plan, scan_plans.Loop):
    return plan.times * plan_evaluations(plan.body)
  if isinstance(plan, scan_plans.Chain):
    return sum(plan_evaluations(p) for p in plan.parts)
  return plan.length + plan_evaluations(plan.body)


def test_closed_form_and_plans_equal_the_dynamic_programming_optimum():
  for s in range(1, 6):
    for n in range(1, 41):
      costs = rx.scan_schedule_costs(n, ('binomial', s))
      assert costs.step_evaluations == revolve_optimum(n, s), (n, s)
      assert costs.recomputed_steps == costs.step_evaluations - n
      if costs.levels <= scan_plans.MAX_LEVELS:
        plan = scan_plans.plan_for(n, ('binomial', s))
        assert plan_evaluations(plan) == costs.step_evaluations, (n, s)


def test_binomial_n64_s4_evaluates_steps_the_optimal_number_of_times():
  optimum = revolve_optimum(64, 4)
  t = 4  # the least t with C(4 + t, 4) >= 64: C(8, 4) = 70
  griewank = t * 64 - math.comb(4 + t, t - 1)  # 200 recomputations
  assert optimum == 64 + griewank
  binomial = ours(schedule=('binomial', 4))
  assert evaluations_in_gradient(binomial, 64) == optimum
  # The forward pass runs each step once; the backward pass, Griewank's p.
  assert evaluations_in_forward_pass(binomial, 64) == 64
  assert rx.scan_schedule_costs(64, ('binomial', 4)).recomputed_steps == griewank


@pytest.mark.parametrize('schedule, expected', [
    ({'schedule': 'every'}, lambda n: 2 * n),
    ({'schedule': 'sqrt'}, lambda n: 3 * n),
    ({'segments': 3}, lambda n: 3 * n),
    ({'schedule': ('binomial', 2)}, lambda n: revolve_optimum(n, 2)),
    ({'schedule': ('binomial', 9)}, lambda n: 2 * n - 1),
], ids=['every', 'sqrt', 'segments', 'binomial2', 'binomial9'])
def test_each_schedule_runs_the_step_as_often_as_predicted(schedule, expected):
  n = 8
  predicted = rx.scan_schedule_costs(n, **schedule).step_evaluations
  assert predicted == expected(n)
  assert evaluations_run(ours(**schedule), n) == predicted
  assert evaluations_in_gradient(ours(**schedule), n) == predicted


def test_lax_scan_runs_each_step_once():
  assert evaluations_run(lax_scan(), 8) == evaluations_in_gradient(lax_scan(), 8) == 8


def test_policy_applies_to_each_step():
  n = 6
  xs = jnp.asarray(np.random.default_rng(9).uniform(0.5, 1.5, n), jnp.float32)
  step = lambda c, x: (jnp.tanh(jnp.sin(c) * x), jnp.sum(c))
  c0 = jnp.ones(4)

  def residual_rows(**schedule):
    f = lambda c: rx.checkpointed_scan(step, c, xs, **schedule)[0]
    return sorted(aval.shape for aval, _ in rx.saved_residuals(f, c0))
  # Each step keeps its input carry; saving everything keeps its
  # intermediates (sin, tanh, their derivatives) too.
  assert residual_rows() == [(n,), (n, 4)]
  assert residual_rows(policy=rx.checkpoint_policies.everything_saveable).count((n, 4)) > 1
  problem = make_problem(8, n)
  saveall = rx.checkpoint_policies.everything_saveable
  assert_close(value_and_grads(ours(schedule='sqrt', policy=saveall), problem, n, 8),
               value_and_grads(lax_scan(), problem, n, 8))


def revolve_by_hand(f, init, xs, n, s):
  """Griewank's schedule as nested jax.checkpoint calls, one Python call per
  step (no loops), with each split taken from `revolve_optimum`'s recursion."""
  def run(carry, lo, hi, carries):
    length = hi - lo
    if length == 1:
      return f(carry, jax.tree_util.tree_map(lambda a: a[lo], xs))[0]
    m = next(m for m in range(1, length)
             if m + revolve_optimum(length - m, carries - 1) + revolve_optimum(m, carries)
             == revolve_optimum(length, carries))
    carry = jax.checkpoint(lambda c: run(c, lo, lo + m, carries))(carry)
    return run(carry, lo + m, hi, carries - 1)
  return run(init, 0, n, s), None


def test_binomial_matches_revolve_written_by_hand_with_jax_checkpoint():
  n, s = 7, 2
  problem = make_problem(21, n)
  carry_only = lambda scan: (lambda f, init, xs, n: (scan(f, init, xs, n)[0], None))
  hand = lambda f, init, xs, n: revolve_by_hand(f, init, xs, n, s)
  assert_close(value_and_grads(carry_only(ours(schedule=('binomial', s))), problem, n, 2),
               value_and_grads(hand, problem, n, 2))
  assert (evaluations_in_gradient(carry_only(ours(schedule=('binomial', s))), n)
          == evaluations_in_gradient(hand, n) == revolve_optimum(n, s))


# -- stored carries ---------------------------------------------------------------

def carry_rows(jaxpr, carry_shape):
  """How many carries the stacked residuals of a program hold, at most.

  Loops keep their per-step carries as one (m, *carry) array. At each level
  of the program, count the rows of those stacks, plus the most that any
  nested program (a loop body, a checkpoint's recompute) holds while it
  runs. Stacks at one level are counted as if all alive together.
  """
  here = sum(v.aval.shape[0] for e in jaxpr.eqns for v in e.outvars
             if getattr(v.aval, 'shape', ())[1:] == carry_shape and v.aval.ndim > len(carry_shape))
  nested = [carry_rows(sub, carry_shape)
            for e in jaxpr.eqns for sub in jax.extend.core.jaxprs_in_params(e.params)]
  return here + max(nested, default=0)


def test_sqrt_stores_at_most_two_sqrt_n_carries_for_1024_steps():
  n = 1024
  xs = jnp.asarray(np.random.default_rng(6).uniform(0.5, 1.0, n), jnp.float32)
  step = lambda c, x: (jnp.tanh(c * x + jnp.mean(c)), jnp.sum(c))
  grad = lambda schedule: jax.make_jaxpr(jax.grad(
      lambda c: jnp.sum(rx.checkpointed_scan(step, c, xs, schedule=schedule)[0])))(
          jnp.ones((4, 4))).jaxpr
  bound = 2 * math.ceil(math.sqrt(n)) + 1
  assert carry_rows(grad('sqrt'), (4, 4)) <= bound
  assert carry_rows(grad('sqrt'), (4, 4)) == rx.scan_schedule_costs(n, 'sqrt').stored_carries
  assert carry_rows(grad('every'), (4, 4)) == n  # the measure sees every carry


def test_compiled_temp_memory_follows_the_schedules():
  """XLA's temp bytes for n=80 steps of a 16 KiB carry, in carries.

  'every' keeps n; 'sqrt' its k + n // k; the binomial schedule its s
  snapshots, plus one incoming and one outgoing cotangent carry per level
  of nesting (its blocks recompute in conditionals), plus a few for the
  step's tape and the gradient. Each step's input is as large as the carry:
  blocks that kept their own slices of xs would keep several times n.
  """
  n, shape, s = 80, (64, 64), 8
  rng = np.random.default_rng(7)
  c0 = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  xs = jnp.asarray(rng.uniform(0.5, 1.0, (n,) + shape), jnp.float32)

  def step(c, x):  # the column mean mixes elements, so XLA cannot fuse steps away
    return jnp.tanh(c * x + jnp.mean(c, axis=0)), jnp.sum(c[0] * x[0])

  def carries(schedule):
    loss = lambda c: jnp.sum(rx.checkpointed_scan(step, c, xs, schedule=schedule)[0] ** 2)
    compiled = jax.jit(jax.grad(loss)).lower(c0).compile()
    return compiled.memory_analysis().temp_size_in_bytes / (c0.size * 4)

  every, sqrt, binomial = carries('every'), carries('sqrt'), carries(('binomial', s))
  assert n <= every <= n + 3
  sqrt_bound = rx.scan_schedule_costs(n, 'sqrt').stored_carries + 3  # 9 + 8 + 3
  levels = rx.scan_schedule_costs(n, ('binomial', s)).levels  # 3
  binomial_bound = s + 2 * levels + 3
  assert sqrt <= sqrt_bound and binomial <= binomial_bound
  assert sqrt / every <= sqrt_bound / n <= 1 / 4
  assert binomial / every <= binomial_bound / n < 1 / 4.5


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
                          env={'PYTHONPATH': str(ROOT), 'PATH': '/usr/bin:/bin'})
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
    ({'schedule': ('binomial', 1), 'length': 40, 'xs': None}, 's >= 2'),
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


def test_costs_are_plain_data_for_each_schedule():
  every, sqrt = rx.scan_schedule_costs(100, 'every'), rx.scan_schedule_costs(100, 'sqrt')
  assert (every.stored_carries, every.step_evaluations, every.levels) == (100, 200, 1)
  assert (sqrt.stored_carries, sqrt.step_evaluations, sqrt.levels) == (20, 300, 2)
  binomial = rx.scan_schedule_costs(100, ('binomial', 8))
  assert binomial.stored_carries == 8 and binomial.schedule == 'binomial s=8'
  t = 3  # C(8 + 2, 8) = 45 < 100 <= C(8 + 3, 8) = 165
  assert binomial.levels == t
  assert binomial.recomputed_steps == t * 100 - math.comb(8 + t, t - 1)
