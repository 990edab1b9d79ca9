"""Escaping (and the humanised numbers of ``analysis/units.py``), shared by
every renderer.

Everything a user's program can name (checkpoint names, jitted function
names, source paths) ends up in DOT, SVG or HTML. It goes through
``html_text`` on its way there, so no renderer has to remember.
"""

from __future__ import annotations

import html

from remat_explorer.analysis.units import (MISSING, byte_unit, flop_unit,  # noqa: F401
                                         format_bytes, format_flops, format_seconds)

_XML_WHITESPACE = ' \t\n\r'


def html_text(value: object) -> str:
  """`value` as text that is safe inside HTML, SVG and DOT HTML-like labels.

  Control characters other than XML's whitespace (tab, newline, carriage
  return) become U+FFFD: Graphviz's HTML-label parser (expat) rejects them
  outright, and they have no business in a label anyway.
  """
  text = str(value)
  if not text.isprintable():
    text = ''.join(c if c.isprintable() or c in _XML_WHITESPACE else '\ufffd'
                   for c in text)
  return html.escape(text, quote=True)
