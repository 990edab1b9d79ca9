"""Where a value comes from, in the user's terms: their source line, the
module path of the model, the ``checkpoint_name`` they gave it.

JAX records, with every equation, the Python traceback of the call that
bound it and a name stack (``jax.named_scope``, Flax Linen's module names,
and transformation wrappers such as ``jvp(...)``). Both point into
frameworks as often as into the user's code: a residual of a Flax
``nn.scan`` stack reads as the output of ``scan`` from
``flax/core/axes_scan.py``. This module turns them back into the user's
terms:

* ``user_site``: the innermost frame outside JAX, Flax, Equinox, optax,
  this package and Python's standard library, its file relative to the
  working directory when under it.
* ``clean_scope``: a name stack without JAX's transformation wrappers
  (``transpose(jvp(Model))/blocks`` -> ``Model/blocks``).

``module_paths.ModulePaths`` reads module paths from the parameters an
equation uses, for frameworks that record no module names.

``producers.trace_producer`` finds the equation that made a value, through
the bodies that carry it out.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
import sys
import sysconfig
from typing import Sequence

from jax.extend.core import Jaxpr, jaxprs_in_params

from remat_explorer.analysis.cache import cleared_with_results
from remat_explorer.analysis.source.cells import cell_label, cell_number, line_text
from remat_explorer.engine import is_engine_scope

# Frames in these packages are the machinery between the user and JAX: a
# library is told by what it is (its package), never by where it lies. A
# model installed from a package index lies in site-packages as they do, and
# is the user's code all the same.
_LIBRARIES = ('jax', 'jaxlib', 'flax', 'equinox', 'optax', 'chex', 'jaxtyping',
              'typeguard', 'wadler_lindig', 'treescope', 'numpy', 'ml_dtypes',
              'opt_einsum', 'einops', 'haiku', 'diffrax', 'lineax', 'optimistix',
              'remat_explorer',
              # what runs the user's code: notebooks, widgets, test runners
              'IPython', 'ipykernel', 'ipywidgets', 'anywidget', 'traitlets', 'tornado',
              'zmq', 'jupyter_client', 'nbclient', 'pytest', '_pytest', 'pluggy',
              'xdist', 'execnet', 'hypothesis')


@functools.lru_cache(maxsize=None)
def _package_roots(names: tuple[str, ...]) -> tuple[str, ...]:
  roots = []
  for name in names:
    try:
      spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
      continue
    if spec is not None and spec.submodule_search_locations:
      roots.extend(spec.submodule_search_locations)
  return tuple(os.path.join(os.path.realpath(r), '') for r in roots)


def _folders(paths) -> tuple[str, ...]:
  return tuple(sorted({os.path.join(os.path.realpath(p), '') for p in paths if p}))


@functools.lru_cache(maxsize=None)
def _standard_library_roots() -> tuple[str, ...]:
  paths = sysconfig.get_paths()
  return _folders((paths['stdlib'], paths['platstdlib']))


@functools.lru_cache(maxsize=None)
def _installed_package_roots() -> tuple[str, ...]:
  """Where installed packages lie: a virtual environment's ``platstdlib``
  (``<venv>/lib/python3.11``) holds its ``site-packages``, which is no more
  the standard library than the user's own folder is."""
  import site
  import sys
  paths = sysconfig.get_paths()
  found = [paths['purelib'], paths['platlib'], *getattr(site, 'getsitepackages', list)()]
  found += [p for p in sys.path if os.path.basename(p.rstrip(os.sep)) in
            ('site-packages', 'dist-packages')]
  return _folders(found)


# This package's example models are a user's code like any other.
_OWN_EXAMPLES = os.path.realpath(importlib.util.find_spec('remat_explorer').submodule_search_locations[0]
                                 + '/examples.py')


@functools.lru_cache(maxsize=4096)
def is_library_file(path: str) -> bool:
  """Whether `path` is library code rather than the user's: a file of one
  of ``_LIBRARIES``, or of Python's standard library (installed packages
  aside)."""
  if not path or path.startswith('<frozen'):
    return True
  real = os.path.realpath(path)
  if real == _OWN_EXAMPLES:
    return False
  if any(real.startswith(root) for root in _package_roots(_LIBRARIES)):
    return True
  if any(real.startswith(root) for root in _installed_package_roots()):
    return False
  return any(real.startswith(root) for root in _standard_library_roots())


@functools.lru_cache(maxsize=4096)
def is_jax_file(path: str) -> bool:
  """Whether `path` is a file of JAX or jaxlib."""
  real = os.path.realpath(path)
  return any(real.startswith(root) for root in _package_roots(('jax', 'jaxlib')))


def is_method(function: str) -> bool:
  """``Attention.__call__`` is, and so is a class's defined in a function
  (``build.<locals>.Attention.__call__``); ``scan.<locals>.body``,
  ``f.<locals>.<lambda>`` and ``f`` are not."""
  own = function.rsplit('<locals>.', 1)[-1]
  return '.' in own and '<' not in own


@dataclasses.dataclass(frozen=True, order=True)
class CodeSite:
  """A line of the user's code."""
  file: str
  """Relative to the working directory when under it, else to the
  ``sys.path`` entry it is imported from (``relative_path``); a notebook
  cell as ``In [12]``."""
  line: int
  function: str

  def __str__(self) -> str:
    return f'{line_text(self.file, self.line)} ({self.function})'


Frame = tuple[str, int, str]
"""(file, line, function qualname), as JAX's tracebacks record them."""


def frames_of(traceback) -> tuple[Frame, ...]:
  """The frames of an equation's traceback, outermost first."""
  if traceback is None:
    return ()
  return _frames(traceback)


@functools.lru_cache(maxsize=65536)
def _frames(traceback) -> tuple[Frame, ...]:
  return tuple((f.file_name, f.line_num, f.function_name)
               for f in reversed(traceback.frames))


def user_frames(traceback) -> tuple[Frame, ...]:
  """The frames of the user's own code, outermost first."""
  return tuple(f for f in frames_of(traceback) if not is_library_file(f[0]))


def user_site(source_info) -> CodeSite | None:
  """The innermost line of the user's code on the way to `source_info`."""
  frames = user_frames(getattr(source_info, 'traceback', None))
  return None if not frames else site_of(frames[-1])


def user_site_within(eqn, enclosing: Sequence = ()) -> CodeSite | None:
  """The innermost line of the user's code on the way to `eqn`, an equation
  inside the bodies of the `enclosing` equations (outermost first)."""
  users = user_frames_within(eqn, enclosing)
  return site_of(users[-1]) if users else None


def user_frames_within(eqn, enclosing: Sequence = ()) -> tuple[Frame, ...]:
  """The frames of the user's code on the way to `eqn`, an equation inside
  the bodies of the `enclosing` equations (outermost first).

  JAX traces a body once and reuses it (``jit``, ``custom_jvp`` and
  ``scan`` bodies are cached on the function), so the frames recorded
  inside a body belong to whichever call traced it first, perhaps from
  another line or from another tool run earlier. Only the frames inside
  the body are the same for every call; the call itself is where the
  enclosing equation was bound."""
  if not enclosing:
    return user_frames(eqn.source_info.traceback)
  frames = frames_of(enclosing[0].source_info.traceback)
  for inner in (*enclosing[1:], eqn):
    frames = frames_in_call(frames, frames_of(inner.source_info.traceback))
  return tuple(f for f in frames if not is_library_file(f[0]))


_TRACE_ROOTS: set[tuple[str, str]] = set()


def register_trace_root(fn) -> None:
  """Note `fn` as a function the analysis traces a user's program through:
  a stack that starts with it is a trace of the whole program."""
  code = fn.__code__
  _TRACE_ROOTS.add((code.co_filename, getattr(code, 'co_qualname', code.co_name)))


# How many frames after the user's call line must agree for a body's trace
# to be taken as entered through that call (an API's wrapper and entry).
_CALL_ENTRY_FRAMES = 2


def frames_in_call(call: Sequence[Frame], inner: Sequence[Frame]) -> tuple[Frame, ...]:
  """The frames of an equation traced inside a call: the call's own frames
  up to its last line of user code, then `inner`'s frames below the point
  where its trace entered the same call.

  `inner` was traced through the same user functions as `call` (lines may
  differ where a cached trace came from another call) and entered the call
  through the same library frames; otherwise it says nothing of this call
  and `call`'s frames stand. An `inner` traced on its own, its stack
  starting elsewhere than at a trace of the whole program
  (``register_trace_root``), holds only frames inside the call."""
  call_users = [i for i, f in enumerate(call) if not is_library_file(f[0])]
  if not call_users:
    return tuple(inner)
  inner_users = [i for i, f in enumerate(inner) if not is_library_file(f[0])]
  if inner_users and inner[0][0::2] not in _TRACE_ROOTS and not (
      {f[0::2] for f in call} & {inner[i][0::2] for i in inner_users}):
    # A stack that does not start at a trace of the whole program, sharing
    # no user function with the call: the body was traced again on its own
    # (a remat rule retracing its body, Flax's lifted remat under nn.scan),
    # its stack starting at the body, so its user frames all lie inside the
    # call. A body cached from another call of the program (a jitted relu
    # traced at the stem) starts at the program's trace, and says nothing
    # of this call.
    return (*call[:call_users[-1] + 1], *inner)
  if len(inner_users) < len(call_users):
    return tuple(call)
  if any(call[i][0::2] != inner[j][0::2] for i, j in zip(call_users, inner_users)):
    return tuple(call)
  last_call, last_inner = call_users[-1], inner_users[len(call_users) - 1]
  entry = [f[0::2] for f in call[last_call + 1:last_call + 1 + _CALL_ENTRY_FRAMES]]
  entered = [f[0::2] for f in inner[last_inner + 1:last_inner + 1 + len(entry)]]
  if entry != entered:
    return tuple(call)
  return (*call[:last_call + 1], *inner[last_inner + 1:])


def site_of(frame: Frame) -> CodeSite:
  file, line, function = frame
  return CodeSite(relative_path(file), line, function)


def relative_path(path: str) -> str:
  """How a file is shown: a notebook cell as ``In [12]``, a module by its
  path under the ``sys.path`` entry it is imported from, another file
  under the working directory relative to it, any other file as it is."""
  number = cell_number(path)
  return _relative_path(path) if number is None else cell_label(number)


@functools.lru_cache(maxsize=4096)
def _relative_path(path: str) -> str:
  """A module's file as its import names it (``recurrentgemma/jax/
  layers.py``, wherever the package is installed, editable or not);
  another file relative to the deepest of the working directory and the
  ``sys.path`` entries that holds it; else as it is."""
  real = os.path.realpath(path)
  module = _module_names().get(real)
  if module is not None:
    shown = module.replace('.', os.sep) + (
        os.sep + '__init__.py' if os.path.basename(real) == '__init__.py' else '.py')
  else:
    roots = {os.path.realpath(p or os.curdir) for p in (os.curdir, *sys.path)}
    holding = [r for r in roots if real.startswith(r.rstrip(os.sep) + os.sep)]
    shown = os.path.relpath(real, max(holding, key=len)) if holding else path
  if shown != real:
    # Two files shown alike: neither is named in full.
    _FULL_PATHS[shown] = real if _FULL_PATHS.get(shown, real) == real else None
  return shown


_FULL_PATHS: dict[str, str | None] = {}
"""Each file shown shortened (``relative_path``) -> its real path; None
where two files are shown alike."""


def full_path(source: str) -> str | None:
  """A source line (``file:line (function)``, as the views give it) with
  its file's real path in full, where the views show the file shortened;
  None for a notebook cell, a file shown in full, or one not seen here.

  Example:
    >>> import os
    >>> from remat_explorer.analysis.source.origins import relative_path
    >>> shown = relative_path(os.path.abspath('model.py'))
    >>> shown, full_path(f'{shown}:12 (loss)') == os.path.realpath('model.py') + ':12 (loss)'
    ('model.py', True)
  """
  file = source.rsplit(' (', 1)[0].rsplit(':', 1)[0]
  path = _FULL_PATHS.get(file)
  return None if path is None else path + source[len(file):]


def _module_names() -> dict[str, str]:
  """The real path of each imported module's ``.py`` file -> its name:
  read again only once more modules are imported (a read resolves a
  thousand paths)."""
  global _names_read
  if _names_read[0] != len(sys.modules):
    found = {}
    for name, module in list(sys.modules.items()):
      file = getattr(module, '__file__', None)
      if name != '__main__' and isinstance(file, str) and file.endswith('.py'):
        found.setdefault(os.path.realpath(file), name)
    _names_read = (len(sys.modules), found)
  return _names_read[1]


_names_read: tuple[int, dict[str, str]] = (-1, {})


def entry_function(call_eqn, body) -> str | None:
  """The user's function a call runs (a remat block's): the first frame of
  the user's code that its body's equations were traced in and its call
  site was not. A framework's wrappers in between are skipped, so a Flax
  module's block is named by its ``__call__``'s class (``Block``), and so
  is a lambda that calls it."""
  outside = set(user_frames(call_eqn.source_info.traceback))
  counts: dict[str, int] = {}
  for eqn in body.eqns:
    inside = [f for f in user_frames(eqn.source_info.traceback) if f not in outside]
    # A lambda has no name to give (``hk.remat(lambda x: Block()(x))``):
    # the function it calls names the block, or the library's module it
    # calls (``hk.remat(lambda x: hk.nets.MLP(...)(x))`` is ``MLP``).
    named = next((f for f in inside if not f[2].endswith('<lambda>')), None)
    if inside:
      frame = named or _method_called_from(eqn, inside[-1]) or inside[0]
      counts[frame[2]] = counts.get(frame[2], 0) + 1
  if not counts:
    # A body that only runs a library's loop (Flax's ``nn.remat_scan``, a
    # remat block around a scan over the layers): the loop's body names it.
    return next((name for eqn in body.eqns for sub in jaxprs_in_params(eqn.params)
                 if (name := entry_function(call_eqn, sub)) is not None), None)
  return display_name(max(counts, key=counts.get))


def _method_called_from(eqn, caller: Frame) -> Frame | None:
  """The first method call below `caller` on the way to `eqn`, a
  library's included (JAX's aside)."""
  frames = frames_of(eqn.source_info.traceback)
  below = frames[frames.index(caller) + 1:] if caller in frames else ()
  return next((f for f in below if is_method(f[2]) and not is_jax_file(f[0])), None)


def display_name(qualname: str) -> str:
  """``Model.__call__.<locals>.run`` -> ``run``; ``Block.__call__`` ->
  ``Block``: a function as its user would name it."""
  return qualname.rsplit('<locals>.', 1)[-1].removesuffix('.__call__')


# -- name stacks -----------------------------------------------------------------

_WRAPPER = re.compile(r'^[A-Za-z_]\w*\((.*)\)$')


def clean_scope(name_stack) -> str:
  """A name stack as a module path: JAX's transformation wrappers
  (``jvp(...)``, ``transpose(...)``, ``vmap(...)``), the recompute's
  ``rematted_computation`` scope and ``jnp.einsum``'s (its spec,
  ``...hqk,h->...hqk``) removed.

  The backward pass of a remat block names the transposed call's scopes
  and then the recompute's own, from the model's root again
  (``transpose(jvp(Model))/encoder/jvp(Model)/encoder/checkpoint/...``):
  where a wrapped root comes back, the path starts there."""
  parts, roots = [], {}
  for part in _split_scopes(str(name_stack)):
    wrapped = False
    while (m := _WRAPPER.match(part)) and _balanced(m.group(1)):
      part, wrapped = m.group(1), True
    if wrapped and part in roots:
      del parts[roots[part]:]
    if wrapped:
      roots.setdefault(part, len(parts))
    for inner in _split_scopes(part):
      if inner and not is_engine_scope(inner) and '->' not in inner:
        parts.append(inner)
  return '/'.join(parts)


def join_scopes(outer: str, inner: str) -> str:
  return '/'.join(p for p in (outer, inner) if p)


def _split_scopes(text: str) -> list[str]:
  parts, depth, start = [], 0, 0
  for i, c in enumerate(text):
    depth += {'(': 1, ')': -1}.get(c, 0)
    if c == '/' and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  parts.append(text[start:])
  return [p for p in parts if p]


def _balanced(text: str) -> bool:
  depth = 0
  for c in text:
    depth += {'(': 1, ')': -1}.get(c, 0)
    if depth < 0:
      return False
  return depth == 0


# Call-like primitives: the parameter that holds the body whose inputs and
# outputs are the equation's, in order (None: a call without one to read).
CALL_PRIMITIVES = {
    'jit': 'jaxpr', 'pjit': 'jaxpr', 'checkpoint': 'jaxpr', 'remat2': 'jaxpr',
    'closed_call': 'call_jaxpr', 'core_call': 'call_jaxpr', 'call': 'call_jaxpr',
    'custom_jvp_call': 'call_jaxpr', 'custom_vjp_call': 'call_jaxpr',
    'custom_vjp_call_jaxpr': 'fun_jaxpr', 'custom_lin': None,
}


def call_body(eqn, custom: bool = True):
  """The jaxpr of a call-like equation (``CALL_PRIMITIVES``) whose inputs
  and outputs are the equation's in order, or None. With `custom` False,
  custom-derivative calls (whose rules are the user's) are not entered."""
  name = eqn.primitive.name
  if not custom and name.startswith('custom_'):
    return None
  body = eqn.params.get(CALL_PRIMITIVES.get(name) or '')
  body = getattr(body, 'jaxpr', body)  # a ClosedJaxpr's jaxpr
  if (not isinstance(body, Jaxpr) or body.constvars
      or len(body.invars) != len(eqn.invars)
      or len(body.outvars) != len(eqn.outvars)):
    return None
  return body


# Per program (tracebacks) or per working directory (relative paths).
cleared_with_results(_frames, _relative_path, is_library_file, is_jax_file)
