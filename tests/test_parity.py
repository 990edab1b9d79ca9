"""Parity with jax.checkpoint: every catalogue program under every policy.

The same program is built with `jax.checkpoint` and JAX's policy, and with
our `checkpoint` and our policy; values, derivatives in every mode, the saved
residuals and the forward/backward jaxprs must agree.
"""

import zlib

import jax
import jax.ad_checkpoint
import numpy as np
import pytest

import remat_explorer as rx
from tests.parity import (assert_trees_equal, float_leaves_sum,
                          normalized_jaxpr_text, printed_residuals,
                          vjp_jaxprs)
from tests.programs import PROGRAMS, policy_pairs, random_cotangent

POLICIES = policy_pairs()


def _rng(*keys):
  return np.random.default_rng(zlib.crc32('/'.join(keys).encode()))


def _build_pair(program, policy_id):
  ours_policy, jax_policy = POLICIES[policy_id]
  return (program.build(rx.checkpoint, ours_policy),
          program.build(jax.checkpoint, jax_policy))


def _diff_fn(f, args, argnums):
  """f as a function of the differentiated arguments only."""
  def g(*diff_args):
    full = list(args)
    for i, a in zip(argnums, diff_args):
      full[i] = a
    return f(*full)
  return g, [args[i] for i in argnums]


@pytest.mark.parametrize('policy_id', list(POLICIES))
@pytest.mark.parametrize('program', PROGRAMS, ids=lambda p: p.name)
def test_parity_float32(program, policy_id):
  ours, theirs = _build_pair(program, policy_id)
  rng = _rng(program.name, policy_id)
  args = program.make_args(rng, np.float32)

  assert_trees_equal(ours(*args), theirs(*args))

  loss = lambda f: (lambda *a: float_leaves_sum(f(*a)))
  assert_trees_equal(jax.grad(loss(ours), program.diff_argnums)(*args),
                     jax.grad(loss(theirs), program.diff_argnums)(*args))

  g_ours, primals = _diff_fn(ours, args, program.diff_argnums)
  g_theirs, _ = _diff_fn(theirs, args, program.diff_argnums)

  out, vjp_ours = jax.vjp(g_ours, *primals)
  _, vjp_theirs = jax.vjp(g_theirs, *primals)
  cotangent = random_cotangent(rng, out)
  assert_trees_equal(vjp_ours(cotangent), vjp_theirs(cotangent))

  tangents = random_cotangent(rng, primals)
  assert_trees_equal(jax.jvp(g_ours, primals, tangents),
                     jax.jvp(g_theirs, primals, tangents))
  _, lin_ours = jax.linearize(g_ours, *primals)
  _, lin_theirs = jax.linearize(g_theirs, *primals)
  assert_trees_equal(lin_ours(*tangents), lin_theirs(*tangents))

  ours_printed = printed_residuals(rx.print_saved_residuals, g_ours, *primals)
  assert ours_printed == printed_residuals(
      jax.ad_checkpoint.print_saved_residuals, g_theirs, *primals)
  assert len(ours_printed) == len(rx.saved_residuals(g_ours, *primals))

  fwd_ours, bwd_ours = vjp_jaxprs(g_ours, primals)
  fwd_theirs, bwd_theirs = vjp_jaxprs(g_theirs, primals)
  assert normalized_jaxpr_text(fwd_ours) == normalized_jaxpr_text(fwd_theirs)
  assert normalized_jaxpr_text(bwd_ours) == normalized_jaxpr_text(bwd_theirs)


# In float64 the policies decide as in float32 (test_parity_float32 runs
# them all): no remat and a policy by names are enough to check the dtypes.
@pytest.mark.parametrize('policy_id', ['none', 'save_only_these_names'])
@pytest.mark.parametrize('program', PROGRAMS, ids=lambda p: p.name)
def test_parity_float64(program, policy_id):
  with jax.enable_x64(True):
    ours, theirs = _build_pair(program, policy_id)
    rng = _rng(program.name, policy_id, 'f64')
    args = program.make_args(rng, np.float64)
    assert_trees_equal(ours(*args), theirs(*args))
    loss = lambda f: (lambda *a: float_leaves_sum(f(*a)))
    grads = jax.grad(loss(ours), program.diff_argnums)(*args)
    assert all(np.asarray(g).dtype == np.float64 for g in jax.tree_util.tree_leaves(grads))
    assert_trees_equal(grads, jax.grad(loss(theirs), program.diff_argnums)(*args))
    g_ours, primals = _diff_fn(ours, args, program.diff_argnums)
    g_theirs, _ = _diff_fn(theirs, args, program.diff_argnums)
    tangents = random_cotangent(rng, primals)
    _, lin_ours = jax.linearize(g_ours, *primals)
    _, lin_theirs = jax.linearize(g_theirs, *primals)
    assert_trees_equal(lin_ours(*tangents), lin_theirs(*tangents))


def test_residuals_of_one_equation_are_rounded_in_jaxs_order():
  """`sort` yields two saved outputs at once: each gets its reduce_precision,
  right after the sort and in the order JAX puts them."""
  def block(x, y):
    a, b = jax.lax.sort((jax.numpy.sin(x), jax.numpy.cos(y)), num_keys=1)
    return jax.numpy.sum(a * b * y)
  x, y = _rng('sort').standard_normal((2, 5)).astype(np.float32)
  ours = rx.checkpoint(block, policy=rx.checkpoint_policies.everything_saveable)
  theirs = jax.checkpoint(block, policy=jax.checkpoint_policies.everything_saveable)
  fwd_ours, bwd_ours = vjp_jaxprs(ours, [x, y])
  fwd_theirs, bwd_theirs = vjp_jaxprs(theirs, [x, y])
  equations = [line for line in str(fwd_ours).splitlines() if ' = ' in line]
  sort = next(i for i, line in enumerate(equations) if '= sort[' in line)
  assert all('= reduce_precision[' in line for line in equations[sort + 1:sort + 3])
  assert normalized_jaxpr_text(fwd_ours) == normalized_jaxpr_text(fwd_theirs)
  assert normalized_jaxpr_text(bwd_ours) == normalized_jaxpr_text(bwd_theirs)


def _policy_questions():
  """(primitive, avals, params) for each kind of equation a built-in policy
  tells apart: dots with and without batch dimensions, a convolution, a
  scaled matmul with a batch of one and of two, another primitive, and names."""
  from jax.extend.core import Primitive
  scaled = Primitive('scaled_matmul_wrapper')
  one, two = (jax.core.ShapedArray((n, 4, 4), np.float32) for n in (1, 2))
  name_p = jax.make_jaxpr(
      lambda x: jax.ad_checkpoint.checkpoint_name(x, 'a'))(1.0).eqns[0].primitive
  dims = lambda batch: dict(dimension_numbers=(((2,), (1,)), batch))
  return [
      (jax.lax.dot_general_p, (two, two), dims(((), ()))),
      (jax.lax.dot_general_p, (two, two), dims(((0,), (0,)))),
      (jax.lax.dot_general_p, (two, two), dims(((0,), ()))),
      (jax.lax.conv_general_dilated_p, (two, two), {}),
      (scaled, (one, one), {}), (scaled, (two, two), {}),
      (jax.lax.sin_p, (two,), {}),
      *[(name_p, (two,), dict(name=n)) for n in 'abc'],
  ]


def test_policy_aliases_are_the_policies_they_name():
  """JAX's two aliases are its policies themselves, and ours are too: the
  parity matrix runs each policy once, under its own name."""
  for policies in (rx.checkpoint_policies, jax.checkpoint_policies):
    assert policies.checkpoint_dots is policies.dots_saveable
    assert (policies.checkpoint_dots_with_no_batch_dims
            is policies.dots_with_no_batch_dims_saveable)


@pytest.mark.parametrize('policy_id', [p for p in POLICIES if p != 'none'])
def test_policies_answer_like_jaxs_on_each_kind_of_equation(policy_id):
  ours, theirs = POLICIES[policy_id]
  for prim, avals, params in _policy_questions():
    answer, expected = ours(prim, *avals, **params), theirs(prim, *avals, **params)
    assert (answer, type(answer)) == (expected, type(expected)), (prim, params)
