"""An exception as users read it: its type and message, without a traceback
and without the note JAX's traceback filtering adds to every exception that
passes through it (it speaks of frames the user never sees here)."""

from __future__ import annotations

_JAX_FILTERING_NOTE = 'JAX has removed its internal frames'


def error_summary(e: BaseException, *, one_line: bool = False) -> str:
  """``'ValueError: message'``, with the exception's own notes but JAX's;
  `one_line`: the message's first line only (``…`` marks the rest)."""
  message = str(e).strip()
  notes = [n.strip() for n in getattr(e, '__notes__', ()) or ()
           if _JAX_FILTERING_NOTE not in n]
  text = '\n'.join([message, *notes]).strip()
  if one_line:
    text = first_line(text)
  name = type(e).__name__
  return f'{name}: {text}' if text else name


def first_line(text: str) -> str:
  """`text`'s first line that is not blank, ``…`` marking the rest."""
  lines = [line for line in text.splitlines() if line.strip()]
  return (lines[0] + (' …' if len(lines) > 1 else '')) if lines else ''
