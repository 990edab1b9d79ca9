"""Run as a script in its own process: needs 8 forced host devices, which
must be set before JAX is imported. Prints 'ok' when checkpointed_scan on
sharded inputs matches lax.scan."""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=8')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import remat_explorer as rx  # noqa: E402


def main():
  assert len(jax.devices()) == 8, jax.devices()
  mesh = Mesh(np.array(jax.devices()), ('data',))
  rng = np.random.default_rng(0)
  n = 6
  w = jnp.asarray(rng.standard_normal((4, 4)) * 0.5, jnp.float32)
  # The carry and xs are split over the batch axis; the scanned axis of xs
  # stays whole, as lax.scan requires.
  init = jax.device_put(jnp.asarray(rng.standard_normal((16, 4)), jnp.float32),
                        NamedSharding(mesh, P('data')))
  xs = jax.device_put(jnp.asarray(rng.standard_normal((n, 16, 4)), jnp.float32),
                      NamedSharding(mesh, P(None, 'data')))

  def step(w, c, x):
    c = jnp.tanh(c @ w + x)
    return c, jnp.sum(c, axis=1)

  def loss(scan):
    def f(w, init, xs):
      carry, ys = scan(lambda c, x: step(w, c, x), init, xs)
      return jnp.sum(carry ** 2) + jnp.sum(jnp.sin(ys))
    return jax.jit(jax.value_and_grad(f, (0, 1, 2)))

  expected = loss(jax.lax.scan)(w, init, xs)
  for schedule in (('binomial', 2),):
    scan = lambda f, c, x, schedule=schedule: rx.checkpointed_scan(f, c, x, schedule=schedule)
    actual = loss(scan)(w, init, xs)
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-5)
    assert actual[1][1].sharding.spec == init.sharding.spec, actual[1][1].sharding
  print('ok')


if __name__ == '__main__':
  main()
