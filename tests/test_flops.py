"""The FLOP counter against XLA's own cost analysis."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

import remat_explorer as rx
from remat_explorer.analysis.split.flops import (
    EquationFlops, flops_by_equation, has_unknown_trip_counts, jaxpr_flops,
    jaxpr_transcendentals)


# One draw, cut into arrays: eager jax.random compiles anew for every shape.
_POOL = np.asarray(jax.random.normal(jax.random.key(0), (1 << 16,)))


def _normal(seed, *shapes):
  start = seed * 7919
  arrays = []
  for shape in shapes:
    size = math.prod(shape)
    arrays.append(jnp.asarray(_POOL.take(range(start, start + size),
                                         mode='wrap').reshape(shape)))
    start += size
  return arrays


def _xla_cost(f, *args) -> dict:
  cost = jax.jit(f).lower(*args).compile().cost_analysis()
  return cost[0] if isinstance(cost, list) else cost


def _ours(f, *args) -> int:
  return jaxpr_flops(jax.make_jaxpr(f)(*args))


def _conv_same_strided(x, w):
  return lax.conv_general_dilated(x, w, (2, 2), 'SAME')


SINGLE_OPS = {
    'matmul': (jnp.matmul, (37, 53), (53, 19)),
    'batched_matmul': (lambda a, b: jnp.einsum('bij,bjk->bik', a, b),
                       (5, 37, 53), (5, 53, 19)),
    'conv_valid': (lambda x, w: lax.conv(x, w, (1, 1), 'VALID'),
                   (2, 3, 17, 19), (5, 3, 3, 4)),
    'conv_same_strided': (_conv_same_strided, (2, 3, 17, 19), (5, 3, 3, 4)),
    'conv_grouped_dilated_nhwc': (
        lambda x, w: lax.conv_general_dilated(
            x, w, (1, 1), ((1, 2), (2, 0)), lhs_dilation=(2, 1),
            rhs_dilation=(1, 2), feature_group_count=2,
            dimension_numbers=('NHWC', 'HWIO', 'NHWC')),
        (2, 11, 13, 6), (3, 3, 3, 8)),
    'conv_grads': (jax.grad(lambda x, w: jnp.sum(_conv_same_strided(x, w)**2),
                            argnums=(0, 1)), (2, 3, 17, 19), (5, 3, 3, 4)),
}


@pytest.mark.parametrize('name', SINGLE_OPS)
def test_single_op_matches_xla_exactly(name):
  f, *shapes = SINGLE_OPS[name]
  args = _normal(0, *shapes)
  assert _ours(f, *args) == _xla_cost(f, *args)['flops']


ELEMENTWISE_AND_REDUCTIONS = {
    'logistic': jax.nn.sigmoid,
    'integer_pow_5': lambda x: x**5,
    'integer_pow_-2': lambda x: x**-2,
    'select_n_int_3_cases': lambda x: lax.select_n(
        jnp.floor(jnp.abs(x)).astype(jnp.int32), x, 2 * x, 3 * x),
    'argmax': lambda x: jnp.argmax(x, axis=0),
    'cumsum_long': lambda x: jnp.cumsum(x, axis=1),
    'sort': lambda x: jnp.sort(x, axis=0),
    'softmax': jax.nn.softmax,
    'erf_inv': lambda x: lax.erf_inv(jnp.tanh(x)),
    'max_pool': lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 3),
                                            (2, 3), 'VALID'),
}


@pytest.mark.parametrize('name', ELEMENTWISE_AND_REDUCTIONS)
def test_elementwise_and_reductions_match_xla(name):
  f = ELEMENTWISE_AND_REDUCTIONS[name]
  # Over 4096 elements: XLA's CPU backend then skips splitting long
  # reductions into padded trees, which would add up to 31 per row.
  (x,) = _normal(1, (24, 300))
  closed = jax.make_jaxpr(f)(x)
  xla = _xla_cost(f, x)
  assert jaxpr_flops(closed) == xla.get('flops', 0)
  assert jaxpr_transcendentals(closed) == xla.get('transcendentals', 0)


def _mlp_params(seed, sizes):
  shapes = [(m, n) for m, n in zip(sizes[:-1], sizes[1:])]
  ws = _normal(seed, *shapes)
  bs = _normal(seed + 1, *[(n,) for n in sizes[1:]])
  return [(w / w.shape[0]**0.5, b) for w, b in zip(ws, bs)]


def _mlp_loss(params, x):
  for w, b in params:
    x = jnp.tanh(x @ w + b)
  return jnp.sum(x**2)


@pytest.mark.parametrize('transform', ['forward', 'grad', 'checkpointed_grad'])
def test_mlp_within_5_percent_of_xla(transform):
  f = {'forward': _mlp_loss, 'grad': jax.grad(_mlp_loss),
       'checkpointed_grad': jax.grad(rx.checkpoint(_mlp_loss))}[transform]
  params = _mlp_params(2, [48, 96, 64, 32])
  (x,) = _normal(4, (16, 48))
  ratio = _ours(f, params, x) / _xla_cost(f, params, x)['flops']
  assert abs(ratio - 1) < 0.05, f'ours/XLA = {ratio:.4f}'


def _layer(h, w):
  return jnp.tanh(h @ w), None


def _scanned_stack(ws, h):
  return jnp.sum(lax.scan(_layer, h, ws)[0])


@pytest.mark.parametrize('transform', ['forward', 'grad'])
def test_scan_counts_every_iteration(transform):
  f = _scanned_stack if transform == 'forward' else jax.grad(_scanned_stack)
  ws, h = _normal(5, (7, 64, 64), (32, 64))
  ours = _ours(f, ws, h)
  one_layer = _ours(lambda h, w: _layer(h, w)[0], h, ws[0])
  per_xla = ours / (7 * _xla_cost(f, ws, h)['flops'])
  assert abs(per_xla - 1) < 0.05, f'ours/(7 x XLA) = {per_xla:.4f}'
  if transform == 'forward':
    assert abs(ours / (7 * one_layer) - 1) < 0.05, ours / (7 * one_layer)
  rows = [r for r in flops_by_equation(jax.make_jaxpr(f)(ws, h))
          if r.primitive == 'scan']
  assert rows and all(r.trip_count == 7 for r in rows)


def test_cond_counts_its_most_expensive_branch():
  x, m = _normal(6, (16, 32), (32, 32))
  big = lambda x: jnp.tanh(x @ m) + 1
  small = lambda x: x * 2 + 1
  f = lambda p, x: lax.cond(p, big, small, x)
  closed = jax.make_jaxpr(f)(True, x)
  (row,) = [r for r in flops_by_equation(closed) if r.primitive == 'cond']
  assert row.flops == max(_ours(big, x), _ours(small, x)) == _ours(big, x)
  assert row.transcendentals == x.size
  assert jaxpr_flops(closed) == _xla_cost(f, True, x)['flops']


def test_flops_by_equation_lines_up_with_the_jaxpr():
  params = _mlp_params(7, [8, 16, 4])
  (x,) = _normal(9, (3, 8))
  closed = jax.make_jaxpr(jax.value_and_grad(_mlp_loss))(params, x)
  rows = flops_by_equation(closed)
  assert [r.index for r in rows] == list(range(len(closed.eqns)))
  assert [r.primitive for r in rows] == [
      e.primitive.name for e in closed.eqns]
  assert sum(r.flops for r in rows) == jaxpr_flops(closed) > 0
  assert all(isinstance(r, EquationFlops) for r in rows)
  dots = [r for r in rows if r.primitive == 'dot_general']
  assert {r.flops for r in dots} >= {2 * 3 * 8 * 16, 2 * 3 * 16 * 4}


def test_unused_results_count_nothing():
  (x,) = _normal(10, (8, 8))
  rows = flops_by_equation(jax.make_jaxpr(lambda x: (x @ x, 1.0)[1])(x))
  assert rows[0].primitive == 'dot_general' and rows[0].flops == 0
  assert 'dead' in rows[0].note


def test_checkpoint_primitives_count_as_calls():
  (x,) = _normal(11, (8, 8))
  f = lambda x: jnp.sum(jnp.sin(x @ x) @ x)
  plain = _ours(f, x)
  assert plain == _ours(rx.checkpoint(f), x) == _ours(jax.checkpoint(f), x)
  assert plain == _ours(jax.jit(f), x)


def test_shard_map_counts_every_shard():
  mesh = AbstractMesh((4,), ('x',))
  body = lambda a, w: jnp.tanh(a @ w)
  f = jax.shard_map(body, mesh=mesh, in_specs=(P('x'), P()), out_specs=P('x'))
  a, w = _normal(12, (16, 8), (8, 8))
  placed = [jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, spec))
            for v, spec in ((a, P('x')), (w, P()))]
  (row,) = flops_by_equation(jax.make_jaxpr(f)(*placed))
  assert row.flops == _ours(body, a, w) == 2 * 16 * 8 * 8
  assert '4 shards' in row.note


def test_while_loops_have_unknown_trip_counts():
  (x,) = _normal(13, (4, 4))
  def dynamic_fori(x, n):
    return jax.jit(lambda x: lax.fori_loop(0, n, lambda i, c: c @ x, x))(x)
  def while_in_scan(x):
    step = lambda c, _: lax.while_loop(lambda c: c.sum() < 9, jnp.sin, c)
    return lax.scan(lambda c, _: (step(c, _), None), x, None, length=3)[0]
  assert has_unknown_trip_counts(jax.make_jaxpr(dynamic_fori)(x, 3))
  assert has_unknown_trip_counts(jax.make_jaxpr(while_in_scan)(x))
  assert not has_unknown_trip_counts(jax.make_jaxpr(_scanned_stack)(
      jnp.stack([x] * 3), x))
  static_fori = lambda x: lax.fori_loop(0, 5, lambda i, c: c @ x, x)
  assert not has_unknown_trip_counts(jax.make_jaxpr(static_fori)(x))
  assert _ours(static_fori, x) == 5 * (2 * 4**3 + 1)  # + the loop counter


def test_unknown_primitive_counts_zero_with_a_note():
  (x,) = _normal(14, (5, 6))
  def f(x):
    result = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.pure_callback(lambda a: a * 2, result, x) + 1
  rows = flops_by_equation(jax.make_jaxpr(f)(x))
  (callback,) = [r for r in rows if r.primitive == 'pure_callback']
  assert callback.flops == 0 and callback.note == 'not counted'
  assert jaxpr_flops(jax.make_jaxpr(f)(x)) == x.size
