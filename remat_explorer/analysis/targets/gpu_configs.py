"""The GPUs a program can be compiled for without one: their target configs.

XLA's GPU compiler needs a ``GpuTargetConfig`` (compute capability, memory,
cores, caches) to compile for a GPU it cannot query. The package ships
OpenXLA's configs of common GPUs and one captured from a live H200
(``gpu_specs/``, its README names the sources); a config captured from a live GPU (``gpu_target_config()``) is
registered under a name of the user's with ``register_gpu_target``.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import re

from remat_explorer import engine


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  name: str
  config: str
  """The ``GpuTargetConfig`` text proto."""
  shipped: bool = False
  """One of the package's configs (not one the user registered)."""

  @property
  def device_kind(self) -> str:
    """What JAX calls the device (``device_description_str``)."""
    m = re.search(r'device_description_str:\s*"([^"]*)"', self.config)
    return m.group(1) if m else self.name

  @property
  def memory_bytes(self) -> int | None:
    m = re.search(r'device_memory_size:\s*(\d+)', self.config)
    return int(m.group(1)) if m else None


_SHIPPED = ('h100_sxm', 'h100_pcie', 'a100_sxm_80', 'a100_sxm_40', 'h200')
_ALIASES = {'h100': 'h100_sxm', 'a100': 'a100_sxm_80', 'a100_80gb': 'a100_sxm_80',
            'a100_40gb': 'a100_sxm_40'}
_registered: dict[str, GpuTarget] = {}

KNOWN_WITHOUT_CONFIG = ('b200',)
"""GPUs users ask for whose configs OpenXLA does not publish: each needs one
captured on the GPU itself (``gpu_target_config()``) and registered."""


def register_gpu_target(name: str, config: str) -> None:
  """Make `name` a GPU target (``target_mesh(f'{name}:8')``), compiled as
  `config` describes it: a ``GpuTargetConfig`` text proto, e.g. what
  ``gpu_target_config()`` printed on that GPU.

  Example:
    A config the package ships stands in for one captured on the GPU:

    >>> from importlib.resources import files
    >>> import remat_explorer as rx
    >>> specs = files('remat_explorer.analysis.targets') / 'gpu_specs'
    >>> rx.register_gpu_target('my_h100', (specs / 'h100_pcie.txtpb').read_text())
    >>> rx.target_mesh('my_h100:2').devices.flat[0].device_kind
    'NVIDIA H100 PCIe'
  """
  if not isinstance(name, str) or not re.fullmatch(r'[a-z][a-z0-9_]*', name):
    raise ValueError(f'name must be lower case letters, digits and underscores, '
                     f'starting with a letter, got {name!r}.')
  if not isinstance(config, str) or 'gpu_device_info' not in config:
    raise ValueError('config must be a GpuTargetConfig text proto (with a '
                     'gpu_device_info block), as gpu_target_config() returns it.')
  _registered[name] = GpuTarget(name, config)


def gpu_target_config() -> str:
  """The ``GpuTargetConfig`` text proto of this machine's GPU: run it on the
  GPU, save the text, and ``register_gpu_target`` it where there is none.

  Example:
    On a machine with the GPU it returns the text; where JAX sees no GPU,
    it says so:

    >>> import remat_explorer as rx
    >>> try:
    ...   config = rx.gpu_target_config()  # save it, for register_gpu_target
    ... except RuntimeError:  # no GPU here
    ...   config = None
    >>> config is None or 'gpu_device_info' in config
    True
  """
  import jax
  engine.initialize_backends_quietly()
  gpus = [d for d in jax.devices() if d.platform == 'gpu']
  if not gpus:
    raise RuntimeError('gpu_target_config() reads a live GPU, and JAX sees none '
                       f'here (its devices: {jax.devices()}).')
  return engine.gpu_target_config_of(gpus[:1])


def gpu_target(name: str) -> GpuTarget | None:
  """The registered or shipped target of `name` (or an alias), or None."""
  name = _ALIASES.get(name, name)
  if name in _registered:
    return _registered[name]
  if name in _SHIPPED:
    text = importlib.resources.files(__package__).joinpath(
        'gpu_specs', f'{name}.txtpb').read_text()
    return GpuTarget(name, text, shipped=True)
  return None


def gpu_target_names() -> list[str]:
  """The GPUs ``target_mesh`` compiles for (``'h100:8'``): those whose
  configs the package ships, their aliases, and those registered with
  ``register_gpu_target``.

  Example:
    >>> from remat_explorer import analysis
    >>> {'a100', 'h100', 'h200'} <= set(analysis.gpu_target_names())
    True
  """
  return sorted({*_SHIPPED, *_ALIASES, *_registered})


def unknown_field(error: Exception) -> str | None:
  """The field of a target config that XLA's parser refused as unknown, as
  its error (or the notice captured beside it) names it."""
  text = ' '.join([str(error), *getattr(error, '__notes__', ())])
  m = re.search(r'has no field named "(\w+)"', text)
  return m.group(1) if m else None


def without_field(config: str, field: str) -> str:
  """`config` (a text proto) with every ``field: value`` line and every
  ``field { ... }`` block of that name removed."""
  out, depth = [], 0
  for line in config.splitlines():
    stripped = line.strip()
    if depth:
      depth += stripped.count('{') - stripped.count('}')
      continue
    if re.match(rf'{field}\s*:', stripped):
      continue
    if re.match(rf'{field}\s*\{{', stripped):
      depth = stripped.count('{') - stripped.count('}')
      continue
    out.append(line)
  return '\n'.join(out) + '\n'

