"""``checkpoint`` / ``remat`` and ``checkpoint_name``: the user-facing API.

``checkpoint(fun)`` returns a function that traces `fun` to a jaxpr and binds
the ``checkpoint`` primitive on it. Signatures and behaviour follow
``jax.checkpoint`` at JAX 0.10.2, so it is a drop-in replacement.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
    'A checkpointed function is traced, so Python control flow (`if`, `while`, '
    '`int(x)`, ...) cannot depend on the values of its arguments. To branch '
    'on an argument, mark it static with `static_argnums` (or '
    '`static_argnames` for a keyword argument): the function is then traced '
    'once per value of it. See the `static_argnums` example in the docstring '
    'of `remat_explorer.checkpoint`; or compute the branch outside the '
    'checkpointed function and close over it.')


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
      prefix of the positional arguments with one bool per leaf (of the pair
      ``(positional, keyword)`` when keyword arguments are passed).
    policy: decides which intermediates may be saved, e.g. one of
      ``checkpoint_policies``. ``None`` saves nothing but the inputs.
    static_argnums: an int, or a tuple or list of ints: positions of
      arguments that are Python values to specialise on rather than trace
      (they must be hashable). Negative positions count from the end.
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

    Python control flow on an argument needs that argument static:

    >>> import functools
    >>> @functools.partial(checkpoint, static_argnums=1)
    ... def layer(x, training):
    ...   return jnp.sin(x) if training else x
    >>> float(jax.grad(layer)(2.0, True))  # doctest: +ELLIPSIS
    -0.416...
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
    block = _Block.of_call(fun, static_argnums, static_argnames, args, kwargs)
    if ref_effects == 'replay':
      check_replay_is_sound(block.body, block.name)
    outs = checkpoint_p.bind(
        *block.inputs, jaxpr=block.body,
        prevent_cse=block.prevent_cse_per_input(prevent_cse),
        differentiated=False, policy=policy,
        lowering=current_strategy(lowering), ref_effects=ref_effects)
    return jax.tree_util.tree_unflatten(block.out_tree, outs)

  return checkpointed


def remat(fun: Callable, *, prevent_cse: bool | Sequence[bool] = True,
          policy: Callable[..., Any] | None = None,
          static_argnums: int | tuple[int, ...] = (),
          lowering: str | None = None,
          ref_effects: str = DEFAULT_REF_EFFECTS,
          concrete: Any = _NOT_GIVEN) -> Callable:
  """Alias of :func:`checkpoint`.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.remat(lambda x: jnp.sum(jnp.tanh(jnp.tanh(x))))
    >>> x = jax.random.normal(jax.random.key(0), (16,))
    >>> rx.print_saved_residuals(f, x)
    f32[16] from the argument x
  """
  return checkpoint(fun, prevent_cse=prevent_cse, policy=policy,
                    static_argnums=static_argnums, lowering=lowering,
                    ref_effects=ref_effects, concrete=concrete)


def checkpoint_name(x, name: str):
  """Name `x` (an array or a pytree of them) for the named-value policies.

  An identity at run time. The name is attached with JAX's own ``name``
  primitive, so it is seen by our policies and by ``jax.checkpoint_policies``
  alike; the tangent of a named value is not named.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> def layer(w, x):
    ...   h = rx.checkpoint_name(jnp.tanh(x @ w), 'hidden')
    ...   return jnp.sum(jnp.tanh(h @ w))
    >>> f = rx.checkpoint(layer, policy=rx.checkpoint_policies.save_only_these_names('hidden'))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> [r.argument or r.name for r in rx.analyze(f, w, x).residuals]
    ['w', 'x', 'hidden']
  """
  if not isinstance(name, str):
    raise TypeError(f'checkpoint_name expects `name` to be a str, got '
                    f'{type(name).__name__}: {name!r}.')
  return jax.tree_util.tree_map(lambda leaf: jx.jax_name_p.bind(leaf, name=name), x)


# -- argument handling --------------------------------------------------------

def _normalize_prevent_cse(prevent_cse):
  """A bool, or a tuple that is a pytree prefix of the positional arguments."""
  if isinstance(prevent_cse, bool):
    return prevent_cse
  if isinstance(prevent_cse, Sequence) and not isinstance(prevent_cse, str):
    return tuple(prevent_cse)
  raise TypeError(
      'the `prevent_cse` argument of checkpoint takes a bool, or a tuple or '
      'list of bools (a pytree prefix of the positional arguments), but got '
      f'{type(prevent_cse).__name__}: {prevent_cse!r}.')


def _is_position(value) -> bool:
  # Exactly int: True and False are ints to Python, but not positions.
  return type(value) is int


def _normalize_static_argnums(static_argnums) -> tuple[int, ...]:
  positions = ((static_argnums,) if _is_position(static_argnums)
               else static_argnums)
  if type(positions) in (tuple, list) and all(map(_is_position, positions)):
    return tuple(positions)
  raise TypeError(
      'the `static_argnums` argument of checkpoint takes an int or a tuple or '
      'list of ints (positions of positional arguments; bools are refused), '
      f'but got {type(static_argnums).__name__}: {static_argnums!r}.')


def _check_static_argnums_in_range(static_argnums, num_args):
  missing = [i for i in static_argnums if not -num_args <= i < num_args]
  if not missing:
    return
  if num_args:
    allowed = f'each position must lie between {-num_args} and {num_args - 1}'
  else:
    allowed = 'there is no position to mark static'
  raise ValueError(
      f'the `static_argnums` argument of checkpoint, {static_argnums}, names '
      f'position(s) {missing}, but the call passes {num_args} positional '
      f'argument(s): {allowed}.')


# -- static arguments ---------------------------------------------------------
#
# Static arguments are taken out of the call and put back by a wrapper of
# `fun` that closes over their values. Equal static values must give the same
# wrapper, so that the trace cache (`_trace`) is hit and a call with the same
# static values is not traced again.

def _split_static_args(fun, static_argnums, static_argnames, args, kwargs):
  """(function of the traced arguments only, traced positional arguments,
  traced keyword arguments)."""
  positions = frozenset(i % len(args) for i in static_argnums)
  names = sorted(k for k in kwargs if k in static_argnames)
  if not positions and not names:
    return fun, args, kwargs
  statics = _Statics(
      num_args=len(args),
      positional=tuple((i, _Static(args[i], f'positional argument {i}'))
                       for i in sorted(positions)),
      keyword=tuple((k, _Static(kwargs[k], f'keyword argument {k!r}'))
                    for k in names))
  wrap = _reinserting_uncached if statics.holds_a_tracer() else _reinserting
  return (wrap(fun, statics),
          [x for i, x in enumerate(args) if i not in positions],
          {k: v for k, v in kwargs.items() if k not in names})


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


@dataclasses.dataclass(frozen=True)
class _Statics:
  """The static arguments of one call, and where each goes back in."""
  num_args: int
  positional: tuple[tuple[int, _Static], ...]
  keyword: tuple[tuple[str, _Static], ...]

  def holds_a_tracer(self) -> bool:
    # A tracer is compared by identity, so caching on it only leaks.
    return any(isinstance(s.value, core.Tracer)
               for _, s in self.positional + self.keyword)

  def reinsert(self, dynamic_args, dynamic_kwargs):
    """The full call's (args, kwargs), static values back in their places."""
    at = dict(self.positional)
    remaining = iter(dynamic_args)
    args = [at[i].value if i in at else next(remaining)
            for i in range(self.num_args)]
    kwargs = {**dynamic_kwargs, **{k: s.value for k, s in self.keyword}}
    return args, kwargs


def _reinserting_uncached(fun, statics: _Statics):
  def with_static_args(*dynamic_args, **dynamic_kwargs):
    args, kwargs = statics.reinsert(dynamic_args, dynamic_kwargs)
    return fun(*args, **kwargs)
  return with_static_args

_reinserting = jx.weakref_lru_cache(_reinserting_uncached)


# -- one call, as the block it binds --------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Block:
  """A call of a checkpointed function, traced into the block it binds."""
  name: str
  """The function's name, for messages."""
  body: core.Jaxpr
  """Inputs: the function's constants, then one per leaf of the traced
  arguments."""
  consts: Sequence[Any]
  leaves: Sequence[Any]
  """The leaves of the traced arguments, static ones taken out."""
  traced_args: tuple
  traced_kwargs: dict
  out_tree: Any

  @classmethod
  def of_call(cls, fun, static_argnums, static_argnames, args, kwargs) -> _Block:
    """Trace `fun` for this call. The steps are those any JAX transformation
    takes to trace a user's function: describe the call (names for errors
    and for arguments), take out the static arguments, flatten the rest,
    refuse views of refs (`ref.at[...]`), and trace on their types."""
    # Positions are checked against this call's arguments before anything
    # else looks at them: the error then names `static_argnums`.
    _check_static_argnums_in_range(static_argnums, len(args))
    dbg = jx.api_util.debug_info('checkpoint / remat', fun, args, kwargs,
                                 static_argnums=static_argnums)
    fun_of_traced, traced_args, traced_kwargs = _split_static_args(
        fun, static_argnums, static_argnames, args, kwargs)
    leaves, in_tree = jx.tracing_registry.flatten((traced_args, traced_kwargs))
    jx.api_util.check_no_transformed_refs_args(lambda: dbg, leaves)
    in_avals = tuple(core.shaped_abstractify(x) for x in leaves)
    body, consts, out_tree = _trace(fun_of_traced, in_tree, in_avals, dbg)
    return cls(dbg.func_name, body, consts, leaves, tuple(traced_args),
               traced_kwargs, out_tree)

  @property
  def inputs(self) -> list:
    return [*self.consts, *self.leaves]

  def prevent_cse_per_input(self, prevent_cse):
    """`prevent_cse` as the primitive takes it: a bool as it is, or one flag
    per input. The function's constants never need protecting; the leaves
    take their flags from `prevent_cse` as a pytree prefix of the traced
    positional arguments, or, when keyword arguments are traced too, of the
    pair (positional, keyword), as in JAX."""
    if isinstance(prevent_cse, bool):
      return prevent_cse
    tree = ((self.traced_args, self.traced_kwargs) if self.traced_kwargs
            else self.traced_args)
    return (False,) * len(self.consts) + tuple(jx.broadcast_prefix(prevent_cse, tree))


@jx.weakref_lru_cache
def _trace(fun, in_tree, in_avals, dbg):
  """`fun`'s body as the primitive takes it, its constants, and the tree of
  its outputs. Cached on `fun` and the abstract arguments, so a function
  called again on arguments of the same types is not traced again.

  Tracing returns a jaxpr closed over its constants; the primitive's body
  closes over nothing, so they become its leading inputs.
  """
  with _static_argnums_hint():
    closed, out_avals = pe.trace_to_jaxpr(
        fun, jx.flat_tree_of(in_avals, in_tree), dbg)
  return pe.convert_constvars_jaxpr(closed.jaxpr), closed.consts, out_avals.tree


@contextlib.contextmanager
def _static_argnums_hint():
  """Append the usual way out to a concretization error from our trace.

  Such an error names what the function was being traced for; ours says
  'checkpoint / remat' (the debug info made in `_Block.of_call`), so only
  errors about the checkpointed function itself get the hint.
  """
  try:
    yield
  except core.ConcretizationTypeError as error:
    message, = error.args
    if 'for checkpoint' in message:
      error.args = (f'{message}\n\n{_STATIC_ARGNUMS_HINT}',)
    raise
