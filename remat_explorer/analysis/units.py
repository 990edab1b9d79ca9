"""Humanised numbers: bytes in KiB/MiB/GiB, FLOPs in kFLOP/MFLOP/GFLOP,
seconds in ms/µs. Used wherever the analysis words a figure (a search's
explanation) and by every renderer. And the size of an element from its
type's short name, as jaxprs and XLA print it (``f32``, ``bf16``, ``s4``,
``pred``)."""

from __future__ import annotations

import functools
import math
import re

_BYTE_UNITS = ('B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB')
_FLOP_UNITS = ('FLOP', 'kFLOP', 'MFLOP', 'GFLOP', 'TFLOP', 'PFLOP')
MISSING = '—'


def _humanise(n: float | None, base: int, units: tuple[str, ...]) -> str:
  if n is None or (isinstance(n, float) and not math.isfinite(n)):
    return MISSING
  sign, value = ('-' if n < 0 else ''), abs(float(n))
  exponent = 0
  while value >= base and exponent < len(units) - 1:
    value /= base
    exponent += 1
  if exponent == 0:
    # Whole bytes and FLOPs read better without a decimal.
    return f'{sign}{value:.0f} {units[0]}'
  return f'{sign}{value:.1f} {units[exponent]}'


def format_bytes(n: float | None) -> str:
  """``1536 -> '1.5 KiB'``, powers of 1024; ``None -> '—'``."""
  return _humanise(n, 1024, _BYTE_UNITS)


# What ``format_bytes`` prints, read back: a unit with an i is a power of
# 1024; without one (``GB``, ``kB``), of 1000, as device makers write sizes.
_BYTES_IN = {'B': 1, 'kB': 1000, **{
    unit.replace('i', '') if decimal else unit: (1000 if decimal else 1024) ** power
    for power, unit in enumerate(_BYTE_UNITS) if power for decimal in (False, True)}}
_SIZE = re.compile(r'\s*(\d+(?:\.\d*)?|\.\d+)\s*(' + '|'.join(_BYTES_IN) + r')\s*')


def parse_bytes(text: str) -> int | None:
  """``'1.5 KiB' -> 1536``, ``'2 GB' -> 2000000000``: a size with its unit
  as bytes, None where `text` is not one."""
  size = _SIZE.fullmatch(text)
  return None if size is None else int(float(size.group(1)) * _BYTES_IN[size.group(2)])


def format_flops(n: float | None) -> str:
  """``1500 -> '1.5 kFLOP'``, powers of 1000; ``None -> '—'``."""
  return _humanise(n, 1000, _FLOP_UNITS)


def format_seconds(s: float | None) -> str:
  """``0.0123 -> '12.3 ms'``; ``None -> '—'``."""
  if s is None:
    return MISSING
  for scale, unit in ((1, 's'), (1e-3, 'ms'), (1e-6, 'µs')):
    if abs(s) >= scale:
      return f'{s / scale:.1f} {unit}'
  return f'{s * 1e9:.0f} ns'


def memory_share_text(peak_bytes: int | None, device_memory_bytes: int | None) -> str:
  """``'46% of 16 GiB'``, or ``'112% of 16 GiB: does not fit'``; '' where
  either is unknown (the CPU has no device memory of its own)."""
  if peak_bytes is None or not device_memory_bytes:
    return ''
  share = peak_bytes / device_memory_bytes
  text = f'{100 * share:.3g}% of {format_bytes(device_memory_bytes)}'
  return text if share <= 1 else text + ': does not fit'


def byte_unit(n: float) -> float:
  """The power of 1024 `format_bytes` would use for `n`."""
  return _unit(n, 1024, len(_BYTE_UNITS))


def flop_unit(n: float) -> float:
  """The power of 1000 `format_flops` would use for `n`."""
  return _unit(n, 1000, len(_FLOP_UNITS))


def _unit(n: float, base: int, count: int) -> float:
  value, scale = abs(float(n)), 1.0
  for _ in range(count - 1):
    if value < base * scale:
      break
    scale *= base
  return scale


def aval_bytes(aval) -> int:
  """Bytes of an array of abstract value `aval` (0 for tokens and other
  shapeless values; an extended dtype, such as a PRNG key's, by the item
  size of its data where it gives one, else 4)."""
  shape, dtype = getattr(aval, 'shape', None), getattr(aval, 'dtype', None)
  if shape is None or dtype is None:
    return 0
  itemsize = getattr(dtype, 'itemsize', None)
  return math.prod(int(d) for d in shape) * (4 if itemsize is None else itemsize)


@functools.lru_cache(maxsize=None)
def element_bits(type_name: str) -> int:
  """Bits of one element of the type named `type_name` the way jaxprs and
  XLA's HLO print it: the width in the name (``f32``, ``bf16``, ``s4``,
  ``c64``, ``f8e4m3fn``), 8 for booleans (``bool``, ``pred``), 0 for a
  name without one (``token``, which holds no data)."""
  if type_name in ('pred', 'bool'):
    return 8
  m = re.search(r'\d+', type_name)
  return int(m.group()) if m else 0
