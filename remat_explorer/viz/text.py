"""Humanised numbers and escaping, shared by every renderer.

Everything a user's program can name (checkpoint names, jitted function
names, source paths) ends up in DOT, SVG or HTML. It goes through
``html_text`` on its way there, so no renderer has to remember.
"""

from __future__ import annotations

import html
import math
import re

_BYTE_UNITS = ('B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB')
_FLOP_UNITS = ('FLOP', 'kFLOP', 'MFLOP', 'GFLOP', 'TFLOP', 'PFLOP')
MISSING = '—'
_XML_WHITESPACE = ' \t\n\r'
# Terminal colour and cursor codes (CSI sequences, e.g. ``\x1b[35m``) that
# JAX's pretty-printer, XLA's messages or a user's text may carry.
_ANSI = re.compile(r'\x1b\[[0-?]*[ -/]*[@-~]')


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


def html_text(value: object) -> str:
  """`value` as text that is safe inside HTML, SVG and DOT HTML-like labels.

  Terminal escape sequences are dropped (they would show as raw codes).
  Other control characters than XML's whitespace (tab, newline, carriage
  return) become U+FFFD: Graphviz's HTML-label parser (expat) rejects them
  outright, and they have no business in a label anyway.
  """
  text = strip_ansi(str(value))
  if not text.isprintable():
    text = ''.join(c if c.isprintable() or c in _XML_WHITESPACE else '\ufffd'
                   for c in text)
  return html.escape(text, quote=True)


def strip_ansi(text: str) -> str:
  """`text` without terminal escape sequences (colours, cursor moves)."""
  return _ANSI.sub('', text) if '\x1b' in text else text


_REPEATED_ITEM = re.compile(r'(?<=[:;] )(?P<item>[^;]+?)(?:; (?P=item))+(?=[;.]|$)')


def unique_lines(lines) -> list[str]:
  """`lines` without repeats (first occurrence kept), and within a line a
  run of identical ``'; '``-separated items shown once with ``(×N)``: a
  warning listing the same residual of every layer reads as one item."""
  def once(match):
    return f'{match.group("item")} (×{match.group(0).count("; ") + 1})'
  out = []
  for line in lines:
    text = _REPEATED_ITEM.sub(once, line)
    if text not in out:
      out.append(text)
  return out
