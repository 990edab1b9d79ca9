"""``checkpoint`` / ``remat`` and ``checkpoint_name``: the user-facing API.

``checkpoint(fun)`` returns a function that traces `fun` to a jaxpr and binds
the ``checkpoint`` primitive on it. Signatures and behaviour follow
``jax.checkpoint`` at JAX 0.10.2, so it is a drop-in replacement.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine.lowering import check_strategy, current_strategy
from remat_explorer.engine.primitive import checkpoint_p
from remat_explorer.engine.refs import (
    DEFAULT_REF_EFFECTS, check_ref_effects, check_replay_is_sound)

core, pe = jx.core, jx.pe

jx.hide_frames_of(__file__)

_NOT_GIVEN = object()

_CONCRETE_REMOVED = (
    'The `concrete` option of `checkpoint` is gone: JAX deprecated it in '
    'v0.8.2 and removed it in v0.10.0. To branch in Python on an argument, '
    'mark that argument static with `static_argnums` (see the example in the '
    '`checkpoint` docstring), or compute the branch outside the checkpointed '
    'function and close over it.')

_STATIC_ARGNUMS_HINT = (
    'Consider using the `static_argnums` parameter for `jax.remat` or '
    '`jax.checkpoint`. See the `jax.checkpoint` docstring and its example '
    'involving `static_argnums`:\n'
    'https://docs.jax.dev/en/latest/_autosummary/jax.checkpoint.html\n')


def checkpoint(fun: Callable, *, prevent_cse: bool | Sequence[bool] = True,
               policy: Callable[..., Any] | None = None,
               static_argnums: int | tuple[int, ...] = (),
               static_argnames: str | Iterable[str] = (),
               lowering: str | None = None,
               ref_effects: str = DEFAULT_REF_EFFECTS,
               concrete: Any = _NOT_GIVEN) -> Callable:
  """Make `fun` recompute its intermediates when differentiated.

  Under ``jax.grad``, ``jax.vjp`` or ``jax.linearize`` the forward pass of
  the returned function keeps only its inputs and whatever `policy` allows;
  the backward pass recomputes the rest. Values, and derivatives, are those
  of `fun`.

  Args:
    fun: the function to checkpoint; its arguments and results are arrays,
      scalars, or pytrees of them.
    prevent_cse: whether to stop XLA from merging the recompute with the
      forward pass (which would undo the memory saving). A bool, or a pytree
      prefix of the positional arguments with one bool per leaf.
    policy: decides which intermediates may be saved, e.g. one of
      ``checkpoint_policies``. ``None`` saves nothing but the inputs.
    static_argnums: positions of arguments that are Python values to
      specialise on rather than trace (they must be hashable).
    static_argnames: names of keyword arguments to treat the same way.
    lowering: how the backward pass's recompute is protected from XLA:
      ``"barrier"`` (the default, as JAX does today), ``"cond"``, ``"while"``
      or ``"none"``; ``None`` takes the strategy set by an enclosing
      ``lowering_strategy(...)`` block, else ``"barrier"``.
    ref_effects: what the recompute does with refs (``jax.Ref``) passed to
      `fun` or closed over. ``"once"`` (the default): their reads and writes
      happen on the forward pass only; the recompute starts from the values
      they held when `fun` began (saved as residuals) in private copies.
      ``"replay"``: the recompute reads and writes the real refs again, so
      writes happen twice; refused when a value read from a ref `fun` writes
      reaches its outputs, since the gradient would then be wrong. Refs
      `fun` allocates itself are private either way.
    concrete: removed in JAX 0.10; passing it raises ``NotImplementedError``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from remat_explorer import checkpoint
    >>> g = checkpoint(lambda x: jnp.sin(jnp.sin(x)))
    >>> float(jax.grad(g)(2.0))  # doctest: +ELLIPSIS
    -0.255...
  """
  if concrete is not _NOT_GIVEN:
    raise NotImplementedError(_CONCRETE_REMOVED)
  if not callable(fun):
    raise TypeError(
        f'checkpoint expects a callable `fun` to checkpoint, but got '
        f'{type(fun).__name__}: {fun!r}. Use it as `checkpoint(f)` or as a '
        'decorator; for options use `functools.partial(checkpoint, policy=...)`.')
  if policy is not None and not callable(policy):
    raise TypeError(
        f'the `policy` argument of checkpoint must be callable, such as '
        f'checkpoint_policies.dots_saveable, but got {type(policy).__name__}: '
        f'{policy!r}.')
  if lowering is not None:
    check_strategy(lowering)
  check_ref_effects(ref_effects)
  static_argnums = _normalize_static_argnums(static_argnums)
  static_argnames = ((static_argnames,) if isinstance(static_argnames, str)
                     else tuple(static_argnames))
  prevent_cse = _normalize_prevent_cse(prevent_cse)

  @functools.wraps(fun)
  @jx.api_boundary
  def checkpointed(*args, **kwargs):
    _check_static_argnums_in_range(static_argnums, len(args))
    dbg = jx.api_util.debug_info('checkpoint / remat', fun, args, kwargs,
                                 static_argnums=static_argnums)
    traced_fun, dynamic_args, dynamic_kwargs = _split_static_args(
        fun, static_argnums, static_argnames, args, kwargs)
    flat_args, in_tree = jx.tracing_registry.flatten((dynamic_args, dynamic_kwargs))
    jx.api_util.check_no_transformed_refs_args(lambda: dbg, flat_args)
    in_avals = tuple(core.shaped_abstractify(x) for x in flat_args)
    jaxpr, consts, out_tree = _trace(traced_fun, in_tree, in_avals, dbg)
    if ref_effects == 'replay':
      check_replay_is_sound(jaxpr, dbg.func_name)
    if isinstance(prevent_cse, tuple):
      cse_prefix = ((tuple(dynamic_args), dynamic_kwargs) if dynamic_kwargs
                    else tuple(dynamic_args))
      per_input = tuple(jx.broadcast_prefix(prevent_cse, cse_prefix))
      cse = (False,) * len(consts) + per_input
    else:
      cse = prevent_cse
    outs = checkpoint_p.bind(*consts, *flat_args, jaxpr=jaxpr, prevent_cse=cse,
                             differentiated=False, policy=policy,
                             lowering=current_strategy(lowering),
                             ref_effects=ref_effects)
    return jax.tree_util.tree_unflatten(out_tree, outs)

  return checkpointed


def remat(fun: Callable, *, prevent_cse: bool | Sequence[bool] = True,
          policy: Callable[..., Any] | None = None,
          static_argnums: int | tuple[int, ...] = (),
          lowering: str | None = None,
          ref_effects: str = DEFAULT_REF_EFFECTS,
          concrete: Any = _NOT_GIVEN) -> Callable:
  """Alias of :func:`checkpoint`."""
  return checkpoint(fun, prevent_cse=prevent_cse, policy=policy,
                    static_argnums=static_argnums, lowering=lowering,
                    ref_effects=ref_effects, concrete=concrete)


def checkpoint_name(x, name: str):
  """Name `x` (an array or a pytree of them) for the named-value policies.

  An identity at run time. The name is attached with JAX's own ``name``
  primitive, so it is seen by our policies and by ``jax.checkpoint_policies``
  alike; the tangent of a named value is not named.
  """
  if not isinstance(name, str):
    raise TypeError(f'checkpoint_name expects `name` to be a str, got '
                    f'{type(name).__name__}: {name!r}.')
  return jax.tree_util.tree_map(
      functools.partial(jx.jax_name_p.bind, name=name), x)


# -- argument handling --------------------------------------------------------

def _normalize_prevent_cse(prevent_cse):
  if isinstance(prevent_cse, Sequence) and not isinstance(prevent_cse, str):
    prevent_cse = tuple(prevent_cse)
  if not isinstance(prevent_cse, (bool, tuple)):
    raise TypeError('prevent_cse must be a bool or tuple of bools, got '
                    f'{type(prevent_cse)=}')
  return prevent_cse


def _normalize_static_argnums(static_argnums):
  if type(static_argnums) is int:
    return (static_argnums,)
  if isinstance(static_argnums, list):
    static_argnums = tuple(static_argnums)
  if not (type(static_argnums) is tuple
          and all(type(i) is int for i in static_argnums)):
    raise TypeError('the `static_argnums` argument to `jax.checkpoint` / '
                    '`jax.remat` must be an int, tuple of ints or, bool, but '
                    f'got value {static_argnums}')
  return static_argnums


def _check_static_argnums_in_range(static_argnums, num_args):
  if not all(-num_args <= i < num_args for i in static_argnums):
    raise ValueError('the `static_argnums` argument to `jax.checkpoint` / '
                     '`jax.remat` can only take integer values greater than or '
                     'equal to `-len(args)` and less than `len(args)`, but got '
                     f'{static_argnums}, while `len(args)` = {num_args}')


def _split_static_args(fun, static_argnums, static_argnames, args, kwargs):
  """Separate static arguments from traced ones; return a function of the
  traced ones only (cached, so equal static values reuse one trace)."""
  static_positions = frozenset(i % len(args) for i in static_argnums)
  static_kw = tuple(sorted(k for k in kwargs if k in static_argnames))
  if not static_positions and not static_kw:
    return fun, args, kwargs
  static_values = tuple(_Static(args[i], f'positional argument {i}')
                        for i in sorted(static_positions))
  static_kw_values = tuple((k, _Static(kwargs[k], f'keyword argument {k!r}'))
                           for k in static_kw)
  dynamic_args = [x for i, x in enumerate(args) if i not in static_positions]
  dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in static_kw}
  any_tracer = any(isinstance(s.value, core.Tracer)
                   for s in static_values + tuple(v for _, v in static_kw_values))
  make = _with_static_args if any_tracer else _with_static_args_cached
  return (make(fun, static_positions, static_values, static_kw_values, len(args)),
          dynamic_args, dynamic_kwargs)


class _Static:
  """A static argument, compared by value for the trace cache."""

  def __init__(self, value, where: str):
    self.value = value
    if isinstance(value, core.Tracer):
      self.key = id(value)
      return
    try:
      self.key = hash(value)
    except TypeError as e:
      raise ValueError(
          f'{where} of the checkpointed function is marked static, so it must '
          f'be hashable, but it is an unhashable {type(value).__name__}: '
          f'{value!r}. Pass a hashable equivalent (e.g. a tuple instead of a '
          'list), or stop marking it static.') from e

  def __hash__(self):
    return self.key

  def __eq__(self, other):
    if not isinstance(other, _Static):
      return False
    if isinstance(self.value, core.Tracer) or isinstance(other.value, core.Tracer):
      return self.value is other.value
    return type(self.value) is type(other.value) and self.value == other.value


def _with_static_args(fun, static_positions, static_values, static_kw_values,
                      num_args):
  def with_statics(*dynamic_args, **dynamic_kwargs):
    statics, dynamics = iter(static_values), iter(dynamic_args)
    args = [next(statics).value if i in static_positions else next(dynamics)
            for i in range(num_args)]
    kwargs = dict(dynamic_kwargs, **{k: s.value for k, s in static_kw_values})
    return fun(*args, **kwargs)
  return with_statics

_with_static_args_cached = jx.weakref_lru_cache(_with_static_args)


@jx.weakref_lru_cache
def _trace(fun, in_tree, in_avals, dbg):
  """Trace `fun` to a jaxpr with its constants as leading inputs."""
  try:
    closed, out_avals = pe.trace_to_jaxpr(
        fun, jx.FlatTree(in_avals, in_tree, False), dbg)
  except core.ConcretizationTypeError as e:
    message, = e.args
    if 'for checkpoint' in message:
      e.args = (message + '\n\n' + _STATIC_ARGNUMS_HINT,)
    raise
  return pe.convert_constvars_jaxpr(closed.jaxpr), closed.consts, out_avals.tree
