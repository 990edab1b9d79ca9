"""Where a problem's program runs: its devices and mesh.

Read from the arguments' shardings, the meshes named inside the program and
the mesh set with ``jax.set_mesh`` before anything is compiled, and from the
compiled executable's own shardings after. What each residual costs per
device is ``split/sharding.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import jax
from jax.extend import core
from jax.sharding import AbstractMesh, Mesh, NamedSharding

MeshShape = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Placement:
  """The devices a problem's program runs on."""
  num_devices: int
  mesh_shape: MeshShape | None
  """Axis names and sizes, e.g. ``(('data', 2), ('model', 4))``; None when no
  mesh is named (shardings such as ``GSPMDSharding`` carry none)."""
  device: object = None
  """One of the devices, the first by id: the kind the program is compiled
  for (a target's compile-only TPU or GPU, say); None where no sharding or
  mesh names a device."""


def mesh_text(mesh_shape: MeshShape | None) -> str:
  """``(('data', 2), ('model', 4))`` -> ``'data=2 × model=4'``."""
  if not mesh_shape:
    return ''
  return ' × '.join(f'{name}={size}' for name, size in mesh_shape)


# -- where the arguments and the program live --------------------------------------

def check_one_device_set(paths: Sequence[str], leaves: Sequence) -> None:
  """Refuse arguments committed to different sets of devices.

  A jitted program runs on one set of devices. JAX refuses such arguments
  too, at lowering, naming flattened positions; this names the arguments
  and their meshes before anything is traced.
  """
  first = None
  for path, leaf in zip(paths, leaves):
    sharding = _committed_sharding(leaf)
    if sharding is None:
      continue
    devices = sorted(d.id for d in sharding.device_set)
    if first is None:
      first = (path, sharding, devices)
    elif devices != first[2]:
      raise ValueError(
          f'arguments are on different devices: {first[0]} on '
          f'{_placement_text(first[1], first[2])} but {path} on '
          f'{_placement_text(sharding, devices)}. A program runs on one set '
          'of devices: place every argument on the same mesh, e.g. with '
          'jax.device_put(x, NamedSharding(mesh, spec)).')


def find_placement(leaves: Sequence, program: core.ClosedJaxpr) -> Placement | None:
  """The devices `program` runs on, or None for an ordinary one-device program.

  Looks at the arguments' shardings, the meshes and shardings named inside
  the program (``shard_map``, ``with_sharding_constraint``, ``jit`` with
  ``in_shardings``/``out_shardings``, Explicit-mode types) and the mesh set
  with ``jax.set_mesh``. A mesh of one device counts: its figures are the
  global ones, which is what a 1-device point of a scaling study needs.
  """
  meshes, counts = [], []
  for leaf in leaves:
    sharding = getattr(leaf, 'sharding', None)
    if isinstance(sharding, NamedSharding):
      meshes.append(sharding.mesh)
    if sharding is not None and len(sharding.device_set) > 1:
      counts.append(len(sharding.device_set))
  meshes += _meshes_in(program.jaxpr)
  context = jax.sharding.get_abstract_mesh()
  if not context.empty:
    meshes.append(context)
  meshes = [m for m in meshes if not m.empty]
  if not meshes and not counts:
    return None
  counts += [m.size for m in meshes]
  shape = tuple(meshes[0].shape.items()) if meshes else None
  return Placement(max(counts), shape, _first_device(leaves, meshes))


def _first_device(leaves: Sequence, meshes: list):
  """The first device, by id, of the arguments' shardings (those committed
  to devices first: an uncommitted array follows the others, as ``jit``
  moves it) or of a mesh with devices (an ``AbstractMesh`` has none)."""
  for committed in (True, False):
    for leaf in leaves:
      sharding = (_committed_sharding(leaf) if committed
                  else getattr(leaf, 'sharding', None))
      if isinstance(sharding, jax.sharding.Sharding):
        return min(sharding.device_set, key=lambda d: d.id)
  for mesh in meshes:
    if isinstance(mesh, Mesh):
      return min(mesh.devices.flat, key=lambda d: d.id)
  return None


def device_count(placement: Placement | None) -> int:
  """The devices a program placed as `placement` runs on: 1 for an
  ordinary one-device program."""
  return 1 if placement is None else placement.num_devices


def target_device(placement: Placement | None):
  """The device a program placed as `placement` is compiled for: its own,
  or JAX's default device."""
  if placement is not None and placement.device is not None:
    return placement.device
  return jax.devices()[0]


def _meshes_in(jaxpr: core.Jaxpr) -> list:
  found = [getattr(v.aval, 'sharding', None) for v in jaxpr.invars]
  found = [s.mesh for s in found if isinstance(s, NamedSharding)]
  for eqn in jaxpr.eqns:
    for value in eqn.params.values():
      found += _meshes_of(value)
    for sub in core.jaxprs_in_params(eqn.params):
      found += _meshes_in(sub)
  return found


def _meshes_of(value) -> list:
  if isinstance(value, (Mesh, AbstractMesh)):
    return [value]
  if isinstance(value, NamedSharding):
    return [value.mesh]
  if isinstance(value, tuple):
    return [m for v in value for m in _meshes_of(v)]
  return []


def _committed_sharding(leaf):
  if isinstance(leaf, jax.ShapeDtypeStruct):
    return leaf.sharding
  if isinstance(leaf, jax.Array) and getattr(leaf, 'committed', False):
    return leaf.sharding
  return None


def _placement_text(sharding, devices) -> str:
  ids = f'device ids {devices}'
  if isinstance(sharding, NamedSharding):
    return f'mesh {mesh_text(tuple(sharding.mesh.shape.items()))} ({ids})'
  return ids


def compiled_placement(compiled, fallback: Placement | None) -> Placement:
  """Devices and mesh of a compiled executable: the device count from its
  parameter and result shardings, the mesh from a ``NamedSharding`` among
  them, else from `fallback` (what the problem named)."""
  try:
    placed = (compiled.input_shardings, compiled.output_shardings)
  except ValueError:
    # A program that closes over a mutable ref takes the ref as an input and
    # gives its new value as an output that its trees do not hold: JAX cannot
    # lay their shardings out ("Too many leaves for PyTreeDef").
    if fallback is not None:
      return fallback
    placed = ()
  shardings = [s for s in jax.tree_util.tree_leaves(placed)
               if isinstance(s, jax.sharding.Sharding)]
  count = max((len(s.device_set) for s in shardings), default=1)
  mesh = next((tuple(s.mesh.shape.items()) for s in shardings
               if isinstance(s, NamedSharding) and not s.mesh.empty), None)
  if mesh is None and fallback is not None:
    mesh = fallback.mesh_shape
  device = next((min(s.device_set, key=lambda d: d.id) for s in shardings), None)
  return Placement(count, mesh, device)
