"""Every tutorial notebook runs top to bottom without an error."""

from pathlib import Path

import pytest

from tests.run_notebooks import execute

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / 'notebooks').glob('*.ipynb'))


def test_there_are_notebooks():
  assert len(NOTEBOOKS) >= 6, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
  seconds = execute(path, timeout=300)
  assert seconds < 300
