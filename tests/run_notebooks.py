"""Execute tutorial notebooks top to bottom with nbclient.

    python tests/run_notebooks.py [--write] notebooks/*.ipynb

Fails (exit 1) on the first cell error. With --write the executed notebook,
outputs included, replaces the file, which is how the notebooks are
committed (``make notebooks``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, *, write: bool = False, timeout: int = 600) -> float:
  """Run every cell of the notebook at `path`; return the seconds it took."""
  notebook = nbformat.read(path, as_version=4)
  client = NotebookClient(notebook, timeout=timeout, kernel_name='python3',
                          resources={'metadata': {'path': str(path.parent)}})
  start = time.perf_counter()
  client.execute()
  seconds = time.perf_counter() - start
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
