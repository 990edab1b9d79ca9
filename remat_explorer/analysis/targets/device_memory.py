"""How much memory a device has: what a compiled peak is measured against.

A live GPU or TPU says so itself (``memory_stats()['bytes_limit']``, what
JAX's allocator may use). A compile-only device cannot: a GPU target's
comes from its target config (``device_memory_size``), a TPU's from the
chip's published HBM, shared by the devices of one chip. The CPU has no
device memory of its own to fill: None.
"""

from __future__ import annotations

import collections

GIB = 1 << 30

TPU_HBM_PER_CHIP = {
    'TPU v3': 32 * GIB,
    'TPU v4': 32 * GIB,
    'TPU v5 lite': 16 * GIB,  # v5e
    'TPU v5': 95 * GIB,  # v5p
    'TPU v6 lite': 32 * GIB,  # v6e (Trillium)
}
"""HBM per chip, from the TPUs' public specifications, by JAX's device kind."""

_compile_only: dict[object, int | None] = {}
"""Memory per device of the compile-only devices made here, by their client
(one per topology)."""


def note_compile_only_devices(devices, memory_bytes: int | None) -> None:
  """Remember what each of `devices` (compile-only, one topology) holds."""
  for d in devices:
    _compile_only[d.client] = memory_bytes


def tpu_device_memory(devices) -> int | None:
  """Each TPU device's share of its chip's HBM: a chip run as two devices
  (v3, or v4 without megacore) gives each half."""
  per_chip = TPU_HBM_PER_CHIP.get(devices[0].device_kind)
  if per_chip is None:
    return None
  chips = collections.Counter(tuple(getattr(d, 'coords', (d.id,))) for d in devices)
  return per_chip // max(chips.values())


def device_memory_bytes(device) -> int | None:
  """The bytes `device` holds, or None where it is not known (the CPU).

  Example:
    >>> import jax
    >>> import remat_explorer as rx
    >>> from remat_explorer import analysis
    >>> h100 = rx.target_mesh('h100:8').devices.flat[0]
    >>> analysis.device_memory_bytes(h100) / 2**30  # doctest: +ELLIPSIS
    79.14...
    >>> analysis.device_memory_bytes(jax.devices('cpu')[0]) is None
    True
  """
  client = getattr(device, 'client', None)
  if client in _compile_only:
    return _compile_only[client]
  if device.platform == 'cpu':
    return None
  try:
    stats = device.memory_stats() or {}
  except Exception:  # a backend without memory statistics
    stats = {}
  return stats.get('bytes_limit')
