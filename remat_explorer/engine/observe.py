"""Observing splits: what differentiation did to each block.

The analysis layer asks "what did differentiation do to each block?" rather
than redoing it: while `observe_splits()` is active, every split taken by
the partial-eval rule is recorded, with the user's block it derives from.
A block nested in another is split twice: with its parent, by the parent's
policy (JAX's call rule, `primitive._partial_eval_custom`), and again by its own
policy when the backward pass runs the parent's recompute (`_transpose`
partially evaluates the parent's staged body). Only the second goes through
`_partial_eval`; the halves of the first are noted as derived from the
block, so that the second is recorded as the block's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

from remat_explorer.engine import _jax_internals as jx

core = jx.core


@dataclasses.dataclass(frozen=True)
class SplitRecord:
  block: core.Jaxpr
  """The body of the block as the user's program holds it."""
  jaxpr: core.Jaxpr
  """The body that was split (the block's JVP, for reverse mode)."""
  in_unknowns: tuple[bool, ...]
  split: object
  params: dict
  lineage: tuple = ()
  """``jaxpr``, then each jaxpr it was derived from (by JVP, vmap, DCE, or
  a split from outside), ending with ``block``: what lets the analysis find
  a nested block's own split from the call its parent's split left behind."""


class _SplitObserver:
  def __init__(self):
    self.records: list[SplitRecord] = []
    self.derived_from: dict[int, core.Jaxpr] = {}
    self._keep_alive: list = []  # so that ids stay unique while observing

  def lineage(self, jaxpr) -> tuple:
    chain = [jaxpr]
    while (id(chain[-1]) in self.derived_from
           and not any(j is self.derived_from[id(chain[-1])] for j in chain)):
      chain.append(self.derived_from[id(chain[-1])])
    return tuple(chain)


_observers = threading.local()


def _active_observers() -> list:
  return getattr(_observers, 'stack', [])


@contextlib.contextmanager
def observe_splits():
  """Record every split taken while active; yields the list of records."""
  observer = _SplitObserver()
  _observers.stack = [*_active_observers(), observer]
  try:
    yield observer.records
  finally:
    _observers.stack = [o for o in _active_observers() if o is not observer]


def note_derived(new_jaxpr, from_jaxpr):
  if new_jaxpr is from_jaxpr:
    return
  for observer in _active_observers():
    observer.derived_from[id(new_jaxpr)] = from_jaxpr
    observer._keep_alive.append(new_jaxpr)


def note_split(jaxpr, in_unknowns, split, params):
  for observer in _active_observers():
    lineage = observer.lineage(jaxpr)
    observer.records.append(SplitRecord(
        lineage[-1], jaxpr, tuple(in_unknowns), split, dict(params), lineage))
