"""Module paths read from the parameters an equation uses, for frameworks
that record no module names (Flax NNX, Equinox, plain JAX with parameter
pytrees): a matmul reading ``params['blocks']['attention']['query']['kernel']``
runs in module ``blocks/attention/query``, and the other equations of the
same call of a method (``Attention.__call__``) in the longest path all of
its parameters share (``blocks/attention``).
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Sequence

from jax.extend.core import Var

from remat_explorer.analysis.source.origins import (Frame, call_body, clean_scope, frames_of,
                                                    is_jax_file, is_method, join_scopes)

# Equations that only move or reshape a parameter: what they give is still
# the parameter (a slice of a stacked one under scan, a cast, ...).
_VIEWS = frozenset('''reshape squeeze expand_dims broadcast_in_dim convert_element_type
  transpose copy copy_p slice dynamic_slice device_put sharding_constraint
  reduce_precision'''.split())
_LEAF_WRAPPERS = ('value', 'raw_value')
# Flax Linen's variable collections: ``variables['params']['blocks']`` is
# the module ``blocks``, the path Flax's own name stack and the
# ``params`` argument alone give it.
_COLLECTIONS = ('params', 'batch_stats', 'cache', 'intermediates')
# Haiku names a parameter by its module path in one key
# (``params['__layer_stack_no_per_layer/block/query']['w']``), with parts
# its name stack, and so XLA's program, does not hold: the module
# ``hk.layer_stack`` adds, which the model never names, and the ``~`` that
# marks a module made inside its parent's method (``mlp/~/linear_0`` is
# ``mlp/linear_0`` in the name stack).
_WRAPPER_MODULES = ('__layer_stack_no_per_layer', '__layer_stack_with_per_layer', '~')


def path_components(arg_name: str) -> tuple[str, ...]:
  """``params['blocks'][0].kernel.value`` -> ``('params', 'blocks', '0',
  'kernel', 'value')``: the keys of a pytree path as JAX prints it."""
  return tuple(m.group(1) or m.group(2) or m.group(3) for m in
               re.finditer(r"\['([^']*)'\]|\[(\d+)\]|\.?([A-Za-z_]\w*)", arg_name))


def module_of_parameter(arg_name: str) -> str:
  """The module path of a parameter: its path without the argument's own
  name, the array's key (``kernel``, ``weight``) and value wrappers."""
  parts = list(path_components(arg_name))[1:]
  while parts and parts[-1] in _LEAF_WRAPPERS:
    parts.pop()
  if len(parts) > 1 and parts[0] in _COLLECTIONS:
    parts = parts[1:]
  return '/'.join(module for part in parts[:-1] for module in part.split('/')
                  if module not in _WRAPPER_MODULES)


def _common_path(paths: Iterable[str]) -> str:
  split = [p.split('/') for p in paths]
  if not split:
    return ''
  common = os.path.commonprefix(split)
  return '/'.join(common)


def _calls(frames: Sequence[Frame]) -> list[tuple]:
  """The method calls an equation runs inside, outermost first: each one
  identified by the call sites leading to it and the method itself, so
  that two calls of one method from different lines differ. JAX's own
  methods (``ufunc.__call__``, ...) are not a model's modules."""
  return [key for _, key in _indexed_calls(frames)]


def _indexed_calls(frames: Sequence[Frame]) -> list[tuple[int, tuple]]:
  """``_calls``, each with the index of its method's frame in `frames`."""
  found, sites = [], []
  for i, (file, line, function) in enumerate(frames):
    if is_jax_file(file):
      continue
    if is_method(function):
      found.append((i, (*sites, (file, function))))
    sites.append((file, line))
  return found


class ModulePaths:
  """Module paths of a program's equations, from the parameters they use.

  Built once from the program (before differentiation), it answers for any
  equation with the same traceback, such as the forward and backward
  copies differentiation makes of it.

  A line a Python loop runs once per layer (``for layer in self.layers:
  x = layer(x)``) has one traceback for every layer, equal but not the same
  object: by equality it answers the path the layers share
  (``encoder/layer``). Differentiation keeps an equation's traceback
  object, so by identity it answers the layer's own (``encoder/layer/0``):
  for an equation that reads parameters, their path; for one inside a body
  (a remat block, a ``jit``) that does not, the path of the parameters the
  body reads, where that is more precise than its line's.
  """

  def __init__(self, jaxpr, arg_names: Sequence[str]):
    self._by_call: dict[tuple, set[str]] = {}
    self._direct: dict[object, set[str]] = {}
    self._roots: set[str] = set()
    # id(traceback) -> (traceback, paths), for the parameters an equation
    # reads and for the body it runs in; the traceback kept alive, so that
    # its id is not reused while this object answers.
    self._reads: dict[int, tuple[object, set[str]]] = {}
    self._within: dict[int, tuple[object, set[str]]] = {}
    self._of_body: dict[int, tuple[object, set[str]]] = {}
    paths = {v: module_of_parameter(n) for v, n in zip(jaxpr.invars, arg_names)
             if n and module_of_parameter(n)}
    self._walk(jaxpr, paths)
    self._path_of_call = {k: _common_path(v) for k, v in self._by_call.items()}
    self._path_of_line = {k: _common_path(v) for k, v in self._direct.items()}
    self._top_modules = {p.split('/')[0] for p in (*paths.values(), *self._path_of_call.values())
                         if p}
    by_site: dict[tuple, set[str]] = {}
    for call, found in self._by_call.items():
      by_site.setdefault(call[-2:], set()).update(found)
    self._path_of_site = {k: _common_path(v) for k, v in by_site.items()}
    self._place(jaxpr, '')
    self._path_of_object = {k: (tb, _common_path(v))
                            for k, (tb, v) in (*self._within.items(), *self._reads.items())}

  def _walk(self, jaxpr, paths: dict, scope: str = '') -> set[str]:
    """Record the module paths each equation reads; return all of them.

    JAX records, for an equation inside a body (``jit``, ``scan``, ...),
    only the frames from the body's function down, and only the name
    stack from the body down (`scope` is the one above it); so what a
    body reads is also recorded for the method calls of the equation
    holding it."""
    read_here: set[str] = set()
    for eqn in jaxpr.eqns:
      here = join_scopes(scope, clean_scope(eqn.source_info.name_stack))
      read = {paths[v] for v in eqn.invars if isinstance(v, Var) and v in paths}
      if eqn.primitive.name in _VIEWS and len(read) == 1:
        paths.update((o, next(iter(read))) for o in eqn.outvars)
        continue
      subs = _sub_programs(eqn)
      inside = set()
      for body, body_inputs in subs:
        inner = {b: paths[o] for b, o in zip(body.invars, body_inputs)
                 if isinstance(o, Var) and o in paths}
        inside |= self._walk(body, inner, here)
      tb = eqn.source_info.traceback
      if read and not subs and tb is not None:
        self._direct.setdefault(tb, set()).add(_common_path(read))
        self._reads.setdefault(id(tb), (tb, set()))[1].add(_common_path(read))
        self._note_root(here, _common_path(read))
      for body, _ in subs:  # one body may be traced once and called for several layers
        self._of_body.setdefault(id(body), (body, set()))[1].add(_common_path(inside))
      found = inside if subs else ({_common_path(read)} if read else set())
      if found and tb is not None:
        for call in _calls(frames_of(tb)):
          self._by_call.setdefault(call, set()).update(found)
      read_here |= found
    return read_here

  def _place(self, jaxpr, within: str) -> None:
    """Give each equation inside a body that reads no parameters the path
    of the parameters the body reads (`within`), where its line's path is
    coarser: the loop's line above, not the layer's."""
    for eqn in jaxpr.eqns:
      tb = eqn.source_info.traceback
      if within and tb is not None and id(tb) not in self._reads:
        shared = self._shared_path(tb)
        if not shared or within.startswith(shared + '/'):
          self._within.setdefault(id(tb), (tb, set()))[1].add(within)
      for body, _ in _sub_programs(eqn):
        self._place(body, self.of_body(body) or within)

  def of_body(self, body) -> str:
    """The path of the parameters a body of the program (a remat block's)
    reads: the path its calls share, where JAX traced it once for several
    layers; '' for a body the program does not hold."""
    known = self._of_body.get(id(body))
    return _common_path(known[1]) if known is not None and known[0] is body else ''

  def of(self, eqn) -> str:
    """The module path of `eqn` (or of any equation with its traceback);
    '' when its parameters say nothing."""
    tb = eqn.source_info.traceback
    if tb is None:
      return ''
    exact = self._path_of_object.get(id(tb))
    if exact is not None and exact[0] is tb:
      return exact[1]
    return self._shared_path(tb)

  def _shared_path(self, tb) -> str:
    """The path of every equation with a traceback equal to `tb`."""
    if tb in self._path_of_line:
      return self._path_of_line[tb]
    for call in reversed(_calls(frames_of(tb))):
      if self._path_of_call.get(call):
        return self._path_of_call[call]
    return ''

  def _note_root(self, scope: str, path: str) -> None:
    """Where a name stack ends in the module path of the parameters its
    equation reads, what comes before is the model's root (Linen's root
    class: ``LinenModel/blocks/qkv`` for ``blocks/qkv``)."""
    if path and scope.endswith('/' + path):
      self._roots.add(scope[:-len(path) - 1])

  def of_scope(self, scope: str) -> str:
    """A name stack in the parameters' terms: from its first part that is
    a top-level module of the parameters (``LinenModel/blocks/mlp`` ->
    ``blocks/mlp``, as ``of`` names the module); as it is where none is."""
    parts = [p for p in scope.split('/') if p]
    for i, part in enumerate(parts):
      if part in self._top_modules:
        return '/'.join(parts[i:])
    for root in self._roots:
      if scope == root or scope.startswith(root + '/'):
        return scope[len(root) + 1:]
    return scope

  def of_stack(self, frames: Sequence[Frame], scope: str = '') -> str:
    """The module path of a compiled instruction, from the stack and name
    stack XLA records for it, the same string ``of`` gives the equation it
    was lowered from: its innermost method call that reads parameters,
    else `scope` in the parameters' terms.

    XLA's stack starts elsewhere than the traced one (at the compile, or
    at a loop body's function), so a method call is matched by its own
    call site where the whole chain differs."""
    calls = self.method_paths(frames)
    found = calls[max(calls)] if calls else None
    if found is None:
      found = next((self._path_of_site[key[-2:]] for key in reversed(_calls(frames))
                    if key[-2:] in self._path_of_site), None)
    scoped = self.of_scope(scope)
    # A line a loop runs for every layer answers the path they share; the
    # name stack (Flax Linen's module names) may say which layer.
    return scoped if not found or scoped.startswith(found + '/') else found

  def method_paths(self, frames: Sequence[Frame]) -> dict[int, str]:
    """For the frames of a call stack (outermost first), the module path of
    each method call among them that reads parameters, by frame index
    ('' for the model's root): which of the user's calls are modules, and
    which modules they are."""
    return {i: self._path_of_call[call] for i, call in _indexed_calls(frames)
            if call in self._path_of_call}


def _sub_programs(eqn) -> list[tuple]:
  """(jaxpr, the outer atoms its inputs are) for the bodies of an equation
  whose inputs map onto its body's one to one."""
  params, name = eqn.params, eqn.primitive.name
  if name == 'scan':  # consts, carry and xs, in order (xs sliced per step)
    return [(params['jaxpr'].jaxpr, eqn.invars)]
  if name == 'cond':
    return [(b.jaxpr, eqn.invars[1:]) for b in params['branches']]
  if name == 'while':
    nc, nb = params['cond_nconsts'], params['body_nconsts']
    return [(params['body_jaxpr'].jaxpr, eqn.invars[nc:nc + nb] + eqn.invars[nc + nb:])]
  body = call_body(eqn)
  return [] if body is None else [(body, eqn.invars)]
