"""Run as a script in its own process: needs 4 forced host devices, which
must be set before JAX is imported. Prints 'ok' when ours matches JAX's."""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=4')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import remat_explorer as rx  # noqa: E402


def main():
  assert len(jax.devices()) == 4, jax.devices()
  mesh = Mesh(np.array(jax.devices()), ('data',))
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((8, 8)) * 0.5, jnp.float32)
  x = jax.device_put(jnp.asarray(rng.standard_normal((16, 8)), jnp.float32),
                     NamedSharding(mesh, P('data')))

  def layer(w, x):
    return jnp.tanh(jnp.sin(x @ w) @ w)

  def inside(ck):  # checkpoint inside shard_map
    f = jax.shard_map(lambda w, x: jax.lax.psum(jnp.sum(ck(layer)(w, x)), 'data'),
                      mesh=mesh, in_specs=(P(), P('data')), out_specs=P())
    return jax.jit(jax.grad(f))

  def around(ck):  # shard_map inside checkpoint
    sharded = jax.shard_map(layer, mesh=mesh, in_specs=(P(), P('data')), out_specs=P('data'))
    return jax.jit(jax.grad(lambda w, x: jnp.sum(ck(sharded)(w, x) ** 2)))

  for build in (inside, around):
    ours, theirs = build(rx.checkpoint)(w, x), build(jax.checkpoint)(w, x)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert 'optimization_barrier' in build(rx.checkpoint).lower(w, x).as_text()
  print('ok')


if __name__ == '__main__':
  main()
