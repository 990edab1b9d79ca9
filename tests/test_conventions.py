"""The project's structural rules, checked on every import of the package.

Imports are read with `ast`, so function-local imports, relative imports,
`importlib.import_module('...')`, `__import__('...')` and attribute access
such as `engine._jax_internals` are all seen, not only import lines.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / 'remat_explorer'
INTERNALS = 'engine/_jax_internals.py'


def _imports(source: str, module: str):
  """(imported module, imported name or None, line) for every import in
  `source`, the source of the module `module` (dotted)."""
  package = module.rsplit('.', 1)[0]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name, None, node.lineno
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parent = package.split('.')[:len(package.split('.')) - node.level + 1]
        base = '.'.join(parent + ([base] if base else []))
      for alias in node.names:
        yield base, alias.name, node.lineno
    elif (isinstance(node, ast.Call) and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
          and ((isinstance(node.func, ast.Attribute) and node.func.attr == 'import_module')
               or (isinstance(node.func, ast.Name)
                   and node.func.id in ('__import__', 'import_module')))):
      yield node.args[0].value, None, node.lineno
    elif isinstance(node, ast.Attribute) and node.attr.startswith('_jax_internals'):
      yield 'remat_explorer.engine._jax_internals', None, node.lineno


def _engine_public_names() -> set[str]:
  from remat_explorer import engine
  return set(engine.__all__)


def violations(source: str, relative_path: str, public: set[str]) -> list[str]:
  """What breaks the layering rules in the module at `relative_path`
  (relative to the package, e.g. 'analysis/split/graph.py')."""
  module = 'remat_explorer.' + relative_path.removesuffix('.py').replace('/', '.')
  in_engine = relative_path.startswith('engine/')
  found = []
  for imported, name, line in _imports(source, module):
    where = f'{relative_path}:{line}'
    full = f'{imported}.{name}' if name else imported
    if full == 'jax._src' or full.startswith('jax._src.') or imported.startswith('jax._src'):
      if relative_path != INTERNALS:
        found.append(f'{where} imports JAX internals ({full})')
      continue
    if in_engine:
      continue
    if imported.startswith('remat_explorer.engine.'):
      found.append(f'{where} imports the engine module {imported} '
                   '(use remat_explorer.engine)')
    elif imported == 'remat_explorer.engine' and name is not None and name not in public:
      found.append(f'{where} imports {name!r}, not on the engine\'s public surface')
    elif relative_path.startswith('viz/') and (
        imported == 'remat_explorer.engine' or (imported, name) == ('remat_explorer', 'engine')):
      found.append(f'{where}: the rendering imports the engine (render analysis data)')
  return found


def test_imports_keep_to_the_layers():
  public = _engine_public_names()
  found = []
  for path in sorted(PACKAGE.rglob('*.py')):
    found += violations(path.read_text(), str(path.relative_to(PACKAGE)), public)
  assert found == []


def test_the_import_check_sees_every_kind_of_import():
  public = {'checkpoint'}
  cases = {
      'from remat_explorer.engine import _jax_internals as jx': 1,
      'from remat_explorer.engine import checkpoint': 0,
      'def f():\n  from remat_explorer.engine.primitive import checkpoint_p': 1,
      'import importlib\nm = importlib.import_module("remat_explorer.engine._jax_internals")': 1,
      'm = __import__("jax._src.core")': 1,
      'from jax._src import core': 1,
      'from jax import numpy': 0,
      'from ..engine import split': 1,
      'from ..engine import checkpoint': 0,
      'import remat_explorer.engine as e\ne._jax_internals.core': 1,
  }
  for source, expected in cases.items():
    assert len(violations(source, 'analysis/x.py', public)) == expected, source
  assert violations('from jax._src import core', INTERNALS, public) == []
  assert len(violations('from remat_explorer.engine import checkpoint',
                        'viz/x.py', public)) == 1


def test_public_api_is_reexported_at_top_level():
  import jax
  import remat_explorer as rx
  from remat_explorer import engine
  for name in ('checkpoint', 'remat', 'checkpoint_name', 'checkpoint_policies',
               'saved_residuals', 'print_saved_residuals'):
    assert getattr(rx, name) is getattr(engine, name)
  # JAX 0.11 also lists the policies' classes there.
  policies = {n for n, v in vars(jax.checkpoint_policies).items() if not isinstance(v, type)}
  assert policies == set(vars(rx.checkpoint_policies))
  for name in engine.__all__:
    assert hasattr(engine, name), name


# Subpackages of a layer package, lowest first; a module imports from its own
# subpackage, a lower one, or the package's shared top-level modules.
LAYERS = {
    'analysis': ('source', 'policies', 'targets', 'program', 'split', 'xla', 'tradeoffs'),
    'viz': ('diagram', 'charts', 'html', 'widget'),
}


def _module_of(path: Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _project_imports(path: Path, source: str | None = None) -> set[str]:
  """The project's modules `path` (or `source` as that module) imports; a
  name imported from a package that is one of its modules counts as that
  module."""
  module = _module_of(path)
  modules = {_module_of(p) for p in PACKAGE.rglob('*.py')}
  found = set()
  for imported, name, _ in _imports(path.read_text() if source is None else source, module):
    if name and f'{imported}.{name}' in modules:
      found.add(f'{imported}.{name}')
    elif imported in modules:
      found.add(imported)
  return found - {module}


def layer_violations(package: str, sources: dict | None = None) -> list[str]:
  """What breaks the layer order in `package` (`sources`: a path's source
  read as if it were in the file)."""
  sources = sources or {}
  order = LAYERS[package]
  found = []
  for path in sorted((PACKAGE / package).rglob('*.py')):
    parts = path.relative_to(PACKAGE / package).parts
    if len(parts) == 1:
      if parts[0] != '__init__.py' and any(
          i.startswith(f'remat_explorer.{package}.{sub}')
          for i in _project_imports(path, sources.get(path)) for sub in order):
        found.append(f'{package}/{parts[0]} is shared by every layer but imports one')
      continue
    rank = order.index(parts[0])
    for imported in _project_imports(path, sources.get(path)):
      inside = imported.split('.')
      if inside[:2] != ['remat_explorer', package]:
        continue
      if len(inside) == 2:
        found.append(f'{path.relative_to(PACKAGE)} imports the {package} package '
                     'itself (import the module)')
      elif inside[2] in order and order.index(inside[2]) > rank:
        found.append(f'{path.relative_to(PACKAGE)} ({parts[0]}) imports {imported}, '
                     'a higher layer')
  return found


def test_each_layer_imports_only_the_layers_below_it():
  assert layer_violations('analysis') == []
  assert layer_violations('viz') == []


def test_no_module_imports_itself_back():
  """No import cycles, function-local imports included."""
  graph = {_module_of(p): _project_imports(p) for p in PACKAGE.rglob('*.py')
           if p.name != '__init__.py'}
  packages = {_module_of(p) for p in PACKAGE.rglob('__init__.py')}
  cycles = []

  def reaches(start, target, seen):
    for nxt in graph.get(start, ()):
      if nxt in packages or nxt in seen:
        continue
      if nxt == target:
        return True
      seen.add(nxt)
      if reaches(nxt, target, seen):
        return True
    return False

  for module in graph:
    if reaches(module, module, set()):
      cycles.append(module)
  assert cycles == []


def test_each_subpackage_lists_every_module_it_holds():
  for init in PACKAGE.rglob('__init__.py'):
    if init.parent in (PACKAGE, PACKAGE / 'engine'):
      continue
    doc = ast.get_docstring(ast.parse(init.read_text())) or ''
    for module in init.parent.glob('*.py'):
      if module.name != '__init__.py':
        assert f'``{module.stem}``' in doc, f'{init.relative_to(PACKAGE)} omits {module.stem}'


def test_the_layer_check_sees_an_upward_import():
  # A module of the lowest analysis layer importing the top one, or a shared
  # module importing a layer, is caught.
  cells = PACKAGE / 'analysis' / 'source' / 'cells.py'
  units = PACKAGE / 'analysis' / 'units.py'
  upward = 'def f():\n  from remat_explorer.analysis.tradeoffs import compare\n'
  assert any('a higher layer' in v for v in layer_violations(
      'analysis', {cells: cells.read_text() + upward}))
  assert any('shared by every layer' in v for v in layer_violations(
      'analysis', {units: units.read_text() + upward}))


def test_the_rendering_reads_the_analysis_only_through_its_public_surface():
  """viz imports ``remat_explorer.analysis`` itself, never one of its modules:
  what the views read of the analysis is what it exports."""
  reaching = []
  for path in sorted((PACKAGE / 'viz').rglob('*.py')):
    for imported in _project_imports(path):
      if imported.startswith('remat_explorer.analysis.'):
        reaching.append(f'{path.relative_to(PACKAGE)} imports {imported}')
  assert reaching == []
