"""``SaveChosen``: the policy ``search_policy`` returns, and its source text.

A remat policy is asked about each equation as ``policy(primitive,
*input_avals, **params)`` (JAX's ``partial_eval_jaxpr_custom``, for
``jax.checkpoint`` and ours alike): not its source line, not its position,
and a split is cached and shared by every call of the same body, so the
order of the questions says nothing either. A policy found on one batch
size must also hold at another, so it may not look at sizes. What is left
are handles that stay the same when the batch or the sequence grows:

* a ``checkpoint_name``;
* a role: ``dots without batch dims`` (projections by a weight matrix),
  ``dots with batch dims`` (attention's products), ``convolutions``;
* an ``EquationPattern``: the primitive, the rank and dtype of each input
  and the parameters (contraction dimensions, precision, ...), all of which
  are independent of sizes. Equations of one pattern are saved together;
  the search lists the lines of the user's code each pattern covers.

``SaveChosen.to_source()`` writes the policy as Python that needs nothing
but JAX; running that text gives a policy that saves what this one saves.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

ROLES = ('dots without batch dims', 'dots with batch dims', 'convolutions')

# Primitives whose parameters hold no sizes (so a pattern of them holds at
# any batch or sequence length) and whose outputs are worth keeping.
PATTERN_PRIMITIVES = frozenset('''
    dot_general conv_general_dilated exp exp2 log log1p expm1 tanh logistic sin
    cos tan erf erf_inv rsqrt sqrt cbrt pow integer_pow atan2 reduce_max
    reduce_min reduce_sum argmax argmin cumsum cumprod cumlogsumexp'''.split())


def role_of(prim, params) -> str | None:
  """The role of an equation, one of ``ROLES``, or None."""
  if prim.name == 'dot_general':
    (_, _), (lhs_batch, rhs_batch) = params['dimension_numbers']
    return 'dots with batch dims' if lhs_batch or rhs_batch else 'dots without batch dims'
  if prim.name == 'conv_general_dilated':
    return 'convolutions'
  return None


@dataclass(frozen=True, order=True)
class EquationPattern:
  """An equation as a policy can tell it apart without its sizes."""
  primitive: str
  inputs: tuple[str, ...]
  """Each input's dtype and rank, e.g. ``float32/2``."""
  params: tuple[tuple[str, str], ...]
  """Each parameter's name and ``repr``, sorted by name."""

  @classmethod
  def of(cls, prim, avals, params) -> 'EquationPattern | None':
    """The pattern of an equation, or None for a primitive whose
    parameters carry sizes (reshape, slice, ...) or sub-programs."""
    if prim.name not in PATTERN_PRIMITIVES:
      return None
    return cls(prim.name, tuple(_input_text(a) for a in avals), _params_key(params))

  @classmethod
  def of_equation(cls, eqn) -> 'EquationPattern | None':
    return cls.of(eqn.primitive, [v.aval for v in eqn.invars], eqn.params)

  def key(self) -> tuple:
    """The tuple ``to_source``'s policy computes for the same equation."""
    return (self.primitive, self.inputs, self.params)

  def __str__(self):
    ranks = ', '.join(f"{dtype}[{','.join('·' * int(rank))}]"
                      for dtype, rank in (i.split('/') for i in self.inputs))
    return f'{self.primitive}({ranks})'


def _input_text(aval) -> str:
  return f'{aval.dtype}/{len(getattr(aval, "shape", ()))}'


def _params_key(params) -> tuple[tuple[str, str], ...]:
  return tuple(sorted((k, repr(v)) for k, v in params.items()))


@dataclass(frozen=True)
class SaveChosen:
  """Save the values with these names, the outputs of equations with these
  roles and of equations matching these patterns; recompute the rest. A
  plain policy: our ``checkpoint`` and ``jax.checkpoint`` both take it."""
  names: frozenset[str] = frozenset()
  roles: frozenset[str] = frozenset()
  patterns: frozenset[EquationPattern] = frozenset()
  sites: tuple[str, ...] = field(default=(), compare=False)
  """Where in the user's program the patterns matched, for the reader
  (``file:line (function) · module path``): not used to decide."""

  def __post_init__(self):
    unknown = set(self.roles) - set(ROLES)
    if unknown:
      raise ValueError(f'unknown role(s) {sorted(unknown)}; roles are {ROLES}.')

  @property
  def checkpoint_names(self) -> frozenset[str]:
    """The names it refers to, for ``describe_policy`` and the warnings
    about names that are not in the program."""
    return self.names

  def __call__(self, prim, *avals, **params) -> bool:
    if prim.name == 'name':
      return params['name'] in self.names
    if role_of(prim, params) in self.roles:
      return True
    if not self.patterns:
      return False
    pattern = EquationPattern.of(prim, avals, params)
    return pattern is not None and pattern in self.patterns

  def __repr__(self):
    return f'search: {self.summary()}'

  def summary(self, limit: int = 72) -> str:
    """What it saves, in at most `limit` characters."""
    parts = []
    if self.names:
      parts.append('names ' + ', '.join(sorted(self.names)))
    parts += sorted(self.roles)
    if self.patterns:
      shown = ', '.join(sorted(str(p) for p in self.patterns))
      parts.append(f'{len(self.patterns)} pattern(s) {shown}')
    text = ' + '.join(parts) or 'nothing'
    return text if len(text) <= limit else text[:limit - 1] + '…'

  def to_source(self) -> str:
    """Python that builds this policy with JAX alone (as ``policy``)."""
    names = tuple(sorted(self.names))
    roles = set(self.roles)
    if not self.patterns:
      builtin = _builtin_for(roles)
      if builtin is not None and not names:
        return f'policy = jax.checkpoint_policies.{builtin}\n'
      if not roles:
        return f'policy = jax.checkpoint_policies.save_only_these_names{_args(names)}\n'
      if builtin is not None:
        return ('policy = jax.checkpoint_policies.save_from_both_policies(\n'
                f'    jax.checkpoint_policies.save_only_these_names{_args(names)},\n'
                f'    jax.checkpoint_policies.{builtin})\n')
    return self._function_source(names, roles)

  def _function_source(self, names, roles) -> str:
    lines = ['def policy(prim, *avals, **params):',
             '  """Saves what remat_explorer.search_policy chose."""']
    if names:
      lines += ["  if prim.name == 'name':",
                f"    return params['name'] in {{{', '.join(map(repr, names))}}}"]
    dots = roles & {'dots without batch dims', 'dots with batch dims'}
    if dots:
      lines += ["  if prim.name == 'dot_general':"]
      if len(dots) == 2:
        lines += ['    return True']
      else:
        lines += ["    (_, _), (lhs_batch, rhs_batch) = params['dimension_numbers']"]
        test = ('lhs_batch or rhs_batch' if dots == {'dots with batch dims'}
                else 'not (lhs_batch or rhs_batch)')
        lines += [f'    if {test}:', '      return True']
    if 'convolutions' in roles:
      lines += ["  if prim.name == 'conv_general_dilated':", '    return True']
    if self.patterns:
      keys = sorted(p.key() for p in self.patterns)
      lines += ['  key = (prim.name,',
                "         tuple(f'{a.dtype}/{len(a.shape)}' for a in avals),",
                '         tuple(sorted((k, repr(v)) for k, v in params.items())))',
                '  return key in PATTERNS',
                '',
                '',
                '# Equations saved by their kind: primitive, input dtypes and ranks,',
                '# parameters (the same at any batch or sequence length).',
                'PATTERNS = {']
      lines += [textwrap.indent(repr(k) + ',', '    ') for k in keys]
      lines += ['}']
    else:
      lines += ['  return False']
    return '\n'.join(lines) + '\n'


def _builtin_for(roles: set[str]) -> str | None:
  if roles == set(ROLES):
    return 'dots_saveable'
  if roles == {'dots without batch dims'}:
    return 'dots_with_no_batch_dims_saveable'
  return None


def _args(names) -> str:
  return '(' + ', '.join(map(repr, names)) + ')'
