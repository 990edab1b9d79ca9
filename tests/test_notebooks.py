"""Every tutorial notebook runs top to bottom without an error.

How long each takes is measured, not asserted: ``python tests/run_notebooks.py
notebooks/*.ipynb`` prints each notebook's seconds (docs/pages/notebooks.md promises
under a minute each on a CPU, and about two for 09, whose compiles are for a
TPU pod and 8 H100s). The timeout here only stops a hung cell."""

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


def _png_size_and_dpi(png: bytes) -> tuple[int, float | None]:
  """Width in pixels and the dots per inch a PNG records (its pHYs chunk,
  which matplotlib writes), if any."""
  import struct
  width = struct.unpack('>I', png[16:20])[0]
  at = png.find(b'pHYs')
  if at < 0:
    return width, None
  per_metre, _, unit = struct.unpack('>IIB', png[at + 4:at + 13])
  return width, per_metre * 0.0254 if unit == 1 else None


def test_committed_charts_show_unscaled_in_a_notebook_cell():
  """Every image a committed notebook holds was drawn at the charts' dpi
  (where their text is at least 11 px: test_viz checks every chart) and is
  no wider than a JupyterLab cell at a 1440-px window (900 px and more), so
  the cell shows it at its natural size rather than shrinking its text."""
  import base64
  import nbformat
  from remat_explorer.viz.charts._figures import CHART_DPI
  images = []
  for path in NOTEBOOKS:
    for cell in nbformat.read(path, as_version=4).cells:
      for output in cell.get('outputs', []):
        png = output.get('data', {}).get('image/png')
        if png:
          images.append((path.name, *_png_size_and_dpi(base64.b64decode(png))))
  assert len(images) >= 8, images
  for name, width, dpi in images:
    assert dpi is not None and round(dpi) >= CHART_DPI and width <= 900, (name, width, dpi)


def test_committed_explorer_snapshots_hold_compiled_costs():
  """`make notebooks` saves each Explorer's snapshot once its compiles
  are done: the snapshot output after each Explorer holds XLA's figures,
  not "not compiled when it was saved"."""
  import nbformat
  from remat_explorer.viz.html.snapshot import NOT_COMPILED
  from remat_explorer.viz.text import html_text
  snapshots = []
  for path in NOTEBOOKS:
    for cell in nbformat.read(path, as_version=4).cells:
      for output in cell.get('outputs', []):
        html = output.get('data', {}).get('text/html', '')
        if 'remat-snapshot-of-' in html:
          snapshots.append((path.name, 'remat-costs-table' in html,
                            html_text(NOT_COMPILED) in html))
  assert len(snapshots) >= 5, snapshots
  assert all(costs and not missing for _, costs, missing in snapshots), snapshots
