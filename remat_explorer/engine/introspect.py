"""What the engine offers to code that reads the programs it builds.

The analysis reads jaxprs that contain our ``checkpoint`` primitive (or
JAX's), the names values were given, and the scopes the engine writes into
JAX's name stacks and from there into XLA's op metadata: the recompute's
scope and the ``checkpointed_scan[...]`` scope that records a schedule.
Each scope's text is written and parsed here, next to each other, so the
readers never re-parse strings the engine writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jax

from remat_explorer.engine import _jax_internals as jx

# JAX's own remat primitive (``jax.checkpoint``), which the analysis turns
# into ours; the call primitive of ``core.closed_call``; the op that
# marks residual producers rounded to a lower precision.
jax_checkpoint_p = jx.jax_remat_p
closed_call_p = jx.closed_call_p
reduce_precision_p = jx.reduce_precision_p

name_of_named_value = jx.name_of_named_value
scan_consts_and_carries = jx.scan_consts_and_carries

# XLA's cost analysis of an HLO module's text, on a device's backend: how
# the analysis counts the FLOPs of a loop's body, made the entry of a module
# of its own.
hlo_text_flops = jx.hlo_text_flops


def debug_info_of(caller: str, fun, args, kwargs):
  """JAX's description of a call of `fun` (its argument names among it)."""
  return jx.api_util.debug_info(caller, fun, args, kwargs)


# -- the recompute's scope ---------------------------------------------------------

RECOMPUTE_SCOPE = 'rematted_computation'
"""The name-stack scope the backward pass's recompute runs in; XLA keeps it
in each instruction's ``op_name``."""

CHECKPOINT_LOWERING_SCOPE = 'checkpoint'
"""The name-stack scope a lowered block's body runs in."""

RECOMPUTE_GUARD_SCOPE = 'checkpoint_guard'
"""The name-stack scope of the conditional (``lowering="cond"``) or loop
(``lowering="while"``) that guards a recompute. Its predicate is always true
and its trip count always one, opaque to XLA by design; XLA keeps the scope
in the instruction's ``op_name``, so a reader of the compiled program can
tell the guard from the user's own control flow."""

BRANCH_RUNS_SCOPE = 'branch_runs'
"""The prefix of a scope saying how often each branch of the conditional
standing directly in it runs over the whole program, where the engine knows
(``branch_runs[3,12]``: branch 0 three times, branch 1 twelve), as the
binomial loop's backward pass does: XLA sees a runtime decision."""


def branch_runs_scope(runs) -> str:
  return f'{BRANCH_RUNS_SCOPE}[{",".join(str(int(k)) for k in runs)}]'


def branch_runs(scope: str) -> tuple[int, ...] | None:
  """The runs a ``branch_runs_scope`` names, or None for any other scope."""
  if not (scope.startswith(BRANCH_RUNS_SCOPE + '[') and scope.endswith(']')):
    return None
  return tuple(int(k) for k in scope[len(BRANCH_RUNS_SCOPE) + 1:-1].split(','))


ENGINE_SCOPES = (RECOMPUTE_SCOPE, CHECKPOINT_LOWERING_SCOPE, RECOMPUTE_GUARD_SCOPE,
                 BRANCH_RUNS_SCOPE)
"""Scopes the engine adds that are no part of the user's module path."""


def is_engine_scope(part: str) -> bool:
  """Whether one component of a name stack is a scope the engine added."""
  return part in ENGINE_SCOPES or branch_runs(part) is not None


TRANSPOSE_SCOPE = 'transpose('
"""The start of JAX's name-stack wrapper around what reverse-mode
differentiation runs (``jit(f)/transpose(jvp(Model))/...``): an equation or
an XLA instruction whose name holds it is in a backward pass."""


def in_backward_pass(name: str) -> bool:
  """Whether a name stack or an XLA ``op_name`` is inside a backward pass
  (the recompute included: it runs there)."""
  return TRANSPOSE_SCOPE in str(name)


def in_recompute(name: str) -> bool:
  """Whether a name stack or an XLA ``op_name`` is inside the recompute."""
  return RECOMPUTE_SCOPE in str(name)


def recomputes_primal(name: str) -> bool:
  """Whether an equation of the backward pass, by its name stack, evaluates
  the program again (the recompute) rather than transposing it: inside the
  recompute's scope, and not inside a transpose opened within it."""
  name = str(name)
  return in_recompute(name) and not in_backward_pass(name.rsplit(RECOMPUTE_SCOPE, 1)[1])


# -- the scope of a checkpointed_scan ----------------------------------------------

_SCAN_SCOPE = re.compile(
    r'checkpointed_scan\[([^;\]]+); n=(\d+); carry=((?:[^\[\]]|\[[^\]]*\])*)\]')


@dataclass(frozen=True)
class ScanScope:
  """What a ``checkpointed_scan[...]`` scope records."""
  text: str
  """The whole scope, e.g. ``checkpointed_scan[binomial s=4; n=256; carry=f32[8,64]]``."""
  schedule: str
  """As ``scan_schedule_costs`` names it: 'every', 'sqrt', 'segments=k', 'binomial s=S'."""
  steps: int
  carry: str
  """The carry's type(s), short form, e.g. ``f32[8,64], i32[]``."""


def scan_scope(schedule: str, steps: int, init) -> str:
  """The scope a ``checkpointed_scan`` of `steps` steps under `schedule`
  runs in, carrying `init`'s types."""
  carry = ', '.join(jax.typeof(leaf).str_short(short_dtypes=True)
                    for leaf in jax.tree_util.tree_leaves(init))
  return f'checkpointed_scan[{schedule}; n={steps}; carry={carry}]'


def parse_scan_scope(name: str) -> ScanScope | None:
  """The outermost ``checkpointed_scan`` scope in a name stack, or None."""
  m = _SCAN_SCOPE.search(str(name))
  if m is None:
    return None
  return ScanScope(m.group(0), m.group(1), int(m.group(2)), m.group(3))


__all__ = [
    'jax_checkpoint_p', 'closed_call_p', 'reduce_precision_p', 'name_of_named_value',
    'scan_consts_and_carries', 'debug_info_of', 'RECOMPUTE_SCOPE', 'CHECKPOINT_LOWERING_SCOPE', 'RECOMPUTE_GUARD_SCOPE',
    'ENGINE_SCOPES', 'is_engine_scope', 'branch_runs', 'branch_runs_scope',
    'in_recompute', 'recomputes_primal', 'ScanScope', 'scan_scope', 'parse_scan_scope',
]
