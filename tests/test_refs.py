"""Mutable references in checkpointed blocks.

Refs a block allocates are private, so the block is pure and differentiates
like its ref-free twin. Refs passed in or closed over are state: by default
their effects happen once, on the forward pass, and the recompute starts
from the values they held when the block began; ``ref_effects="replay"``
performs the writes again and is refused where that would change the
gradient. JAX 0.10.2 raises a KeyError on the first kind under ``grad`` and
replays the second kind, so the reference here is the ref-free program.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer import checkpoint_policies as cp

from tests.parity import assert_trees_equal

POLICIES = [None, cp.dots_saveable, cp.everything_saveable,
            cp.save_only_these_names('scaled')]
maybe_jit = pytest.mark.parametrize('jit', [False, True], ids=['eager', 'jit'])


def _random(seed, shape=(4,)):
  return jax.random.normal(jax.random.key(seed), shape)


# -- refs allocated inside the block ------------------------------------------

def _accumulate_in_private_ref(x, w):
  acc = jax.new_ref(jnp.zeros_like(x))
  acc[...] += jnp.sin(x * w)
  acc[...] *= w
  acc[...] += rx.checkpoint_name(acc[...] ** 2, 'scaled')
  return acc[...].sum()


def _accumulate_in_values(x, w):
  acc = jnp.sin(x * w) * w
  return (acc + acc ** 2).sum()


@maybe_jit
@pytest.mark.parametrize('policy', POLICIES)
def test_internal_refs_differentiate_like_the_pure_program(policy, jit):
  x, w = _random(0), _random(1)
  f = rx.checkpoint(_accumulate_in_private_ref, policy=policy)
  grad = jax.grad(f, (0, 1))
  expected = jax.grad(_accumulate_in_values, (0, 1))(x, w)
  actual = (jax.jit(grad) if jit else grad)(x, w)
  np.testing.assert_allclose(actual, expected, rtol=1e-6)
  assert_trees_equal(f(x, w), _accumulate_in_private_ref(x, w))


def test_internal_refs_leave_no_ref_in_either_half():
  x, w = _random(0), _random(1)
  text = str(jax.make_jaxpr(jax.grad(rx.checkpoint(_accumulate_in_private_ref)))(x, w))
  assert 'Ref{' not in text and 'new_ref' not in text


# -- refs passed in or closed over: effects once -----------------------------

def _scale_then_bump(y, x_ref):
  out = y * x_ref[...]
  x_ref[...] += 1
  return out


@maybe_jit
def test_issue_example_runs_the_write_once(jit):
  f = rx.checkpoint(_scale_then_bump)
  x_ref = jax.new_ref(1.)
  grad = jax.grad(f)
  g = (jax.jit(grad) if jit else grad)(1., x_ref)
  assert float(g) == 1.0
  assert float(x_ref[...]) == 2.0


def _bump_and_sin(y, x_ref):
  out = jnp.sin(y * x_ref[...])
  x_ref[...] += 1
  return jnp.sin(out).sum()


@maybe_jit
@pytest.mark.parametrize('policy', POLICIES)
@pytest.mark.parametrize('closed_over', [False, True], ids=['argument', 'closed-over'])
def test_external_ref_gradient_is_taken_at_the_state_the_forward_saw(
    policy, closed_over, jit):
  y, start = _random(2), _random(3)
  x_ref = jax.new_ref(start)
  if closed_over:
    f = rx.checkpoint(lambda y: _bump_and_sin(y, x_ref), policy=policy)
    grad = lambda y: jax.grad(f)(y)
  else:
    f = rx.checkpoint(_bump_and_sin, policy=policy)
    grad = lambda y: jax.grad(f)(y, x_ref)
  g = (jax.jit(grad) if jit else grad)(y)
  expected = jax.grad(lambda y: jnp.sin(jnp.sin(y * start)).sum())(y)
  np.testing.assert_allclose(g, expected, rtol=1e-6)
  np.testing.assert_allclose(x_ref[...], start + 1, rtol=1e-6)


def test_ref_initial_value_is_a_residual():
  start = _random(3)
  x_ref = jax.new_ref(start)
  f = rx.checkpoint(_bump_and_sin)
  _, vjp_fn = jax.vjp(lambda y: f(y, x_ref), _random(2))
  saved = jax.tree_util.tree_leaves(vjp_fn)
  assert any(s.shape == start.shape and np.array_equal(s, start) for s in saved)


def test_saved_ref_value_is_reported_at_the_users_line():
  def f(y, x_ref):
    out = y * x_ref[...]  # the block's first use of the ref
    x_ref[...] += 1
    return out
  reports = rx.saved_residuals(rx.checkpoint(f), 1.0, jax.new_ref(1.0))
  descriptions = [d for _, d in reports]
  (ref_value,) = [d for d in descriptions if 'get' in d]
  assert __file__ in ref_value and ref_value.endswith('.f)')
  assert 'remat_explorer/engine' not in ' '.join(descriptions)


def test_writes_after_the_block_do_not_reach_the_recompute():
  # The recompute reads the saved value, not what the ref holds by then.
  start = _random(3)
  x_ref = jax.new_ref(start)
  f = rx.checkpoint(lambda y: jnp.sin(jnp.sin(y * x_ref[...])).sum())
  y = _random(2)
  _, vjp_fn = jax.vjp(f, y)
  x_ref[...] = start * 100
  (g,) = vjp_fn(jnp.ones(()))
  expected = jax.grad(lambda y: jnp.sin(jnp.sin(y * start)).sum())(y)
  np.testing.assert_allclose(g, expected, rtol=1e-6)


@maybe_jit
def test_nested_remats_over_a_closed_over_ref(jit):
  """Callbacks run as often as under JAX; the ref is written once (JAX: thrice)."""

  def run(ck):
    calls = []
    x_ref = jax.new_ref(1.5)

    @ck
    def outer(y):
      @ck
      def inner(z):
        jax.debug.callback(lambda: calls.append(None))
        out = z * x_ref[...]
        x_ref[...] += 1
        return jnp.sin(out)
      return inner(jnp.sin(y))

    grad = jax.grad(outer)
    g = (jax.jit(grad) if jit else grad)(0.5)
    jax.effects_barrier()
    return float(g), float(x_ref[...]), len(calls)

  ours, theirs = run(rx.checkpoint), run(jax.checkpoint)
  expected = float(jax.grad(lambda y: jnp.sin(jnp.sin(y) * 1.5))(0.5))
  assert ours[2] == theirs[2] > 1
  np.testing.assert_allclose(ours[0], expected, rtol=1e-6)
  assert ours[1] == 2.5
  assert theirs[1] == 4.5  # JAX replays the write in both recomputes


# -- ref_effects="replay" -----------------------------------------------------

@maybe_jit
def test_replay_performs_the_writes_again(jit):
  def run(ref_effects):
    counter = jax.new_ref(0)

    @rx.checkpoint if ref_effects is None else (
        lambda f: rx.checkpoint(f, ref_effects=ref_effects))
    def f(y):
      counter[...] += 1
      return jnp.sin(jnp.sin(y))

    grad = jax.jit(jax.grad(f)) if jit else jax.grad(f)
    return float(grad(0.3)), int(counter[...])

  g_once, count_once = run('once')
  g_replay, count_replay = run('replay')
  assert run(None) == (g_once, count_once)
  assert (count_once, count_replay) == (1, 2)
  assert g_once == g_replay == float(jax.grad(lambda y: jnp.sin(jnp.sin(y)))(0.3))


def test_replay_is_refused_when_it_would_change_the_gradient():
  f = rx.checkpoint(_scale_then_bump, ref_effects='replay')
  with pytest.raises(ValueError, match=r'ref_effects="replay".*_scale_then_bump.*once'):
    f(1., jax.new_ref(1.))


def test_replay_is_allowed_when_reads_of_written_refs_stay_inside():
  # The read of `x_ref` only feeds the write, never the output.
  def bump(y, x_ref):
    x_ref[...] += 1
    return jnp.sin(y)

  x_ref = jax.new_ref(1.)
  g = jax.grad(rx.checkpoint(bump, ref_effects='replay'))(0.2, x_ref)
  assert float(x_ref[...]) == 3.0
  np.testing.assert_allclose(g, np.cos(0.2), rtol=1e-6)


@pytest.mark.parametrize('bad', ['twice', None, 1])
def test_unknown_ref_effects_is_a_clear_error(bad):
  with pytest.raises(ValueError, match=r'`ref_effects` must be one of .once., .replay.'):
    rx.checkpoint(jnp.sin, ref_effects=bad)
