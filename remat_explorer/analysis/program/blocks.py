"""Find the remat blocks in a user's program, and set their policy.

A program reaches the analysis as a jaxpr. Its remat blocks may be ours
(``checkpoint``) or JAX's (``jax.checkpoint``, e.g. inside a Flax model), and
may sit inside ``scan``, ``cond``, ``jit`` or other blocks. ``find_blocks``
walks the program, turns every JAX block into ours (the same body and
parameters, so the same split) and, when asked, replaces policies and
lowerings; it returns the rewritten program and where each block sits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from jax.extend import core

from remat_explorer.analysis.source.origins import entry_function, user_site
from remat_explorer.analysis.source.producers import scan_step
from remat_explorer.analysis.policies.policy_info import NO_REMAT, describe_policy
from remat_explorer.analysis.policies.policy_text import parse_policy
from remat_explorer.engine import (DEFAULT_REF_EFFECTS, DEFAULT_STRATEGY, STRATEGIES,
                                   check_strategy, checkpoint_p, closed_call_p,
                                   current_strategy, jax_checkpoint_p)

PolicyChoice = Callable[..., Any] | Mapping[str, Callable[..., Any]] | None

_LAYOUT_BLOCKS = ('checkpointed_scan_block',)

LOWERINGS = STRATEGIES
"""The lowering strategies a block may use (``checkpoint(lowering=...)``)."""
DEFAULT_LOWERING = DEFAULT_STRATEGY




@dataclass(frozen=True)
class BlockSite:
  """One remat block of the program."""
  index: int
  name: str
  """``function``, made unique with ``#n`` if repeated."""
  function: str
  """The user's function the block runs: the checkpointed function, or
  the method a framework wrapper calls (``Block`` for a Flax module's
  ``Block.__call__``), found from the body's tracebacks. What
  ``policy={name: ...}`` matches (``wrapper`` too)."""
  wrapper: str
  """The name of the function JAX was handed (a framework's wrapper,
  such as Flax's ``core_fn``, or the user's function itself)."""
  path: tuple[str, ...]
  """The constructs enclosing the block, outermost first, e.g. ``('scan×16',)``."""
  trip_count: int | None
  """How many times the block runs per call: the product of enclosing scan
  lengths; ``None`` inside a ``while`` loop, whose trip count is not static."""
  body: core.Jaxpr
  policy: Any
  lowering: str
  source: str | None
  library: str
  """``'remat_explorer'`` or ``'jax'``: whose ``checkpoint`` the user called."""
  parent: int | None
  """Index of the block this one is nested in, if any."""


def find_blocks(closed: core.ClosedJaxpr, policy: PolicyChoice = None,
                lowering: str | None = None
                ) -> tuple[core.ClosedJaxpr, list[BlockSite]]:
  """Rewrite `closed` so every block is ours, with `policy` and `lowering`.

  `policy`: ``None`` keeps each block's own policy; a callable replaces all;
  a mapping from block function name to policy replaces those blocks only
  (``check_block_names`` then says whether it names blocks that are not
  there); ``NO_REMAT`` turns every block into a plain call (the no-remat
  baseline).
  """
  if lowering is not None:
    check_strategy(lowering)
  _check_policy_choice(policy)
  walker = _Walker(policy, lowering)
  jaxpr = walker.rewrite(closed.jaxpr, path=(), trip_count=1, parent=None, site=None)
  return core.ClosedJaxpr(jaxpr, closed.consts), walker.blocks


def check_block_names(policy: PolicyChoice, blocks: list[BlockSite],
                      whole_function: bool = False) -> None:
  """Refuse a ``{block name: policy}`` mapping that names a block the program
  does not have, listing the ones it has. Checked once the blocks are final:
  a program with no block of its own is checkpointed as a whole
  (`whole_function`), and its one block is named after the function."""
  if not isinstance(policy, Mapping):
    return
  found = sorted({b.function for b in blocks})
  known = set(found) | {b.wrapper for b in blocks}
  missing = sorted(set(policy) - known)
  if not missing:
    return
  if whole_function:
    where = (f'the program has no remat block of its own, so it is '
             f'checkpointed as a whole, as block {found}')
  else:
    where = f'its remat blocks are {found}'
  raise ValueError(
      f'policy= names block(s) {missing} that are not in the program; '
      f'{where}. Block names are the names of the checkpointed functions.')


def built_policy_choice(policy: PolicyChoice | str) -> PolicyChoice:
  """`policy` with each policy given by name or expression
  (``'dots_saveable'``, ``"save_only_these_names('qkv')"``, as ``compare``
  takes them) built; anything else as it is."""
  if isinstance(policy, str):
    return _parsed(policy)
  if isinstance(policy, Mapping):
    return {block: _parsed(p) if isinstance(p, str) else p for block, p in policy.items()}
  return policy


def _parsed(text: str):
  try:
    return parse_policy(text)
  except ValueError as e:
    raise ValueError(f'policy= {e}') from None


def _check_policy_choice(policy) -> None:
  if policy is None or policy is NO_REMAT or callable(policy):
    return
  if isinstance(policy, Mapping):
    for name, p in policy.items():
      if not isinstance(name, str) or not (callable(p) or p is NO_REMAT):
        raise TypeError(
            'policy= as a mapping must map block names (str) to callable '
            f'policies (or NO_REMAT), but maps {name!r} to {p!r}.')
    return
  raise TypeError(
      f'policy= must be a callable remat policy (e.g. '
      f'checkpoint_policies.dots_saveable) or its name or expression as a str '
      f"('dots_saveable'), a mapping from block name to policy, or None, but got "
      f'{type(policy).__name__}: {policy!r}.')


class _Walker:

  def __init__(self, policy, lowering):
    self.policy, self.lowering = policy, lowering
    self.blocks: list[BlockSite] = []
    self._name_counts: dict[str, int] = {}
    # A body used by several equations (a layer traced once, called N times)
    # is rewritten to one shared object, so that JAX's caches keyed on it
    # work as they do for the original program.
    self._rewritten: dict[int, tuple[core.Jaxpr, core.Jaxpr]] = {}

  def rewrite(self, jaxpr: core.Jaxpr, path, trip_count, parent, site) -> core.Jaxpr:
    """`site`: the user's line of the innermost enclosing equation that has
    one; JAX records only a body's own frames for the equations in it."""
    eqns = []
    for e in jaxpr.eqns:
      new = self._rewrite_eqn(e, path, trip_count, parent, user_site(e.source_info) or site)
      eqns.extend(new if isinstance(new, list) else [new])
    if id(jaxpr) in self._rewritten:
      return self._rewritten[id(jaxpr)][1]
    rewritten = jaxpr.replace(eqns=eqns)
    self._rewritten[id(jaxpr)] = (jaxpr, rewritten)  # keeps `jaxpr` alive
    return rewritten

  def _rewrite_eqn(self, eqn, path, trip_count, parent, site):
    if eqn.primitive is checkpoint_p or eqn.primitive is jax_checkpoint_p:
      return self._rewrite_block(eqn, path, trip_count, parent, site)
    if eqn.primitive.name.startswith('custom_'):
      return eqn  # its rules are user code over the original body
    step, inner_trips = _construct(eqn)
    inner_trip_count = (None if trip_count is None or inner_trips is None
                        else trip_count * inner_trips)
    new_params = {
        k: _map_jaxprs(v, lambda j: self.rewrite(j, (*path, step), inner_trip_count,
                                                 parent, site))
        for k, v in eqn.params.items()}
    if all(new_params[k] is eqn.params[k] for k in eqn.params):
      return eqn
    return eqn.replace(params=new_params)

  def _rewrite_block(self, eqn, path, trip_count, parent, site):
    dbg = eqn.params['jaxpr'].debug_info
    wrapper = (dbg.func_name if dbg else None) or 'checkpointed'
    # A block of checkpointed_scan runs many steps of the user's function:
    # it is named as the layout's, not after the step.
    function = (wrapper if wrapper in _LAYOUT_BLOCKS
                else entry_function(eqn, eqn.params['jaxpr']) or wrapper)
    count = self._name_counts.get(function, 0) + 1
    self._name_counts[function] = count
    index = len(self.blocks)
    self.blocks.append(None)  # reserve the index; nested blocks come after
    body = self.rewrite(eqn.params['jaxpr'], (*path, function), trip_count, index, site)
    policy = self._policy_for((function, wrapper), eqn.params['policy'])
    # JAX's blocks carry no strategy: they take the enclosing one, as ours do.
    lowering = self.lowering or eqn.params.get('lowering') or current_strategy(None)
    params = dict(jaxpr=body, prevent_cse=eqn.params['prevent_cse'],
                  differentiated=eqn.params['differentiated'], policy=policy,
                  lowering=lowering,
                  ref_effects=eqn.params.get('ref_effects', DEFAULT_REF_EFFECTS))
    self.blocks[index] = BlockSite(
        index=index, name=function if count == 1 else f'{function}#{count}',
        function=function, wrapper=wrapper, path=path, trip_count=trip_count, body=body,
        policy=policy, lowering=lowering,
        source=None if site is None else str(site),
        library='remat_explorer' if eqn.primitive is checkpoint_p else 'jax',
        parent=parent)
    if policy is NO_REMAT:
      # The block's equations in place of it, as if the user had called
      # the function without remat; a call only where that cannot be
      # written (an output that is an input or repeated).
      return _inlined(eqn, body) or core.new_jaxpr_eqn(
          eqn.invars, eqn.outvars, closed_call_p,
          dict(call_jaxpr=core.ClosedJaxpr(body, [])), eqn.effects,
          eqn.source_info, eqn.ctx)
    return core.new_jaxpr_eqn(eqn.invars, eqn.outvars, checkpoint_p, params,
                              eqn.effects, eqn.source_info, eqn.ctx)

  def _policy_for(self, names, own_policy):
    if isinstance(self.policy, Mapping):
      return next((self.policy[n] for n in names if n in self.policy), own_policy)
    return own_policy if self.policy is None else self.policy


def _inlined(eqn, body: core.Jaxpr) -> list | None:
  """`body`'s equations computing `eqn`'s outputs from its inputs, with
  fresh variables (a body called several times is inlined several times),
  or None where an output is not made by an equation of its own."""
  defined = {v for e in body.eqns for v in e.outvars}
  outs = [v for v in body.outvars if isinstance(v, core.Var)]
  if (body.constvars or len(outs) != len(body.outvars)
      or any(v not in defined for v in outs) or len(set(outs)) != len(outs)):
    return None
  env = dict(zip(body.invars, eqn.invars))
  for inner, outer in zip(body.outvars, eqn.outvars):
    env[inner] = outer if not isinstance(outer, core.DropVar) else core.Var(inner.aval)

  def read(v):
    return env.get(v, v) if isinstance(v, core.Var) else v

  def write(v):
    if isinstance(v, core.DropVar):
      return v
    if v not in env:
      env[v] = core.Var(v.aval)
    return env[v]
  return [e.replace(invars=[read(v) for v in e.invars], outvars=[write(v) for v in e.outvars])
          for e in body.eqns]


def _construct(eqn) -> tuple[str, int | None]:
  """How an equation's sub-programs are shown in a path, and their trip count."""
  name = eqn.primitive.name
  if name == 'scan':
    return scan_step(eqn.params['length']), eqn.params['length']
  if name == 'while':
    return 'while', None
  if name == 'jit':
    return f"jit({eqn.params.get('name', '')})", 1
  return name, 1


def _map_jaxprs(value, fn):
  """Apply `fn` to every (closed) jaxpr in a parameter value."""
  if isinstance(value, core.ClosedJaxpr):
    new = fn(value.jaxpr)
    return value if new is value.jaxpr else core.ClosedJaxpr(new, value.consts)
  if isinstance(value, core.Jaxpr):
    return fn(value)
  if isinstance(value, tuple) and any(
      isinstance(v, (core.Jaxpr, core.ClosedJaxpr)) for v in value):
    new = tuple(_map_jaxprs(v, fn) for v in value)
    return value if all(a is b for a, b in zip(new, value)) else new
  return value


def policy_label(policy, blocks) -> str:
  """The policy of a whole analysis: the one given, or the blocks' own."""
  if policy is None or isinstance(policy, Mapping):
    return '; '.join(sorted({describe_policy(b.policy) for b in blocks}))
  return describe_policy(policy)
