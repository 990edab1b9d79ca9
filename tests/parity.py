"""Helpers to compare our remat with jax.checkpoint on the same program."""

from __future__ import annotations

import contextlib
import io
import re

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np


def normalized_jaxpr_text(closed_jaxpr) -> str:
  """Jaxpr text with the remat primitive's name and policy reprs erased.

  Our primitive is named `checkpoint`, JAX's `remat2`; policies are distinct
  objects with distinct reprs. Everything else must match exactly.
  """
  text = str(closed_jaxpr)
  text = re.sub(r'\bremat2\[', 'checkpoint[', text)
  text = re.sub(r'policy=[^\n]*', 'policy=<policy>', text)
  # Our extra parameters; their defaults do what JAX does on these programs.
  text = re.sub(r'\n *lowering=barrier', '', text)
  text = re.sub(r'\n *ref_effects=once', '', text)
  return text


def printed_residuals(print_fn, f, *args) -> list[str]:
  """The lines a `print_saved_residuals` prints, remat primitive name erased.

  JAX exposes its residual report publicly only as `print_saved_residuals`,
  so that is what parity is measured on.
  """
  buffer = io.StringIO()
  with contextlib.redirect_stdout(buffer):
    print_fn(f, *args)
  return buffer.getvalue().replace('remat2', 'checkpoint').splitlines()


def float_leaves_sum(tree):
  leaves = [x for x in jax.tree_util.tree_leaves(tree)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return sum(jnp.sum(x) for x in leaves)


def assert_trees_equal(actual, expected, exact=True):
  a_leaves, a_tree = jax.tree_util.tree_flatten(actual)
  e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
  assert a_tree == e_tree, f'{a_tree} != {e_tree}'
  for a, e in zip(a_leaves, e_leaves):
    a, e = np.asarray(a), np.asarray(e)
    assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
    if exact or not np.issubdtype(a.dtype, np.inexact):
      np.testing.assert_array_equal(a, e)
    else:
      tol = 1e-5 if a.dtype == np.float32 else 1e-12
      np.testing.assert_allclose(a, e, rtol=tol, atol=tol)


def vjp_jaxprs(f, args):
  """Forward jaxpr (returns outputs and residuals) and backward jaxpr."""
  forward = jax.make_jaxpr(lambda *a: jax.vjp(f, *a)[0])(*args)
  out, f_vjp = jax.vjp(f, *args)
  cotangent = jax.tree_util.tree_map(_zeros_cotangent, out)
  backward = jax.make_jaxpr(f_vjp)(cotangent)
  return forward, backward


def _zeros_cotangent(x):
  x = jnp.asarray(x)
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.zeros_like(x)
  return np.zeros(x.shape, jax.dtypes.float0)


_TYPE = re.compile(r'^(\w+)\[([\d,]*)\]')
_DTYPES = {'f16': 'float16', 'bf16': 'bfloat16', 'f32': 'float32', 'f64': 'float64',
           'i8': 'int8', 'i32': 'int32', 'i64': 'int64', 'u8': 'uint8',
           'u32': 'uint32', 'bool': 'bool'}


def jax_residual_bytes(f, *args, arguments: bool = True) -> int:
  """Bytes of the residuals JAX's own ``print_saved_residuals`` lists for
  `f` (the arguments it saves left out unless `arguments`)."""
  total = 0
  for line in printed_residuals(jax.ad_checkpoint.print_saved_residuals, f, *args):
    if not arguments and 'from the argument' in line:
      continue
    m = _TYPE.match(line)
    dims = [int(d) for d in m.group(2).split(',') if d]
    total += int(np.prod(dims, dtype=np.int64)) * np.dtype(_DTYPES[m.group(1)]).itemsize
  return total
