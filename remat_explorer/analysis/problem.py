"""The problem ``analyze`` and ``compile_costs`` solve: a function, its
example arguments, which of them are differentiated, and the program with its
remat blocks found and their policies set. Bad input (including arguments
placed on different devices) is refused here, with the reason, before
anything is traced."""

from __future__ import annotations

import numbers

import jax
import numpy as np

from remat_explorer.analysis.program import NO_REMAT, check_block_names, find_blocks
from remat_explorer.analysis.sharding import check_one_device_set
from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine.api import checkpoint


class Problem:
  """A function with its example arguments, flattened and checked."""

  def __init__(self, f, name, leaves, in_tree, diff_mask, arg_names, argnums):
    self.f, self.name, self.leaves, self.in_tree = f, name, leaves, in_tree
    self.diff_mask, self.argnums = diff_mask, argnums
    self.diff_leaves = [x for x, d in zip(leaves, diff_mask) if d]
    self.other_leaves = [x for x, d in zip(leaves, diff_mask) if not d]
    self.diff_names = tuple(n for n, d in zip(arg_names, diff_mask) if d)
    self.other_names = tuple(n for n, d in zip(arg_names, diff_mask) if not d)

  @classmethod
  def make(cls, f, args, kwargs, argnums) -> 'Problem':
    if not callable(f):
      raise TypeError(f'expected a function to analyze, got {type(f).__name__}: {f!r}')
    argnums = _check_argnums(argnums, len(args))
    leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
    paths = [('args' if p[0].idx == 0 else 'kwargs') + jax.tree_util.keystr(p[1:])
             for p, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
    for path, leaf in zip(paths, leaves):
      if not _is_array_like(leaf):
        raise TypeError(
            f'argument leaf {path} is a {type(leaf).__name__} ({leaf!r}); '
            'analyze needs arrays or numbers at every leaf. Close over '
            'non-array values (e.g. with functools.partial) instead.')
    check_one_device_set(paths, leaves)
    per_arg = [len(jax.tree_util.tree_leaves(a)) for a in args]
    starts = np.cumsum([0, *per_arg])
    diff_mask = [False] * len(leaves)
    for i in argnums:
      for j in range(starts[i], starts[i + 1]):
        diff_mask[j] = _is_float(leaves[j])
    if not any(diff_mask):
      selected = [f'{paths[j]}: {_dtype(leaves[j])}' for i in argnums
                  for j in range(starts[i], starts[i + 1])]
      raise TypeError(
          f'argnums={argnums} selects no floating-point input of '
          f'{getattr(f, "__name__", f)!r} to differentiate (selected leaves: '
          f'{", ".join(selected) or "none"}). Pass argnums= naming the '
          'arguments that hold the parameters.')
    dbg = jx.api_util.debug_info('analyze', f, args, kwargs)
    arg_names = tuple(dbg.arg_names or ('',) * len(leaves))
    name = getattr(f, '__name__', type(f).__name__)
    return cls(f, name, leaves, in_tree, diff_mask, arg_names, argnums)

  def flat_function(self):
    def flat(*leaves):
      args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, leaves)
      return self.f(*args, **kwargs)
    flat.__name__ = self.name
    return flat

  def program_with_blocks(self, policy, lowering):
    """The program as a jaxpr with every remat block ours, policies set.

    A program without a remat block is checkpointed as a whole, as one block
    named after the function (``policy={name: ...}`` then sets its policy).
    """
    flat = self.flat_function()
    traced = jax.make_jaxpr(flat)(*self.leaves)
    program, blocks = find_blocks(traced, policy, lowering)
    if blocks or policy is NO_REMAT:
      check_block_names(policy, blocks)
      return program, blocks
    whole = checkpoint(flat, policy=policy if callable(policy) else None)
    program, blocks = find_blocks(jax.make_jaxpr(whole)(*self.leaves), policy,
                                  lowering)
    check_block_names(policy, blocks, whole_function=True)
    return program, blocks

  def cache_key(self, *settings):
    """A key for results on this problem under `settings` (policy, ...):
    the function, argument shapes/dtypes/shardings, what is differentiated,
    the device and the mesh set with ``jax.set_mesh``; None if some setting
    is unhashable."""
    key = (self.f, self.in_tree, tuple(map(_leaf_key, self.leaves)), self.argnums,
           str(jax.devices()[0]), str(jax.sharding.get_abstract_mesh()),
           *map(_hashable_policy, settings))
    try:
      hash(key)
    except TypeError:
      return None
    return key

  def merge(self, diff_leaves, other_leaves):
    diff, other = iter(diff_leaves), iter(other_leaves)
    return [next(diff) if d else next(other) for d in self.diff_mask]


def _check_argnums(argnums, num_args) -> tuple[int, ...]:
  return check_positions(argnums, num_args, 'argnums')


def check_positions(positions, num_args, name: str,
                    allow_empty: bool = False) -> tuple[int, ...]:
  """Positional-argument indices (an int or a sequence; negative ones count
  from the end), sorted and made non-negative; a clear error naming `name`
  and the argument count when one is out of range."""
  positions = (positions,) if isinstance(positions, int) else tuple(positions)
  if ((not positions and not allow_empty)
      or not all(isinstance(i, int) and -num_args <= i < num_args
                 for i in positions)):
    raise ValueError(
        f'{name}={positions} is out of range for {num_args} positional '
        f'argument(s); use positions between 0 and {num_args - 1}.')
  return tuple(sorted({i % num_args for i in positions}))


def _is_array_like(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic, numbers.Number,
                        jax.ShapeDtypeStruct))


def _dtype(x):
  return x.dtype if hasattr(x, 'dtype') else np.result_type(x)


def _is_float(x) -> bool:
  return jax.numpy.issubdtype(_dtype(x), jax.numpy.inexact)


def _leaf_key(x):
  return (tuple(np.shape(x)), str(_dtype(x)), str(getattr(x, 'sharding', '')))


def _hashable_policy(setting):
  if isinstance(setting, dict):
    return tuple(sorted(setting.items()))
  return setting
