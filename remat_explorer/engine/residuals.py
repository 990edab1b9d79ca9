"""What the forward pass saves for the backward pass, in words.

``saved_residuals`` differentiates a function symbolically (``jax.vjp`` under
``jax.make_jaxpr``), looks at the values the backward pass closes over, and
says where each came from: an argument, a named value, or the primitive (and
source line) that produced it. It reads programs that use our ``checkpoint``,
``jax.checkpoint``, or both, and describes them the way JAX does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import jax

from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine.signatures import refuse_keywords_not_taken

core = jx.core


def saved_residuals(f, *args, **kwargs) -> list[tuple[core.AbstractValue, str]]:
  """List ``(aval, description)`` for each residual `f`'s VJP saves.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)),
    ...                   policy=rx.checkpoint_policies.dots_saveable)
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> for aval, description in rx.saved_residuals(f, w, x):
    ...   print(aval.shape, description)  # doctest: +ELLIPSIS
    (16, 16) from the argument w
    (16, 16) from the argument x
    (16, 16) output of ... from ...
    (16, 16) output of ... from ...
  """
  return _saved_residuals('saved_residuals', f, args, kwargs)


def _saved_residuals(caller: str, f, args, kwargs) -> list[tuple[core.AbstractValue, str]]:
  """``saved_residuals`` for `caller`, which its errors name."""
  if not callable(f):
    raise TypeError(f'{caller} expects a callable, got {type(f).__name__}: {f!r}')
  refuse_keywords_not_taken(caller, f, kwargs)
  jaxpr = _jaxpr_to_residuals(f, args, kwargs)
  # Arguments are described by their paths (``params['w']``) where known.
  dbg = jx.api_util.debug_info('saved_residuals', f, args, kwargs)
  return describe_residuals(jaxpr, dbg.arg_names or ('',) * len(jaxpr.invars))


def _jaxpr_to_residuals(f, args, kwargs) -> core.Jaxpr:
  """A jaxpr whose inputs are the leaves of ``(args, kwargs)`` and whose
  outputs are the residuals of `f`'s VJP.

  The VJP function returned by ``jax.vjp`` is a pytree whose leaves are the
  arrays it closes over: exactly what the forward pass saves. Tracing a
  function that returns only those leaves gives a program whose equations
  say where each came from.
  """
  leaves, tree = jax.tree_util.tree_flatten((args, kwargs))

  def f_of_leaves(*leaves):
    args, kwargs = jax.tree_util.tree_unflatten(tree, leaves)
    return f(*args, **kwargs)

  def residuals_of(*leaves):
    _, backward = jax.vjp(f_of_leaves, *leaves)
    return jax.tree_util.tree_leaves(backward)

  return jax.make_jaxpr(residuals_of)(*leaves).jaxpr


def print_saved_residuals(f, *args, **kwargs) -> None:
  """Print each residual `f`'s VJP saves, a line each: its type, then
  where it comes from (``saved_residuals``, as text). `f` may checkpoint
  with ``jax.checkpoint`` as well as with ours.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = jax.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> rx.print_saved_residuals(f, w, x)
    f32[16,16] from the argument w
    f32[16,16] from the argument x
  """
  for aval, description in _saved_residuals('print_saved_residuals', f, args, kwargs):
    print(f'{aval.str_short(short_dtypes=True)} {description}')


@dataclass(frozen=True)
class ResidualOrigin:
  """Where one residual comes from, in data and in JAX's words."""
  aval: core.AbstractValue
  kind: str
  """'literal', 'constant', 'argument' or 'equation'."""
  description: str
  """As ``saved_residuals`` says it, e.g. "named 'query' from model.py:12"."""
  var: object = None
  argument: str | None = None
  """For an argument: its name (a path like ``params['w']``), if known."""
  argument_index: int | None = None
  equation_index: int | None = None
  primitive: str | None = None
  name: str | None = None
  """The ``checkpoint_name`` of a named value."""
  source: str | None = None
  """``file:line (function)`` of the equation that produced it."""


def rounded_residuals(jaxpr: core.Jaxpr) -> dict:
  """Each value of `jaxpr` that is a ``reduce_precision`` of another (the
  rounding a split puts on a residual), mapped to the value it rounds."""
  return {e.outvars[0]: e.invars[0] for e in jaxpr.eqns
          if e.primitive is jx.reduce_precision_p}


def residual_origins(jaxpr: core.Jaxpr, arg_names: Sequence[str], *,
                     installed_jax_words: bool = False) -> list[ResidualOrigin]:
  """The origin of each output of `jaxpr`, taken to be the residuals.

  Results come grouped by origin (literals, constants, arguments, then
  equation outputs in program order), as JAX reports them. The rounding the
  split puts on a residual is looked through, as JAX does from 0.10.2;
  with `installed_jax_words`, as the installed JAX's ``saved_residuals``
  does (before 0.10.2 it named the rounding, see ``_jax_internals``).
  """
  through_rounding = jx.RESIDUALS_DESCRIBED_THROUGH_ROUNDING or not installed_jax_words
  # Matches JAX's wording on purpose, here and in `_equation_origin`: the
  # descriptions are what `print_saved_residuals` prints, and parity tests
  # compare that output with JAX's line by line.
  # A reduce_precision inserted on a residual is bookkeeping: name the
  # value by the equation it rounds instead (as JAX does from 0.10.2).
  rounded_from = rounded_residuals(jaxpr) if through_rounding else {}
  # Before 0.10.2, JAX also named a value by the checkpoint_name reading it.
  named_by_reader = {} if through_rounding else {
      v: name for e in jaxpr.eqns if (name := jx.name_of_named_value(e))
      for v in e.invars}
  literals = [x for x in jaxpr.outvars if isinstance(x, core.Literal)]
  residual_vars = {rounded_from.get(x, x) for x in jaxpr.outvars
                   if not isinstance(x, core.Literal)}

  origins = [ResidualOrigin(x.aval, 'literal', 'from a literal', var=x)
             for x in literals]
  origins += [ResidualOrigin(v.aval, 'constant', 'from a constant', var=v)
              for v in jaxpr.constvars if v in residual_vars]
  for i, v in enumerate(jaxpr.invars):
    if v in residual_vars:
      where = (f'the argument {arg_names[i]}' if arg_names[i]
               else f'the argument at flattened index {i}')
      origins.append(ResidualOrigin(
          v.aval, 'argument', f'from {where}', var=v,
          argument=arg_names[i] or None, argument_index=i))
  producers = {}
  for index, eqn in enumerate(jaxpr.eqns):
    producers.update((v, eqn) for v in eqn.outvars)
    for v in eqn.outvars:
      if v in residual_vars:
        origins.append(_equation_origin(index, eqn, v, producers,
                                        named_by_reader.get(v)))
  return origins


def describe_residuals(jaxpr: core.Jaxpr, arg_names: Sequence[str]
                       ) -> list[tuple[core.AbstractValue, str]]:
  """``(aval, description)`` for each output of `jaxpr`, as JAX says them."""
  return [(o.aval, o.description)
          for o in residual_origins(jaxpr, arg_names, installed_jax_words=True)]


def _equation_origin(index, eqn, var, producers, reader_name=None) -> ResidualOrigin:
  where = jx.source_info_util.summarize(eqn.source_info)
  name = jx.name_of_named_value(eqn) or reader_name
  offloaded = None
  if eqn.primitive is jx.device_put_p and eqn.invars[0] in producers:
    # An offloaded residual: JAX words it by the device_put; the data keeps
    # the name of the value that moved, which is what the user chose.
    offloaded = jx.name_of_named_value(producers[eqn.invars[0]])
  if name:
    description = f"named '{name}' from {where}"
  elif eqn.primitive.name == 'jit':
    description = f"output of jitted function '{eqn.params['name']}' from {where}"
  else:
    description = f'output of {eqn.primitive.name} from {where}'
  return ResidualOrigin(var.aval, 'equation', description, var=var,
                        equation_index=index, primitive=eqn.primitive.name,
                        name=name or offloaded, source=where)


def log_residuals(level: int, logger, split, staged_input_unknowns) -> None:
  """Log what a block's forward pass saves, as ``jax.checkpoint`` does."""
  num_res = split.num_residuals
  staged_inputs = split.staged.invars[num_res:]
  # Known inputs the backward pass reads are saved as they are.
  saved_inputs = [v for v, unknown in zip(staged_inputs, staged_input_unknowns)
                  if not unknown]
  known = split.known
  # JAX logs its block's residuals before any rounding is put on them, so
  # every release words them through it.
  saved_intermediates = [(o.aval, o.description) for o in residual_origins(
      known.replace(outvars=known.outvars[len(known.outvars) - num_res:]),
      ('',) * len(known.invars))]
  # Matches JAX's wording on purpose: what matches the line `jax.checkpoint`
  # writes matches ours. The logger is our own (`remat_explorer.engine`): a
  # filter set on JAX's logger by name does not reach it.
  message = 'remat-decorated function '
  if saved_inputs:
    message += 'saving inputs with shapes:\n'
    message += ''.join(f'  {v.aval.str_short()}\n' for v in saved_inputs)
  if saved_inputs and saved_intermediates:
    message += 'and '
  if saved_intermediates:
    message += 'saving these intermediates:\n'
    message += ''.join(f'  {aval.str_short()} from {src}\n'
                       for aval, src in saved_intermediates)
  logger.log(level, message)
