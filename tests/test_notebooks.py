"""Every tutorial notebook runs top to bottom without an error.

How long each takes is measured, not asserted: ``python tests/run_notebooks.py
notebooks/*.ipynb`` prints each notebook's seconds (the README promises
under a minute each on a CPU). The timeout here only stops a hung cell."""

from pathlib import Path

import pytest
from nbclient.exceptions import CellTimeoutError

from tests.run_notebooks import execute

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / 'notebooks').glob('*.ipynb'))
HUNG_CELL_SECONDS = 300


def test_there_are_notebooks():
  assert len(NOTEBOOKS) >= 6, [p.name for p in NOTEBOOKS]


# One notebook at a time (one worker under `--dist loadgroup`), as a user
# runs them.
@pytest.mark.xdist_group('notebooks')
@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path):
  try:
    execute(path, timeout=HUNG_CELL_SECONDS)
  except CellTimeoutError as e:
    pytest.fail(f'{path.name}: a cell ran past {HUNG_CELL_SECONDS} s: {e}')
