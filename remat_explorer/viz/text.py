"""Escaping (and the humanised numbers of ``analysis/units.py``), shared by
every renderer.

Everything a user's program can name (checkpoint names, jitted function
names, source paths) ends up in DOT, SVG or HTML. It goes through
``html_text`` on its way there, so no renderer has to remember.
"""

from __future__ import annotations

import html
import re

from remat_explorer.analysis import (MISSING, byte_unit, flop_unit, format_bytes,
                                    format_flops, format_seconds, memory_share_text)  # noqa: F401

_XML_WHITESPACE = ' \t\n\r'
# Terminal colour and cursor codes (CSI sequences, e.g. ``\x1b[35m``) that
# JAX's pretty-printer, XLA's messages or a user's text may carry.
_ANSI = re.compile(r'\x1b\[[0-?]*[ -/]*[@-~]')


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
