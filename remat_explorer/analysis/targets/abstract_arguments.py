"""``on_target``: a step's arguments as abstract arrays placed on a mesh.

Every entry point compiles for the devices its arguments are placed on, and
a target's devices hold no data: its arguments are ``jax.ShapeDtypeStruct``s
with ``NamedSharding``s on the target's mesh (JAX's AOT convention). This
turns the arrays a user already has (initialised parameters, a batch) or
their shapes into those, and checks each placement against the mesh as it
goes, so that a misnamed axis or a dimension the mesh cannot split is an
error naming the leaf, before anything is traced or compiled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Spec = PartitionSpec | None


def on_target(tree, mesh: Mesh, spec: Spec | Callable[[str, Any], Spec] | Any = None):
  """`tree` with each array (a ``jax.Array``, a NumPy array or a
  ``jax.ShapeDtypeStruct``) replaced by a ``jax.ShapeDtypeStruct`` of its
  shape and dtype, placed on `mesh` with a ``NamedSharding``; other leaves
  (Python numbers, strings) are kept as they are. Nothing is copied: a
  target's devices (``target_mesh``) hold no data.

  `spec`: how each array is split over the mesh's axes. ``None`` (the
  default) or ``PartitionSpec()`` replicates it; one ``PartitionSpec``
  applies to every array; a tree of them matching `tree` (or a prefix of
  it, as ``jax.device_put`` takes shardings) gives each subtree its own; a
  function ``spec(path, leaf)`` of the leaf's path (``'blocks/wq'``) and
  the leaf returns each one's.

  Example:
    >>> import jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import remat_explorer as rx
    >>> mesh = rx.target_mesh('h100:8', {'data': 2, 'model': 4})
    >>> params = {'w': jnp.ones((512, 256)), 'b': jnp.zeros(256)}
    >>> batch = jnp.ones((16, 512))
    >>> params, batch = rx.on_target((params, batch), mesh, (
    ...     {'w': P(None, 'model'), 'b': P('model')}, P('data')))
    >>> params['w'].shape, tuple(params['w'].sharding.spec), tuple(batch.sharding.spec)
    ((512, 256), (None, 'model'), ('data',))
    >>> rx.on_target(jnp.ones((6, 512)), mesh, P('model'))
    Traceback (most recent call last):
    ...
    ValueError: on_target: dimension 0 of the array at the root (6 x 512) is 6, not divisible by the 4 devices of mesh axis model.
  """
  if not isinstance(mesh, Mesh):
    raise TypeError(f'on_target: mesh must be a jax.sharding.Mesh (rx.target_mesh makes '
                    f'one), got {type(mesh).__name__}.')
  if callable(spec) and not isinstance(spec, PartitionSpec):
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: _placed(path, leaf, mesh, spec(_path_text(path), leaf)), tree)
  is_spec = lambda s: s is None or isinstance(s, PartitionSpec)  # noqa: E731
  specs_with_paths, spec_structure = jax.tree_util.tree_flatten_with_path(spec, is_leaf=is_spec)
  # `spec` may be a prefix of `tree`: each spec applies to its subtree.
  try:
    subtrees = spec_structure.flatten_up_to(tree)
  except (ValueError, TypeError):
    # JAX's own message quotes the arguments' arrays: the two structures say it.
    raise ValueError(f'on_target: spec must be a PartitionSpec, None, a function of '
                     f'(path, leaf), or a tree of PartitionSpecs shaped like the arguments '
                     f'or a prefix of them: {spec_structure} is not a prefix of '
                     f'{jax.tree_util.tree_structure(tree)}.') from None
  placed = []  # each spec is checked where it meets an array (``_placed``)
  for (prefix, one_spec), subtree in zip(specs_with_paths, subtrees):
    placed.append(jax.tree_util.tree_map_with_path(
        lambda path, leaf: _placed(prefix + path, leaf, mesh, one_spec), subtree))
  return spec_structure.unflatten(placed)


def _placed(path, leaf, mesh: Mesh, spec: Spec):
  if not (hasattr(leaf, 'shape') and hasattr(leaf, 'dtype')):
    return leaf
  spec = PartitionSpec() if spec is None else spec
  if not isinstance(spec, PartitionSpec):
    raise TypeError(f'on_target: the spec for the array at {_where(path)} is a '
                    f'{type(spec).__name__}, not a PartitionSpec or None.')
  shape = tuple(leaf.shape)
  if len(spec) > len(shape):
    raise ValueError(f'on_target: {spec} names {len(spec)} dimensions, and the array at '
                     f'{_where(path)} has {len(shape)} ({_shape_text(shape)}).')
  for dim, axes in enumerate(spec):
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    unknown = [a for a in axes if a not in mesh.shape]
    if unknown:
      raise ValueError(f'on_target: the mesh has no axis {unknown[0]!r} (its axes: '
                       f'{", ".join(mesh.axis_names)}), named for the array at {_where(path)}.')
    devices = math.prod(mesh.shape[a] for a in axes)
    if shape[dim] % devices:
      raise ValueError(f'on_target: dimension {dim} of the array at {_where(path)} '
                       f'({_shape_text(shape)}) is {shape[dim]}, not divisible by the '
                       f'{devices} devices of mesh axis {" x ".join(axes)}.')
  dtype = leaf.dtype
  if not jax.dtypes.issubdtype(dtype, jax.dtypes.extended):  # a key's dtype is kept
    dtype = jax.dtypes.canonicalize_dtype(dtype)  # as jit takes it: float64 is float32 without x64
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec),
                              weak_type=getattr(leaf, 'weak_type', False))


def _path_text(path) -> str:
  """A leaf's path as ``'blocks/wq'``."""
  return '/'.join(str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k))))
                  for k in path)


def _where(path) -> str:
  return repr(_path_text(path)) if path else 'the root'


def _shape_text(shape) -> str:
  return ' x '.join(map(str, shape)) or 'a scalar'
