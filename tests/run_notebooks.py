"""Execute tutorial notebooks top to bottom with nbclient.

    python tests/run_notebooks.py [--write] notebooks/*.ipynb

Fails (exit 1) on the first cell error. With --write the executed notebook,
outputs included, replaces the file, which is how the notebooks are
committed (``make notebooks``); before it is saved, the Explorers its cells
displayed finish their compiles, so that the widget state saved with it
and each Explorer's static snapshot hold the compiled costs rather than a
progress line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


# Run after the notebook's own cells, and not saved: the Explorers' updates
# reach the executor only while a cell runs.
WAIT_FOR_EXPLORERS = """
import sys
if 'remat_explorer.viz.widget.notebook_output' in sys.modules:
    sys.modules['remat_explorer.viz.widget.notebook_output'].wait_for_shown({timeout})
"""


def execute(path: Path, *, write: bool = False, timeout: int = 600,
            wait_for_explorers: bool | None = None, env: dict | None = None) -> float:
  """Run every cell of the notebook at `path`; return the seconds it took.
  `wait_for_explorers` (default: when writing) waits for the Explorers'
  work before the kernel stops; `env` is the kernel's environment."""
  notebook = nbformat.read(path, as_version=4)
  waiting = write if wait_for_explorers is None else wait_for_explorers
  if waiting:
    notebook.cells.append(nbformat.v4.new_code_cell(WAIT_FOR_EXPLORERS.format(timeout=timeout)))
  # The kernel is stopped once the last cell has run, not asked to exit:
  # at exit it would first finish what a last cell's Explorer still
  # compiles (a script's end waits for that), which nothing here reads.
  client = NotebookClient(notebook, timeout=timeout, kernel_name='python3',
                          shutdown_kernel='immediate',
                          resources={'metadata': {'path': str(path.parent)}})
  start = time.perf_counter()
  client.execute(**({'env': env} if env is not None else {}))
  seconds = time.perf_counter() - start
  if waiting:
    notebook.cells.pop()
  if write:
    nbformat.write(notebook, path)
  return seconds


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--write', action='store_true')
  parser.add_argument('notebooks', nargs='+', type=Path)
  args = parser.parse_args(argv)
  for path in args.notebooks:
    seconds = execute(path, write=args.write)
    print(f'{path}: {seconds:.1f} s', flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
