"""Random step functions and scans to compare, for checkpointed_scan's tests."""

import jax
import jax.numpy as jnp
import numpy as np

import remat_explorer as rx
from tests.parity import assert_trees_equal

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
