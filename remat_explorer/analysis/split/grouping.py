"""Where an equation sits in the user's terms, for the split diagram's
boxes: the module of the user's model (its path, read from the parameters
it uses), the user's own calls inside it, and the library function that
made it (``gelu``, ``softmax``), inside the user's group that called it.
"""

from __future__ import annotations

import re

from remat_explorer.analysis.source.origins import (clean_scope, display_name, frames_in_call,
                                             frames_of, is_jax_file, is_library_file,
                                             is_method, join_scopes)
from remat_explorer.analysis.split.report import BlockReport


class Grouping:
  """Where an equation sits in the user's terms, below its block.

  Where the program's parameters name modules, by module: its module path
  relative to the block's (``('attention', 'query')``, shown as the full
  path ``blocks/attention/query``); below the innermost module, the user's
  own calls it runs in (a module without parameters, by its class; a
  helper function, by its name). Else, where the block's code names its
  parts with ``jax.named_scope``, by those scopes (``mlp/up``), and the
  equations outside every scope by function; else by the user's functions
  the block calls on the way to it (the same function called from two
  lines is two groups, ``_layer_norm @158`` and ``_layer_norm @161``). Inside either,
  the equations a library function made (``gelu``, ``softmax``) are
  grouped by that function, inside the group that called it (at the
  block's top where the block's own code called it)."""

  def __init__(self, block: BlockReport, module_paths):
    self.block_path = [p for p in block.module_path.split('/') if p]
    self.entry = block.function
    self.paths = module_paths
    # Group by module where the block's equations are in modules below its own.
    self.by_module = module_paths is not None and any(
        len([p for p in module_paths.of(e).split('/') if p]) > len(self.block_path)
        for jaxpr in (block.known_jaxpr, block.staged_jaxpr) for e in jaxpr.eqns)
    self.by_scope = not self.by_module and any(
        _named_scopes(e, None) for jaxpr in (block.known_jaxpr, block.staged_jaxpr)
        for e in jaxpr.eqns)
    self._sites: dict[str, set[int]] = {}

  def of(self, eqn, context) -> tuple[str, tuple]:
    """(module path, raw group): the group's parts are ``('module', name,
    path, class)``, ``('call', function, line it was called from)`` or
    ``('library', function)``, made ids and titles by ``names``."""
    module_path = '' if self.paths is None else self.paths.of(eqn)
    if not module_path and context is not None and self.paths is not None:
      module_path = self.paths.of(context)
    frames = frames_of(eqn.source_info.traceback)
    if context is not None:
      frames = frames_in_call(frames_of(context.source_info.traceback), frames)
    if self.by_module:
      modules = self.paths.method_paths(frames)
      classes = {path: display_name(frames[i][2]) for i, path in sorted(modules.items())
                 if frames[i][2].endswith('.__call__')}
      parts = [p for p in module_path.split('/') if p]
      # Flax Linen names every module's scope, those without parameters
      # too: where the scope goes deeper than the parameters tell, it is the
      # module path, and the user's methods below are those modules.
      scopes = _named_scopes(eqn, context)
      named_deeper = len(scopes) > len(parts) and scopes[:len(parts)] == parts
      if named_deeper:
        parts, module_path = scopes, '/'.join(scopes)
      inside = parts[:len(self.block_path)] == self.block_path
      depth = len(self.block_path)
      paths = ['/'.join(parts[:depth + k + 1]) for k in range(len(parts) - depth)]
      group = tuple(('module', p, path, classes.get(path, ''))
                    for p, path in zip(parts[depth:], paths)) if inside else ()
      # The user's calls below the innermost module call.
      group += self._calls(frames, below=max(modules, default=-1), methods=not named_deeper)
      if not group:
        group = _library_module(frames, below=max(modules, default=-1))
    elif self.by_scope and (scopes := _named_scopes(eqn, context)):
      group = tuple(('module', p, '/'.join(scopes[:k + 1]), '')
                    for k, p in enumerate(scopes))
    else:
      group = self._calls(frames, below=-1)
    # A library function's equations are one box inside the group that
    # called it: the block itself when the block's own code called it (a
    # gelu as one box, not its twenty primitives).
    library = _library_function(eqn, context)
    if library and (not group or group[-1][1] != library):
      group = (*group, ('library', library))
    return module_path, group

  def _calls(self, frames, below: int, methods: bool = True) -> tuple:
    """The user's function calls after the block's entry and after frame
    index `below` (with `methods` False, not modules' methods), as
    ``('call', name, line called from)``; lambdas and comprehensions are
    part of the function around them."""
    users = [(i, f) for i, f in enumerate(frames) if not is_library_file(f[0])]
    names = [display_name(f[2]) for _, f in users]
    start = names.index(self.entry) + 1 if self.entry in names else 0
    parts = []
    for k in range(start, len(users)):
      i, frame = users[k]
      name = names[k]
      if i <= below or name.startswith('<') or (not methods and is_method(frame[2])):
        continue
      line = users[k - 1][1][1] if k > 0 else 0
      self._sites.setdefault(name, set()).add(line)
      parts.append(('call', name, line))
    return tuple(parts)

  def names(self, group: tuple) -> dict[str, tuple[str, ...]]:
    """The group's ids and titles (``GraphNode.group``, ``group_titles``): a
    function called from several lines of the block gets the line it was
    called from."""
    ids, titles, classes = [], [], []
    for kind, name, *where in group:
      if kind == 'call' and len(self._sites.get(name, ())) > 1:
        name = f'{name} @{where[0]}'
      ids.append(name)
      titles.append(where[0] if kind == 'module' else name)
      classes.append(where[1] if kind == 'module' else '')
    return dict(group=tuple(ids), group_titles=tuple(titles), group_classes=tuple(classes))


# A scope the user named: not an einsum's (``bd,de->be``), nor a library's
# (Equinox names its modules' scopes ``eqx.nn.Linear``).
_USER_SCOPE = re.compile(r'[A-Za-z_][\w-]*')


def _named_scopes(eqn, context) -> list[str]:
  """The ``jax.named_scope`` names `eqn` runs in, outermost first, inside
  its block (within a call, the call's own scopes first)."""
  scope = clean_scope(eqn.source_info.name_stack)
  if context is not None:
    scope = join_scopes(clean_scope(context.source_info.name_stack), scope)
  return [p for p in scope.split('/') if _USER_SCOPE.fullmatch(p)]


def _library_module(frames, below: int) -> tuple:
  """A library's module without parameters that the user's code called
  (``nnx.RMSNorm(use_scale=False)``), as a group by its class: the frame
  after the user's last one is its ``__call__``."""
  users = [i for i, f in enumerate(frames) if not is_library_file(f[0])]
  if not users or users[-1] + 1 >= len(frames) or users[-1] + 1 <= below:
    return ()
  file, _, function = frames[users[-1] + 1]
  # JAX's own callables (``jnp.maximum`` is a ``ufunc``) are not modules.
  if (not function.endswith('.__call__') or '<' in function or function.startswith('_')
      or is_jax_file(file)):
    return ()
  return (('call', display_name(function), frames[users[-1]][1]),)


def _library_function(eqn, context) -> str | None:
  """The library function (``gelu``, ``softmax``) the user's code called
  to make `eqn`, when it is a public one; operators and JAX's internals
  are not."""
  for source in (eqn, context):
    if source is None:
      continue
    frames = frames_of(source.source_info.traceback)
    users = [i for i, f in enumerate(frames) if not is_library_file(f[0])]
    if not users or users[-1] + 1 >= len(frames):
      continue
    function = frames[users[-1] + 1][2]
    # A module's method (Linear.__call__) is already its module's group;
    # private helpers and operators say nothing to the user.
    if '.' in function or '<' in function or function.startswith('_') or function == 'bind':
      return None
    return function
  return None


def outside_group(r) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """The group of a residual saved outside blocks: its module path, else
  the user's function that computed it."""
  parts = [p for p in r.module_path.split('/') if p]
  if parts:
    return tuple(parts), tuple('/'.join(parts[:k + 1]) for k in range(len(parts)))
  if r.site is not None:
    name = display_name(r.site.function)
    return (name,), (name,)
  return (), ()
