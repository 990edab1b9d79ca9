"""Code typed into a notebook, named as its user sees it: ``In [12], line 5``.

IPython compiles each cell under a file name of its own making (Jupyter's
kernel: ``/tmp/ipykernel_<pid>/<hash>.py``; the terminal:
``<ipython-input-12-...>``) and remembers, in its compiler, which execution
count each name belongs to. That file name is meaningless to the user, so a
line of a cell is shown by the cell's execution count.
"""

from __future__ import annotations

import re
import sys

_CELL_NAME = re.compile(r'In\s*\[\s*(\d+)\s*\]')


def cell_number(path: str) -> int | None:
  """The execution count of the notebook cell compiled as `path`, or None
  when `path` is not a cell of the running IPython (or there is none).

  Looked up each time: running a cell's code again gives the same file name
  a newer count."""
  compiler = _cell_compiler()
  if compiler is None or not path:
    return None
  try:
    named = compiler.format_code_name(path)
  except Exception:  # an IPython whose compiler does not name cells
    named = None
  if named and (m := _CELL_NAME.search(str(named[-1]))):
    return int(m.group(1))
  number = getattr(compiler, '_filename_map', {}).get(path)
  return number if isinstance(number, int) else None


def cell_label(number: int) -> str:
  return f'In [{number}]'


def is_cell_label(file: str) -> bool:
  return bool(_CELL_NAME.fullmatch(file))


def line_text(file: str, line: int | str) -> str:
  """``file:line``, or ``In [12], line 5`` for a cell."""
  return f'{file}, line {line}' if is_cell_label(file) else f'{file}:{line}'


def _cell_compiler():
  """The running IPython's compiler; IPython is never imported here, only
  asked when the user's process already has it."""
  ipython = sys.modules.get('IPython')
  get = getattr(ipython, 'get_ipython', None)
  if get is None:
    return None
  try:
    shell = get()
  except Exception:
    return None
  return getattr(shell, 'compile', None)
