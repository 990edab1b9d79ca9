"""Abstract arguments placed on a target's compile-only devices, as a user
places them to ask what a step costs there."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import remat_explorer as rx


def replicated(mesh, tree):
  """`tree`'s arrays as abstract arguments replicated over `mesh` (its
  other leaves as they are)."""
  return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(
      a.shape, a.dtype, sharding=NamedSharding(mesh, P())) if hasattr(a, 'shape') else a, tree)


def on_one_h100(tree):
  """`tree`'s arrays as abstract arguments on one compile-only H100."""
  device = rx.target_mesh('h100').devices.flat[0]
  return replicated(Mesh(np.array([device]), ('data',)), tree)
