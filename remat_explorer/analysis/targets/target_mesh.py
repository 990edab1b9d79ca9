"""``target_mesh``: a mesh of accelerators to compile for, from any machine.

``target_mesh("v5e:16x16", {"data": 64, "model": 4})`` is a
``jax.sharding.Mesh`` over 256 compile-only TPU v5e chips;
``target_mesh("h100:4x8", ...)`` over 32 H100s in 4 hosts of 8. Arguments
given as ``jax.ShapeDtypeStruct`` with ``NamedSharding``s on such a mesh
(JAX's AOT convention) make every entry point compile for that target:
XLA's own memory and FLOP figures for it, per device, with nothing
allocated here.
"""

from __future__ import annotations

import math
import warnings
import re
from collections.abc import Mapping

import numpy as np
from jax.sharding import Mesh

from remat_explorer import engine
from remat_explorer.analysis.targets import device_memory, gpu_configs

_TPU = re.compile(r'(v\d+[a-z]*):(\d+(?:x\d+)*)')
_GPU = re.compile(r'([a-z][a-z0-9_]*)(?::(?:(\d+)x)?(\d+))?')
_MEGACORE = ('v4', 'v5p')
"""TPUs whose two cores JAX runs as one device (megacore), as on the hardware."""

_made: dict[str, list] = {}
"""The devices of each target made so far: JAX makes a topology's devices
afresh on each request, and a mesh's devices must be the same objects as
the shardings' built on another call."""


def target_mesh(target: str, axes: Mapping[str, int] | None = None) -> Mesh:
  """A mesh of compile-only devices of `target`, with `axes` (axis name ->
  size, in order; their product is the number of devices; default one axis
  ``'data'`` over all of them).

  `target`: a TPU topology as libtpu names it (``'v5e:2x2'``,
  ``'v5e:16x16'``, ``'v5p:4x4x4'``, ``'v6e:2x2'``, ``'v4:2x2x1'``); or a GPU
  and a count: ``'h100'`` (one), ``'h100:8'``, ``'h100:2x8'`` (2 hosts of
  8), for the GPUs of ``gpu_target_names()`` and any registered with
  ``register_gpu_target``. TPUs need ``pip install 'remat_explorer[tpu]'``,
  GPUs ``'remat_explorer[cuda]'``.

  Example:
    >>> import remat_explorer as rx
    >>> mesh = rx.target_mesh('h100:8', {'data': 2, 'model': 4})
    >>> dict(mesh.shape), mesh.devices.flat[0].device_kind
    ({'data': 2, 'model': 4}, 'NVIDIA H100 80GB HBM3')
    >>> pod = rx.target_mesh('v5e:2x2')
    >>> dict(pod.shape), pod.devices.flat[0].platform
    ({'data': 4}, 'tpu')
  """
  if not isinstance(target, str):
    raise TypeError(f'target must be a string such as "v5e:2x2" or "h100:8", '
                    f'got {type(target).__name__} {target!r}.')
  devices = _devices(target.strip().lower())
  names, shape = _axes(axes, len(devices), target)
  return Mesh(_arranged(devices, shape), names)


def _devices(target: str) -> list:
  if target not in _made:
    if m := _TPU.fullmatch(target):
      _made[target] = _tpu_devices(target, m.group(1))
    elif m := _GPU.fullmatch(target):
      _made[target] = _gpu_devices(target, m.group(1), int(m.group(2) or 1),
                                   int(m.group(3) or 1))
    else:
      raise ValueError(f'unknown target {target!r}: give a TPU topology such as '
                       '"v5e:2x2" or "v5p:4x4x4", or a GPU and a count such as '
                       '"h100:8" or "h100:2x8" (2 hosts of 8).')
  return _made[target]


def _tpu_devices(target: str, generation: str) -> list:
  if not engine.tpu_support_installed():
    raise ModuleNotFoundError(
        f'compiling for {target!r} needs libtpu: pip install "remat_explorer[tpu]"')
  options = {'chip_config_name': 'megacore'} if generation in _MEGACORE else {}
  try:
    devices = engine.compile_only_tpu_devices(target, **options)
  except Exception as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f'libtpu has no TPU topology {target!r}: {first}') from None
  device_memory.note_compile_only_devices(devices, device_memory.tpu_device_memory(devices))
  return devices


def _gpu_devices(target: str, name: str, hosts: int, per_host: int) -> list:
  gpu = gpu_configs.gpu_target(name)
  if gpu is None:
    hint = (f'OpenXLA publishes no config of {name!r}: on such a GPU, run '
            'rx.gpu_target_config(), then register_gpu_target(name, config) here'
            if name in gpu_configs.KNOWN_WITHOUT_CONFIG else
            f'known GPUs: {", ".join(gpu_configs.gpu_target_names())}')
    raise ValueError(f'no GPU target {name!r} ({hint}).')
  if not engine.cuda_plugin_installed():
    raise ModuleNotFoundError(
        f'compiling for {target!r} needs JAX\'s CUDA plugin: '
        'pip install "remat_explorer[cuda]"')
  config, dropped = gpu.config, []
  while True:
    try:
      devices = engine.compile_only_cuda_devices(f'1x{hosts}x{per_host}', config)
      break
    except Exception as e:
      # A config captured with a newer jaxlib may name fields this XLA does
      # not know: each is left out, and the user told.
      field = gpu_configs.unknown_field(e)
      if field is None or field in dropped:
        raise
      config = gpu_configs.without_field(config, field)
      dropped.append(field)
  if dropped and not gpu.shipped:  # the shipped H200's: known, see gpu_specs/
    warnings.warn(f'the target config of {name!r} names fields this JAX\'s XLA does not '
                  f'know, left out: {", ".join(dropped)} (a config captured with a newer '
                  'jaxlib).', stacklevel=3)
  device_memory.note_compile_only_devices(devices, gpu.memory_bytes)
  return devices


def _axes(axes, count: int, target: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
  if axes is None:
    return ('data',), (count,)
  if not isinstance(axes, Mapping) or not axes or not all(
      isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
      for k, v in axes.items()):
    raise ValueError(f'axes must map axis names to sizes, e.g. {{"data": {count}}}, '
                     f'got {axes!r}.')
  if math.prod(axes.values()) != count:
    raise ValueError(f'{target!r} has {count} devices, but axes {dict(axes)} make '
                     f'{math.prod(axes.values())}.')
  return tuple(axes), tuple(axes.values())


def _arranged(devices: list, shape: tuple[int, ...]) -> np.ndarray:
  """The devices in `shape`, neighbours on the interconnect along the last
  axes as JAX's ``mesh_utils`` arranges them where it knows the hardware;
  in their own order otherwise."""
  from jax.experimental import mesh_utils
  try:
    return mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # no physical layout known for this device kind and shape
    return np.array(devices, dtype=object).reshape(shape)
