"""Every public name of the API reference shows an example in its docstring,
and every example runs as a doctest and prints what it says it prints.

The public names are those of ``remat_explorer.__all__`` and the members
the API page (``docs/pages/api.md``) lists under each ``::: module`` block.
Each docstring's examples run in a namespace of their own, with the
globals of the module that defines the name, under ``ELLIPSIS`` (for the
figures XLA chooses) and ``NORMALIZE_WHITESPACE``. The package's private
modules are not collected (no ``--doctest-modules``).
"""

import doctest
import importlib
import io
import re
import types
from pathlib import Path

import matplotlib
import pytest

import remat_explorer as rx

# The charts' examples draw figures: never on a display.
matplotlib.use('Agg')

# One worker runs every example: they compile small programs whose results
# the analysis caches, and share the package's imports.
pytestmark = pytest.mark.xdist_group('docstrings')

API_PAGE = Path(__file__).resolve().parents[1] / 'docs' / 'pages' / 'api.md'

# Public names whose docstring is not the package's to write: JAX's own
# objects re-exported as they are, and the namespace of policies (a
# ``SimpleNamespace``, whose attributes are exactly the policies of
# ``jax.checkpoint_policies``; ``test_conventions`` checks it).
NOT_OURS = {
    'remat_explorer.checkpoint_policies': 'a SimpleNamespace of the policies',
    'remat_explorer.Saveable': "JAX's partial_eval.Saveable",
    'remat_explorer.Recompute': "JAX's partial_eval.Recompute",
    'remat_explorer.Offloadable': "JAX's partial_eval.Offloadable",
}


def _api_page_members() -> list[tuple[str, str]]:
  """(module, name) for each member listed under ``options: members:`` of
  a ``::: module`` block of the API page; a block without such a list
  stands for its module's ``__all__``."""
  members, module, listed, in_list = [], None, False, False

  def close_block():
    if module is not None and not listed:
      members.extend((module, n) for n in importlib.import_module(module).__all__)

  for line in API_PAGE.read_text().splitlines():
    if m := re.match(r':::\s*(\S+)', line):
      close_block()
      module, listed, in_list = m.group(1), False, False
    elif module is None or not line.strip():
      continue
    elif not line[0].isspace():  # the block's options end at unindented text
      close_block()
      module = None
    elif re.fullmatch(r'\s+members:\s*', line):
      listed, in_list = True, True
    elif in_list and (m := re.fullmatch(r'\s+-\s+(\w+)\s*', line)):
      members.append((module, m.group(1)))
    else:
      in_list = False
  close_block()
  return members


def _public_names() -> dict[str, object]:
  """Each public object once, by the first of its qualified names."""
  names = [('remat_explorer', n) for n in rx.__all__] + _api_page_members()
  found, seen = {}, set()
  for module, name in names:
    obj = getattr(importlib.import_module(module), name)
    if id(obj) not in seen:
      seen.add(id(obj))
      found[f'{module}.{name}'] = obj
  return found


PUBLIC = _public_names()
DOCUMENTED = [name for name in PUBLIC if name not in NOT_OURS]


def test_the_api_page_is_read_whole():
  """Every module the page documents (each ``::: module`` line) gives the
  members listed for it, the last of each list included."""
  documented = set(re.findall(r'^:::\s*(\S+)', API_PAGE.read_text(), re.M))
  assert documented >= {'remat_explorer', 'remat_explorer.analysis', 'remat_explorer.viz',
                        'remat_explorer.examples'}
  assert {module for module, _ in _api_page_members()} == documented
  for name in ('remat_explorer.gpu_target_config', 'remat_explorer.analysis.MemoryTimeline',
               'remat_explorer.viz.plot_residuals_by_origin', 'remat_explorer.examples.build'):
    assert name in PUBLIC, name


def test_every_public_name_has_an_example():
  """Each public function and class has a ``>>>`` example in its docstring."""
  missing = [name for name in DOCUMENTED if '>>>' not in (PUBLIC[name].__doc__ or '')]
  assert not missing, f'public names without a >>> example in their docstring: {missing}'


def test_the_names_without_an_example_are_jax_s_own():
  """A name is excused only while its object is JAX's (or the namespace of
  policies): once the package defines it, it needs an example too."""
  for name in NOT_OURS:
    obj = PUBLIC[name]
    if isinstance(obj, types.SimpleNamespace):
      continue
    defined_in = obj.__module__ if isinstance(obj, type) else type(obj).__module__
    assert defined_in.startswith('jax.'), (name, defined_in)


@pytest.mark.parametrize('name', DOCUMENTED)
def test_the_example_runs_and_prints_what_it_says(name):
  """The name's docstring examples, run as doctests, print their expected
  output (numbers XLA chooses elided with ``...``)."""
  obj = PUBLIC[name]
  tests = doctest.DocTestFinder(recurse=False).find(obj, name)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  report = io.StringIO()
  for test in tests:
    runner.run(test, out=report.write)
  assert runner.tries, f'{name} has no doctest example'
  assert not runner.failures, report.getvalue()
