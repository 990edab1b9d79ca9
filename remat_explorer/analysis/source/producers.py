"""The equation that really made a value: looking through the ``scan``,
``while``, ``cond`` and calls that carry it out of a body, and through the
rounding and offloading that the split adds, to the equation the user's
code bound, with its scope and the constructs it was carried out of."""

from __future__ import annotations

import dataclasses

from jax.extend.core import Literal, Var

from remat_explorer.analysis.source.module_paths import ModulePaths
from remat_explorer.analysis.source.origins import (CodeSite, call_body, clean_scope, join_scopes,
                                                    user_site_within)
from remat_explorer.engine import scan_consts_and_carries


def scan_step(length: int) -> str:
  """A scan over `length` steps as a step of a path of constructs
  (``Producer.carried_out_of``, ``Block.path``): ``'scan×4'``."""
  return f'scan×{length}'


def is_scan_step(step: str) -> bool:
  return step.startswith('scan×')


def step_trips(step: str) -> int | None:
  """How often what is inside a path's `step` runs per run of the step: a
  scan's length; None for a ``while`` loop (no static count); once for any
  other construct (a ``cond``, a ``jit`` call, a ``shard_map``)."""
  if is_scan_step(step):
    return int(step.removeprefix('scan×'))
  return None if step == 'while' else 1


@dataclasses.dataclass(frozen=True)
class Producer:
  """The equation that computed a value, found by looking into bodies."""
  eqn: object
  scope: str
  """The cleaned name stack of the equation, bodies' enclosing scopes joined."""
  carried_out_of: tuple[str, ...] = ()
  """The constructs the value was carried out of, outermost first, e.g.
  ``('scan×4',)`` for a value stacked by a scan over 4 steps."""
  enclosing: tuple = ()
  """The equations whose bodies were entered to reach it, outermost first."""
  jaxpr: object = None
  """The jaxpr (or body) that holds `eqn`."""

  def site(self) -> CodeSite | None:
    """The user's line that computed the value: inside the bodies entered,
    the deepest line of the user's own code; where the body is all a
    library's (``relu``), the line that called it."""
    return user_site_within(self.eqn, self.enclosing)

  def computing_eqns(self) -> tuple:
    """`eqn`, and for a named value (``checkpoint_name``, which computes
    nothing) the equations that computed what it names: what the compiled
    program has an instruction for."""
    found, eqn = [self.eqn], self.eqn
    while (self.jaxpr is not None and eqn.primitive.name in _NAMING and eqn.invars
           and isinstance(eqn.invars[0], Var)):
      eqn, _ = _producer(self.jaxpr, eqn.invars[0])
      if eqn is None:
        break
      found.append(eqn)
    return tuple(found)

  def module_path(self, paths: ModulePaths) -> str:
    for eqn in (self.eqn, *reversed(self.enclosing)):
      if path := paths.of(eqn):
        return path
    return paths.of_scope(self.scope)


# Bookkeeping the split adds on a residual: look through to the value.
_PASS_THROUGH = ('reduce_precision', 'device_put', 'copy', 'copy_p')
# Equations that give a value a name and compute nothing.
_NAMING = ('name', *_PASS_THROUGH)


def trace_producer(jaxpr, var, scope: str = '') -> Producer | None:
  """The equation of `jaxpr` (or of a body inside it) that computed `var`."""
  carried: list[str] = []
  enclosing: list = []
  for _ in range(64):  # bodies nest; a bound keeps a malformed jaxpr finite
    eqn, k = _producer(jaxpr, var)
    if eqn is None:
      return None
    eqn_scope = join_scopes(scope, clean_scope(eqn.source_info.name_stack))
    here = Producer(eqn, eqn_scope, tuple(carried), tuple(enclosing), jaxpr)
    if eqn.primitive.name in _PASS_THROUGH:
      if eqn.invars and isinstance(eqn.invars[0], Var):
        var = eqn.invars[0]
        continue
      return here
    found = _into_body(eqn, k)
    if found is None:
      return here
    body, body_var, label, outer_input = found
    if outer_input is not None:
      var = outer_input  # passed through the body unchanged: look outside
      continue
    if not isinstance(body_var, Var):
      return here
    if label:
      carried.append(label)
    enclosing.append(eqn)
    jaxpr, var, scope = body, body_var, eqn_scope
  return None


def _producer(jaxpr, var):
  if isinstance(var, Literal):
    return None, 0
  for eqn in jaxpr.eqns:
    for k, out in enumerate(eqn.outvars):
      if out is var:
        return eqn, k
  return None, 0


def _into_body(eqn, k):
  """(body, the body's value for output `k`, a label, the outer input it
  passes through when it does) for equations that carry a body's value out."""
  name, params = eqn.primitive.name, eqn.params
  if name == 'scan':
    body = params['jaxpr'].jaxpr
    out = _scan_value(body, body.outvars[k], *scan_consts_and_carries(params))
    return body, out, scan_step(params['length']), _outer_input(eqn, body, out)
  if name == 'while':
    body = params['body_jaxpr'].jaxpr
    out = body.outvars[k]
    nc, nb = params['cond_nconsts'], params['body_nconsts']
    outer = None
    if isinstance(out, Var) and out in body.invars:
      outer = (eqn.invars[nc:nc + nb] + eqn.invars[nc + nb:])[body.invars.index(out)]
    return body, out, 'while', outer
  if name == 'cond':
    branches = [b.jaxpr for b in params['branches']]
    # The branch whose value says most: the first with a producer inside.
    body = next((b for b in branches if isinstance(b.outvars[k], Var)
                 and b.outvars[k] not in b.invars), branches[0])
    out = body.outvars[k]
    outer = None
    if isinstance(out, Var) and out in body.invars:
      outer = eqn.invars[1:][body.invars.index(out)]
    return body, out, 'cond', outer
  body = call_body(eqn)
  if body is None or k >= len(body.outvars):
    return None
  out = body.outvars[k]
  return body, out, '', _outer_input(eqn, body, out)


def _scan_value(body, out, num_consts, num_carry):
  """A scan's stacked output that is the carry as a step receives it (the
  input of every layer, say) is made by the step before: look at what the
  body returns as that carry, unless it returns the carry unchanged."""
  carry_in = body.invars[num_consts:num_consts + num_carry]
  if isinstance(out, Var) and out in carry_in:
    carried = body.outvars[carry_in.index(out)]
    if carried is not out:
      return carried
  return out


def _outer_input(eqn, body, out):
  if isinstance(out, Var) and out in body.invars:
    return eqn.invars[body.invars.index(out)]
  return None
