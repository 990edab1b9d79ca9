"""A catalogue of small programs that use remat, for parity tests.

Each program is built twice from the same code: once with JAX's
``jax.checkpoint`` and JAX's policies, once with ours. ``build(ck, policy)``
returns the function; ``make_args(rng, dtype)`` returns random arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

import remat_explorer as rx


@dataclass(frozen=True)
class Program:
  name: str
  build: Callable  # (checkpoint, policy) -> function
  make_args: Callable  # (rng, dtype) -> tuple of arguments
  diff_argnums: tuple[int, ...] = (0,)


def _normal(rng, shape, dtype):
  return jnp.asarray(rng.standard_normal(shape), dtype=dtype)


def elementwise_chain(ck, policy):
  @ck_with(ck, policy)
  def block(x):
    y = jnp.sin(x)
    z = jnp.exp(jnp.cos(y))
    return jnp.tanh(z) * y
  return block


def matmul_stack(ck, policy):
  @ck_with(ck, policy)
  def block(ws, x):
    for w in ws:
      x = jnp.tanh(x @ w)
    return x
  return block


def named_intermediates(ck, policy):
  @ck_with(ck, policy)
  def block(w, x):
    a = checkpoint_name(jnp.sin(x @ w), 'a')
    b = checkpoint_name(jnp.cos(a) * a, 'b')
    c = checkpoint_name(b @ w.T, 'c')
    return jnp.sum(jnp.tanh(c) * b)
  return block


def pytrees(ck, policy):
  @ck_with(ck, policy)
  def block(params, batch):
    h = jnp.tanh(batch['x'] @ params['w'] + params['b'])
    out = h @ params['v']
    return {'out': out, 'aux': (jnp.sin(h), jnp.mean(out))}
  return block


def closure(ck, policy):
  def f(scale, x):
    # `scale` is a traced value from outside the block, closed over.
    block = ck_with(ck, policy)(lambda y: jnp.sin(scale * y) * jnp.cos(y))
    return block(x) * scale
  return f


def int_and_bool_outputs(ck, policy):
  @ck_with(ck, policy)
  def block(x):
    y = jnp.sin(x) * jnp.exp(x)
    return y, jnp.argmax(y), y > 0
  return block


def scan_layers(ck, policy):
  def f(ws, x):
    layer = ck_with(ck, policy)(lambda h, w: (jnp.tanh(h @ w), None))
    h, _ = jax.lax.scan(layer, x, ws)
    return jnp.sum(h ** 2)
  return f


def inside_jit(ck, policy):
  @jax.jit
  def f(w, x):
    block = ck_with(ck, policy)(lambda w, x: jnp.sin(jnp.tanh(x @ w) @ w))
    return block(w, x)
  return f


def vmapped(ck, policy):
  block = ck_with(ck, policy)(lambda w, x: jnp.sin(w @ jnp.cos(x)))
  return jax.vmap(block, in_axes=(None, 0))


def nested(ck, policy):
  inner = ck(lambda w, x: jnp.sin(checkpoint_name(x @ w, 'a')) @ w,
             policy=jax.checkpoint_policies.dots_saveable)

  @ck_with(ck, policy)
  def outer(w, x):
    return jnp.tanh(inner(w, jnp.cos(x)) * x)
  return outer


def static_flag(ck, policy):
  def block(x, mode):
    if mode == 'sin':
      return jnp.sin(jnp.sin(x))
    return jnp.cos(jnp.cos(x))
  f = ck(block, policy=policy, static_argnums=(1,))
  return lambda x: f(x, 'sin') + f(x, 'cos')


def batched_attention(ck, policy):
  @ck_with(ck, policy)
  def block(wq, x):
    q = checkpoint_name(jnp.einsum('btd,de->bte', x, wq), 'a')
    scores = jnp.einsum('bte,bse->bts', q, x)  # a dot with batch dims
    return jnp.einsum('bts,bsd->btd', jax.nn.softmax(scores), x)
  return block


def conv(ck, policy):
  @ck_with(ck, policy)
  def block(kernel, x):
    y = jax.lax.conv_general_dilated(x, kernel, (1, 1), 'SAME')
    return jnp.tanh(y) * jnp.sin(x)
  return block


def remat_in_cond(ck, policy):
  def f(w, x):
    block = ck_with(ck, policy)(lambda w, x: jnp.sin(x @ w) @ w)
    return jax.lax.cond(jnp.sum(x) > 0, block, lambda w, x: jnp.cos(x), w, x)
  return f


def ck_with(ck, policy):
  return lambda fun: ck(fun, policy=policy)


def _square_args(n=4):
  def make(rng, dtype):
    return _normal(rng, (n, n), dtype), _normal(rng, (3, n), dtype)
  return make


PROGRAMS = [
    Program('elementwise_chain', elementwise_chain,
            lambda rng, dt: (_normal(rng, (5,), dt),)),
    Program('matmul_stack', matmul_stack,
            lambda rng, dt: ([_normal(rng, (4, 4), dt) for _ in range(3)],
                             _normal(rng, (2, 4), dt)), (0, 1)),
    Program('named_intermediates', named_intermediates, _square_args(), (0, 1)),
    Program('pytrees', pytrees,
            lambda rng, dt: ({'w': _normal(rng, (3, 4), dt), 'b': _normal(rng, (4,), dt),
                              'v': _normal(rng, (4, 2), dt)},
                             {'x': _normal(rng, (5, 3), dt)}), (0, 1)),
    Program('closure', closure,
            lambda rng, dt: (_normal(rng, (), dt), _normal(rng, (6,), dt)), (0, 1)),
    Program('int_and_bool_outputs', int_and_bool_outputs,
            lambda rng, dt: (_normal(rng, (7,), dt),)),
    Program('scan_layers', scan_layers,
            lambda rng, dt: (_normal(rng, (5, 4, 4), dt), _normal(rng, (3, 4), dt)), (0, 1)),
    Program('inside_jit', inside_jit, _square_args(), (0, 1)),
    Program('vmapped', vmapped,
            lambda rng, dt: (_normal(rng, (4, 4), dt), _normal(rng, (3, 4), dt)), (0, 1)),
    Program('nested', nested, _square_args(), (0, 1)),
    Program('static_flag', static_flag, lambda rng, dt: (_normal(rng, (5,), dt),)),
    Program('batched_attention', batched_attention,
            lambda rng, dt: (_normal(rng, (4, 4), dt), _normal(rng, (2, 3, 4), dt)), (0, 1)),
    Program('conv', conv,
            lambda rng, dt: (_normal(rng, (2, 2, 3, 3), dt), _normal(rng, (1, 2, 5, 5), dt)), (0, 1)),
    Program('remat_in_cond', remat_in_cond, _square_args(), (0, 1)),
]


def policy_pairs():
  """(id, ours, JAX's) for every built-in policy, named ones included; the
  two aliases (``checkpoint_dots``, ``checkpoint_dots_with_no_batch_dims``)
  are the policies they name (test_parity checks that they are)."""
  import remat_explorer as rx
  ours, theirs = rx.checkpoint_policies, jax.checkpoint_policies

  def both(make):
    return make(ours), make(theirs)

  offload = dict(offload_src='device', offload_dst='pinned_host')
  cases = {
      'none': (None, None),
      'everything_saveable': both(lambda p: p.everything_saveable),
      'nothing_saveable': both(lambda p: p.nothing_saveable),
      'dots_saveable': both(lambda p: p.dots_saveable),
      'dots_with_no_batch_dims_saveable': both(lambda p: p.dots_with_no_batch_dims_saveable),
      'save_anything_except_these_names': both(lambda p: p.save_anything_except_these_names('a')),
      'save_any_names_but_these': both(lambda p: p.save_any_names_but_these('a')),
      'save_only_these_names': both(lambda p: p.save_only_these_names('a', 'b')),
      'save_from_both_policies': both(lambda p: p.save_from_both_policies(
          p.dots_with_no_batch_dims_saveable, p.save_only_these_names('b'))),
      'save_and_offload_only_these_names': both(lambda p: p.save_and_offload_only_these_names(
          names_which_can_be_saved=['b'], names_which_can_be_offloaded=['a'], **offload)),
      'offload_dot_with_no_batch_dims': both(
          lambda p: p.offload_dot_with_no_batch_dims(**offload)),
  }
  return cases


def random_cotangent(rng, tree):
  def leaf(x):
    x = np.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
      return jnp.asarray(rng.standard_normal(x.shape), dtype=x.dtype)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)
  return jax.tree_util.tree_map(leaf, tree)


def named_by_user(name: str):
  """A checkpointed block saving one value named `name` (in tests, text a
  user could write that must be escaped where it is shown), with its
  random arguments."""
  def block(x, w):
    h = rx.checkpoint_name(jnp.sin(x @ w), name)
    return jnp.sum(jnp.cos(h) * x)
  x = jax.random.normal(jax.random.key(1), (8, 8))
  w = jax.random.normal(jax.random.key(2), (8, 8))
  return rx.checkpoint(block, policy=rx.checkpoint_policies.save_only_these_names(name)), (x, w)
