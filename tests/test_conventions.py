"""The project's structural rules, checked."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / 'remat_explorer'


def test_jax_internals_are_imported_in_one_engine_module():
  importers = sorted(
      str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob('*.py')
      if re.search(r'^\s*(from|import)\s+jax\._src', p.read_text(), re.M))
  assert importers == ['engine/_jax_internals.py']


def test_public_api_is_reexported_at_top_level():
  import jax
  import remat_explorer as rx
  from remat_explorer import engine
  for name in ('checkpoint', 'remat', 'checkpoint_name', 'checkpoint_policies',
               'saved_residuals', 'print_saved_residuals'):
    assert getattr(rx, name) is getattr(engine, name)
  assert set(vars(jax.checkpoint_policies)) == set(vars(rx.checkpoint_policies))


def test_viz_renders_analysis_data_and_imports_nothing_from_the_engine():
  importers = sorted(
      str(p.relative_to(PACKAGE)) for p in (PACKAGE / 'viz').rglob('*.py')
      if re.search(r'^\s*(from|import)\s+(remat_explorer\.engine|jax\._src)', p.read_text(), re.M))
  assert importers == []
