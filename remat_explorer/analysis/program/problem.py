"""The problem ``analyze`` and ``compile_costs`` solve: a function, its
example arguments, which of them are differentiated, and the program with its
remat blocks found and their policies set.

The program is the user's, unchanged: a function without a remat block is
analysed as it is (the figures without remat), and is checkpointed as a
whole only when asked (a policy given, or ``whole_function=True``), which
the report then says. Arguments are taken as ``eqx.filter_jit`` takes them:
arrays are traced, every other leaf (a Python number or bool, a string, a
function inside an Equinox module) is held as it is; a positional argument
that is itself a number and is differentiated (``analyze(f, 3.0)``) is
traced, as ``jax.grad`` takes it. ``has_aux=True`` means
what it means for ``jax.value_and_grad``. A function that differentiates
itself (a training step) is refused with the loss to pass instead.

Bad input (including arguments placed on different devices) is refused
here, with the reason, before anything else is traced.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import jax
from jax.extend import core
import numpy as np

from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.source.origins import (display_name, register_trace_root,
                                                     user_frames)
from remat_explorer.analysis.program.blocks import NO_REMAT, check_block_names, find_blocks
from remat_explorer.analysis.program.devices import check_one_device_set
from remat_explorer.engine import (TRANSPOSE_SCOPE, checkpoint, debug_info_of,
                                    enclosing_strategy)


_TRACED = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)
_programs = ResultCache(max_entries=32)


class Problem:
  """A function with its example arguments, flattened and checked."""

  def __init__(self, f, name, leaves, traced, in_tree, diff_mask, arg_names, argnums,
               has_aux, whole_function, arg_starts):
    self.f, self.name, self.in_tree = f, name, in_tree
    self._arg_starts = arg_starts
    self.leaves = [x for x, t in zip(leaves, traced) if t]
    """The traced leaves (arrays), in order."""
    self.template = [None if t else x for x, t in zip(leaves, traced)]
    """Every leaf of (args, kwargs), the traced ones replaced with None."""
    self.diff_mask, self.argnums = diff_mask, argnums
    self.has_aux, self.whole_function = has_aux, whole_function
    self.diff_leaves = [x for x, d in zip(self.leaves, diff_mask) if d]
    self.other_leaves = [x for x, d in zip(self.leaves, diff_mask) if not d]
    self.arg_names = tuple(arg_names)
    """JAX's name of each traced leaf, e.g. ``params['blocks']['w']``."""
    self.diff_names = tuple(n for n, d in zip(arg_names, diff_mask) if d)
    self.other_names = tuple(n for n, d in zip(arg_names, diff_mask) if not d)
    self.num_outputs = None
    """Output leaves that are differentiated (the loss's, with has_aux);
    the rest are auxiliary. Known once the program is traced."""
    self._traced = None

  @classmethod
  def make(cls, f, args, kwargs, argnums=0, *, has_aux: bool = False,
           whole_function: bool = False, caller: str = 'analyze') -> 'Problem':
    check_function(f, caller)
    check_has_aux(has_aux)
    argnums = check_positions(argnums, len(args), 'argnums')
    leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
    paths = [('args' if p[0].idx == 0 else 'kwargs') + jax.tree_util.keystr(p[1:])
             for p, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
    per_arg = [len(jax.tree_util.tree_leaves(a)) for a in args]
    starts = np.cumsum([0, *per_arg])
    traced = [isinstance(x, _TRACED) for x in leaves]
    for i in argnums:  # a number passed to be differentiated, as jax.grad takes it
      if per_arg[i] == 1 and _is_number(leaves[starts[i]]):
        traced[starts[i]] = True
    check_one_device_set([p for p, t in zip(paths, traced) if t],
                         [x for x, t in zip(leaves, traced) if t])
    in_argnums = np.zeros(len(leaves), bool)
    for i in argnums:
      in_argnums[starts[i]:starts[i + 1]] = True
    diff_mask = [bool(d) and _is_float(x)
                 for x, d, t in zip(leaves, in_argnums, traced) if t]
    if not any(diff_mask):
      selected = [f'{paths[j]}: {_kind(leaves[j])}' for i in argnums
                  for j in range(starts[i], starts[i + 1])]
      raise TypeError(
          f'argnums={argnums} selects no floating-point array of '
          f'{function_name(f)!r} to differentiate (selected leaves: '
          f'{", ".join(selected) or "none"}). Pass argnums= naming the '
          'arguments that hold the parameters; a Python number is held as a '
          'constant, as eqx.filter_jit does: pass jnp.asarray(x) to '
          'differentiate it.')
    dbg = debug_info_of(caller, f, args, kwargs)
    names = tuple(dbg.arg_names or ('',) * len(leaves))
    if len(names) != len(leaves):
      names = ('',) * len(leaves)
    names = tuple(n for n, t in zip(names, traced) if t)
    return cls(f, function_name(f), leaves, traced, in_tree, diff_mask, names, argnums,
               has_aux, whole_function, tuple(int(x) for x in starts))

  # -- the program ----------------------------------------------------------------

  def flat_function(self):
    """The function of the traced leaves alone, returning its output leaves
    (the differentiated ones first)."""
    def flat(*leaves):
      given = iter(leaves)
      all_leaves = [next(given) if x is None else x for x in self.template]
      args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, all_leaves)
      out = self.f(*args, **kwargs)
      if self.has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
          raise TypeError(
              f'has_aux=True expects {self.name!r} to return a pair (output, '
              f'aux), as jax.value_and_grad does, but it returned '
              f'{_short(out)}.')
        loss, aux = out
        loss_leaves, aux_leaves = jax.tree_util.tree_leaves(loss), jax.tree_util.tree_leaves(aux)
      else:
        loss_leaves, aux_leaves = jax.tree_util.tree_leaves(out), []
        _refuse_python_numbers(self.name, out)
      self.num_outputs = len(loss_leaves)
      self._output = out
      return [*loss_leaves, *aux_leaves]
    flat.__name__ = self.name
    register_trace_root(flat)
    return flat

  def traced(self) -> core.ClosedJaxpr:
    """The user's program as a jaxpr; a function jitted at the top with no
    shardings or donations is its inner function. Traced once for every
    call on the same function and arguments (as ``jax.jit`` traces once):
    each policy a comparison or a search tries reads the same trace."""
    if self._traced is None:
      key = self.cache_key('program')
      found = _programs.get(key)
      if found is None:
        closed = jax.make_jaxpr(self.flat_function())(*self.leaves)
        closed = _inline_plain_jit(closed)
        refuse_if_it_differentiates(closed, self.name)
        found = closed, self.num_outputs, self._output
        _programs.put(key, found)
      self._traced, self.num_outputs, self._output = found
      self._refuse_unmarked_aux()
    return self._traced

  def program_with_blocks(self, policy, lowering):
    """(program, blocks, notes): the program with every remat block ours
    and their policies set, and what was done to it, in words.

    A program without a remat block is analysed as written, unless a policy
    is given for it or ``whole_function`` is set: then it is checkpointed
    as one block named after the function."""
    closed = self.traced()
    program, blocks = find_blocks(closed, policy, lowering)
    wants_one_block = self.whole_function or (policy is not None and policy is not NO_REMAT)
    if blocks or not wants_one_block:
      check_block_names(policy, blocks)
      notes = [] if blocks else [
          f'{self.name} has no remat block (checkpoint, jax.checkpoint, '
          'nn.remat, ...), so these are its figures without remat; pass a '
          'policy (or whole_function=True) to checkpoint it as a whole.']
      return program, blocks, notes
    run = core.jaxpr_as_fun(closed)
    run.__name__ = self.name
    whole = checkpoint(run, policy=policy if callable(policy) else None)
    program, blocks = find_blocks(jax.make_jaxpr(whole)(*self.leaves), policy,
                                  lowering)
    check_block_names(policy, blocks, whole_function=True)
    why = 'whole_function=True' if self.whole_function else 'a policy was given'
    notes = [f'{self.name} has no remat block of its own; it was checkpointed '
             f'as a whole, as one block, because {why}.']
    return program, blocks, notes

  def program_function(self, program, blocks):
    """The function to differentiate: the user's own where nothing in its
    program was changed (no remat block to set), so that the figures are
    exactly what differentiating it with JAX gives; the rewritten program
    otherwise."""
    if not blocks:
      return self.flat_function()
    return core.jaxpr_as_fun(program)

  def _refuse_unmarked_aux(self) -> None:
    """Refuse (loss, aux) returned without has_aux, before anything
    compiles: both would be differentiated, a ones cotangent each, and
    every figure would be that of another program than the user trains."""
    out = self._output
    if (not self.has_aux and isinstance(out, (tuple, list)) and len(out) == 2
        and getattr(out[0], 'shape', None) == ()):
      raise TypeError(
          f'{self.name} returns a pair whose first element is a scalar, (loss, aux) '
          'as jax.value_and_grad(..., has_aux=True) takes it: pass has_aux=True, '
          'or return the loss alone (or a tuple of other length) to differentiate '
          'every output.')

  # -- bookkeeping -------------------------------------------------------------------

  def cache_key(self, *settings):
    """A key for results on this problem under `settings` (policy, ...):
    everything that changes the answer: the function, argument
    shapes/dtypes/shardings and held values, what is differentiated, aux,
    the device, the mesh set with ``jax.set_mesh`` and the enclosing
    ``lowering_strategy``; None if some part is unhashable."""
    key = (self.f, self.in_tree, tuple(map(_leaf_key, self.leaves)),
           tuple(_held_key(x) for x in self.template), self.argnums,
           self.has_aux, self.whole_function, str(jax.devices()[0]),
           str(jax.sharding.get_abstract_mesh()), enclosing_strategy(),
           *map(_hashable_setting, settings))
    try:
      hash(key)
    except TypeError:
      return None
    return key

  def traced_positions(self, argnums: Sequence[int]) -> tuple[int, ...]:
    """Positions among the traced leaves of the leaves of these positional
    arguments."""
    traced_index = np.cumsum([x is None for x in self.template]) - 1
    return tuple(int(traced_index[j]) for i in argnums
                 for j in range(self._arg_starts[i], self._arg_starts[i + 1])
                 if self.template[j] is None)

  def merge(self, diff_leaves, other_leaves):
    diff, other = iter(diff_leaves), iter(other_leaves)
    return [next(diff) if d else next(other) for d in self.diff_mask]


# -- checks ----------------------------------------------------------------------------

def check_function(f, caller: str) -> None:
  if callable(f):
    return
  raise TypeError(
      f'{caller} expects the function to analyze as its first argument, but '
      f'got {_short(f)}. Call it as {caller}(loss_fn, *example_args).')


def check_has_aux(has_aux) -> None:
  if not isinstance(has_aux, bool):
    raise TypeError(f'has_aux must be True or False, got {has_aux!r}.')


def check_positions(positions, num_args, name: str,
                    allow_empty: bool = False) -> tuple[int, ...]:
  """Positional-argument indices (an int or a sequence of ints; negative
  ones count from the end), sorted and made non-negative; a clear error
  naming `name` for anything else or a position out of range."""
  if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
    positions = (int(positions),)
  elif (isinstance(positions, Sequence) and not isinstance(positions, str)
        and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                for i in positions)):
    positions = tuple(int(i) for i in positions)
  else:
    raise TypeError(
        f'{name} must be an int or a sequence of ints (positions of '
        f'positional arguments), got {_short(positions)}.')
  if ((not positions and not allow_empty)
      or not all(-num_args <= i < num_args for i in positions)):
    raise ValueError(
        f'{name}={positions} is out of range for {num_args} positional '
        f'argument(s); use positions between 0 and {num_args - 1}.')
  return tuple(sorted({i % num_args for i in positions}))


def donated_positions(donate_argnums, args) -> tuple[int, ...]:
  """``donate_argnums`` as ``jax.jit`` takes it (none is fine), checked
  against the positional `args` and made non-negative."""
  return check_positions(donate_argnums, len(args), 'donate_argnums', allow_empty=True)


def refuse_if_it_differentiates(closed: core.ClosedJaxpr, name: str) -> None:
  """A training step already runs a backward pass; analysing it would
  differentiate it again (second-order residuals). Say which loss to pass."""
  backward = _equation_in_scope(closed.jaxpr, TRANSPOSE_SCOPE)
  if backward is None:
    return
  forward = _equation_in_scope(closed.jaxpr, 'jvp(') or backward
  loss = _differentiated_function(forward, name)
  raise ValueError(
      f'{name} already differentiates: its program runs a backward pass '
      f'(JAX scope {str(backward.source_info.name_stack)!r}), as a training '
      'step does. The explorer differentiates the function it is given, so '
      'this one would be differentiated twice. Pass the function it '
      'differentiates instead'
      + (f', here {loss!r}, with its arguments' if loss
         else ', e.g. analyze(loss_fn, params, batch)') + '.')


def _equation_in_scope(jaxpr, marker: str):
  for eqn in jaxpr.eqns:
    if marker in str(eqn.source_info.name_stack):
      return eqn
    for sub in core.jaxprs_in_params(eqn.params):
      if (found := _equation_in_scope(sub, marker)) is not None:
        return found
  return None


def _differentiated_function(eqn, name: str) -> str | None:
  """The user's function that `eqn` was traced in, called from `name`'s
  frame: the loss a training step hands to ``jax.grad``."""
  frames = user_frames(eqn.source_info.traceback)
  for outer, inner in zip(frames, frames[1:]):
    if display_name(outer[2]) == name and display_name(inner[2]) != name:
      return display_name(inner[2])
  return None


def _inline_plain_jit(closed: core.ClosedJaxpr) -> core.ClosedJaxpr:
  """A function jitted at the top is one ``jit`` equation; without
  shardings or donations, the function inside is the program."""
  jaxpr = closed.jaxpr
  if len(jaxpr.eqns) != 1 or jaxpr.eqns[0].primitive.name not in ('jit', 'pjit'):
    return closed
  eqn = jaxpr.eqns[0]
  params = eqn.params
  plain = (not any(params.get('donated_invars', ()))
           and all(_unspecified(s) for s in (*params.get('in_shardings', ()),
                                             *params.get('out_shardings', ())))
           and list(eqn.invars) == list(jaxpr.invars)
           and list(eqn.outvars) == list(jaxpr.outvars))
  if not plain or closed.consts:
    return closed
  return params['jaxpr']


def _unspecified(sharding) -> bool:
  return type(sharding).__name__ in ('UnspecifiedValue', 'AUTO') or sharding is None


# -- small helpers ----------------------------------------------------------------------

def _refuse_python_numbers(name: str, out) -> None:
  """A Python number among the outputs is no array to differentiate: most
  often auxiliary data returned without has_aux=True."""
  paths = [(path, leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(out)
           if isinstance(leaf, numbers.Number) and not isinstance(leaf, (jax.Array, np.generic))]
  if paths:
    path, leaf = paths[0]
    raise TypeError(
        f'{name!r} returned the Python {type(leaf).__name__} {leaf!r} at output'
        f'{jax.tree_util.keystr(path)}, which cannot be differentiated; if it is '
        'auxiliary data, pass has_aux=True (as with jax.value_and_grad).')


def function_name(f) -> str:
  """The name a user knows `f` by (a ``functools.partial``'s function's)."""
  while hasattr(f, 'func') and not hasattr(f, '__name__'):
    f = f.func
  return getattr(f, '__name__', None) or type(f).__name__


def _short(value) -> str:
  """A value as an error message can show it: arrays by type, others by a
  repr cut short."""
  if hasattr(value, 'shape') and hasattr(value, 'dtype'):
    return f'{type(value).__name__} {value.dtype}{list(value.shape)}'
  text = repr(value)
  text = text if len(text) <= 80 else text[:77] + '...'
  return f'{type(value).__name__} {text}'


def _is_number(x) -> bool:
  return isinstance(x, numbers.Number) and not isinstance(x, bool)


def _kind(x) -> str:
  if isinstance(x, _TRACED):
    return str(_dtype(x))
  return f'{type(x).__name__} (held as a constant)'


def _dtype(x):
  return x.dtype if hasattr(x, 'dtype') else np.result_type(x)


def _is_float(x) -> bool:
  return jax.numpy.issubdtype(_dtype(x), jax.numpy.inexact)


def _leaf_key(x):
  sharding = getattr(x, 'sharding', None)
  return (tuple(np.shape(x)), str(_dtype(x)), str(sharding or ''), _devices_key(sharding))


def _devices_key(sharding):
  """What a sharding's text leaves out: which devices, of which kind (two
  targets' meshes of one shape print alike)."""
  if not isinstance(sharding, jax.sharding.Sharding):
    return None
  device = min(sharding.device_set, key=lambda d: d.id)
  return (len(sharding.device_set), device.platform, device.device_kind, id(device.client))


def _held_key(x):
  if x is None:
    return None
  try:
    hash(x)
    return (type(x), x)
  except TypeError:
    return (type(x), _SameObject(x))


class _SameObject:
  """An unhashable held value in a cache key, equal only to itself. The key
  holds the value, so that its id cannot pass to another object while a
  result is cached under it."""
  __slots__ = ('value',)

  def __init__(self, value):
    self.value = value

  def __eq__(self, other):
    return isinstance(other, _SameObject) and other.value is self.value

  def __hash__(self):
    return id(self.value)


def _hashable_setting(setting):
  if isinstance(setting, Mapping):
    return tuple(sorted(setting.items()))
  return setting
