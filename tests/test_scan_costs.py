"""What checkpointed_scan's schedules cost: step evaluations against an
independent optimum, carries stored, XLA's compiled memory, and
scan_schedule_costs' figures."""

import functools
import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer.engine import revolve, scan_plans
from tests.scan_programs import (assert_close, lax_scan, make_loss, make_problem, ours,
                                 value_and_grads)


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
  for carries in range(s + 1):
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


def test_closed_form_and_the_loops_rules_equal_the_dynamic_programming_optimum():
  for s in range(1, 6):
    for n in range(1, 41):
      costs = rx.scan_schedule_costs(n, ('binomial', s))
      assert costs.step_evaluations == revolve_optimum(n, s), (n, s)
      assert costs.recomputed_steps == costs.step_evaluations - n
      actions = revolve.simulate(n, s)
      assert sum(a in ('advance', 'vjp') for a, _ in actions) == costs.step_evaluations


def test_nested_plans_run_what_their_costs_say():
  for n in range(1, 41):
    for schedule, segments in (('every', None), ('sqrt', None), ('segments', 3)):
      costs = rx.scan_schedule_costs(n, schedule, segments)
      plan = scan_plans.plan_for(n, schedule, segments)
      assert plan.length == n
      assert plan_evaluations(plan) == costs.step_evaluations, (n, schedule)


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

  'every' keeps n; 'sqrt' its k + n // k; the binomial loop its s
  snapshots, plus one step's working set: the carry in hand and the next,
  the cotangent, the step's tape and the last step's (a handful, whatever
  n). Each step's input is as large as the carry: blocks that kept their
  own slices of xs would keep several times n.
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
  binomial_bound = rx.scan_schedule_costs(n, ('binomial', s)).stored_carries + 6
  assert sqrt <= sqrt_bound and s <= binomial <= binomial_bound
  assert sqrt / every <= sqrt_bound / n <= 1 / 4
  assert binomial / every <= binomial_bound / n < 1 / 5


def test_costs_are_plain_data_for_each_schedule():
  every, sqrt = rx.scan_schedule_costs(100, 'every'), rx.scan_schedule_costs(100, 'sqrt')
  assert (every.stored_carries, every.step_evaluations, every.levels) == (100, 200, 1)
  assert (sqrt.stored_carries, sqrt.step_evaluations, sqrt.levels) == (20, 300, 2)
  binomial = rx.scan_schedule_costs(100, ('binomial', 8))
  assert binomial.stored_carries == 8 and binomial.schedule == 'binomial s=8'
  t = 3  # C(8 + 2, 8) = 45 < 100 <= C(8 + 3, 8) = 165
  assert binomial.levels == t
  assert binomial.recomputed_steps == t * 100 - math.comb(8 + t, t - 1)
