"""Property-based tests: random programs, random names, random policies.

For any composition of primitives, any naming of its intermediates and any
policy, our remat's gradient equals the gradient without remat and, exactly,
the gradient under jax.checkpoint; both save the same residuals.
"""

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remat_explorer as rx
from tests.parity import assert_trees_equal, printed_residuals

NAMES = ('a', 'b', 'c')

UNARY = {
    'sin': jnp.sin, 'cos': jnp.cos, 'tanh': jnp.tanh,
    'exp': lambda h: jnp.exp(0.1 * h), 'square': lambda h: h * h,
    'log1p_sq': lambda h: jnp.log1p(h * h),
}

step = st.one_of(
    st.tuples(st.just('unary'), st.sampled_from(sorted(UNARY))),
    st.tuples(st.just('matmul'), st.integers(0, 1)),
    st.tuples(st.just('mix'), st.integers(0, 8)),  # combine with an earlier value
    st.tuples(st.just('name'), st.sampled_from(NAMES)),
)


def policy_strategy():
  names = st.lists(st.sampled_from(NAMES), max_size=3, unique=True)
  return st.one_of(
      st.just(None),
      st.sampled_from(['everything_saveable', 'nothing_saveable', 'dots_saveable',
                       'dots_with_no_batch_dims_saveable']).map(lambda n: ('plain', n)),
      names.map(lambda ns: ('save_only_these_names', tuple(ns))),
      names.map(lambda ns: ('save_any_names_but_these', tuple(ns))),
      names.map(lambda ns: ('both_dots_and_names', tuple(ns))),
  )


def make_policy(spec, policies):
  if spec is None:
    return None
  kind, arg = spec
  if kind == 'plain':
    return getattr(policies, arg)
  if kind == 'both_dots_and_names':
    return policies.save_from_both_policies(policies.dots_with_no_batch_dims_saveable,
                                            policies.save_only_these_names(*arg))
  return getattr(policies, kind)(*arg)


def make_program(steps, name_fn):
  def program(ws, x):
    values = [x]
    h = x
    for kind, arg in steps:
      if kind == 'unary':
        h = UNARY[arg](h)
      elif kind == 'matmul':
        h = h @ ws[arg]
      elif kind == 'mix':
        h = h + 0.5 * values[arg % len(values)]
      else:
        h = name_fn(h, arg)
      values.append(h)
    return jnp.sum(h * values[len(values) // 2])
  return program


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=10),
       policy_spec=policy_strategy(),
       use_jax_names=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_remat_gradient_matches_plain_and_jax(steps, policy_spec, use_jax_names, seed):
  rng = np.random.default_rng(seed)
  ws = tuple(jnp.asarray(rng.standard_normal((4, 4)) * 0.5, jnp.float32) for _ in range(2))
  x = jnp.asarray(rng.standard_normal((3, 4)), jnp.float32)
  name_fn = jax.ad_checkpoint.checkpoint_name if use_jax_names else rx.checkpoint_name
  program = make_program(steps, name_fn)

  ours = rx.checkpoint(program, policy=make_policy(policy_spec, rx.checkpoint_policies))
  theirs = jax.checkpoint(program, policy=make_policy(policy_spec, jax.checkpoint_policies))

  plain_grad = jax.grad(program, (0, 1))(ws, x)
  ours_grad = jax.grad(ours, (0, 1))(ws, x)
  assert_trees_equal(ours_grad, plain_grad, exact=False)
  assert_trees_equal(ours_grad, jax.grad(theirs, (0, 1))(ws, x))
  assert (printed_residuals(rx.print_saved_residuals, ours, ws, x)
          == printed_residuals(jax.ad_checkpoint.print_saved_residuals, theirs, ws, x))
