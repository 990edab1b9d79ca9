"""Every tutorial notebook runs top to bottom without an error, within the
minute the README promises for each on a CPU."""

from pathlib import Path

import pytest
from nbclient.exceptions import CellTimeoutError

from tests.run_notebooks import execute

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / 'notebooks').glob('*.ipynb'))
PROMISED_SECONDS = 60
"""README: 'Each runs top to bottom on a CPU in under a minute'."""


def test_there_are_notebooks():
  assert len(NOTEBOOKS) >= 6, [p.name for p in NOTEBOOKS]


# One notebook at a time (one worker under `--dist loadgroup`), as a user
# runs them: two compiling notebooks on two cores would time each other.
@pytest.mark.xdist_group('notebooks')
@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_within_a_minute(path):
  try:
    # No cell may take longer than the whole notebook is allowed.
    seconds = execute(path, timeout=PROMISED_SECONDS)
  except CellTimeoutError as e:
    pytest.fail(f'{path.name}: a cell ran past {PROMISED_SECONDS} s, the README\'s '
                f'limit for the whole notebook: {e}')
  assert seconds < PROMISED_SECONDS, (
      f'{path.name} took {seconds:.1f} s; the README promises under '
      f'{PROMISED_SECONDS} s per notebook on a CPU')
