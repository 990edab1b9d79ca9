"""Griewank's binomial schedule as a state machine that one loop can run.

The schedule (``scan_plans`` has the theory and its cost, ``n + p(n, s)``
step evaluations) reverses `n` steps with at most `s` stored carries, the
"snapshots". Recursively, to reverse the `l` steps after a snapshot at `a`
with `c` snapshots to spend (the one at `a` among them): advance `m` steps,
store a snapshot at `a + m`, reverse the `l - m` steps after it with
`c - 1`, then restore `a` and reverse the `m` steps before with `c`. The
best `m` is ``split(l, c)``, a closed form in binomial numbers.

Run as a loop, that recursion is a state machine over a few integers: the
working position `pos`, the `target` whose cotangent is in hand, a stack
of `top` snapshots (their positions in `positions`) and where the next
snapshot goes (`next_snapshot`). Each turn of the loop evaluates the step
once, at `pos`, and then either advances (``after_advance``) or, when
``pos + 1 == target``, takes that step's VJP and restores the newest
snapshot (``after_vjp``). No list of actions is kept, so the program does
not grow with `n`; the only data is a table of binomial numbers, (s + 1)
by (t + 1) for a schedule of `t` repetitions.

The functions take the array module (``numpy`` or ``jax.numpy``) as `xp`,
so the very rules the loop runs are also run in plain Python
(``simulate``), which lists the actions and checks their count.

A snapshot is not stored where the step it starts is reversed right away
(``l - m == 1``): that step's VJP follows its evaluation directly.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

NEVER = -1
"""`next_snapshot` when no snapshot is due: no position equals it."""


def repetitions(n: int, s: int) -> int:
  """The least `t` with C(s + t, s) >= n: how often the worst step is
  re-evaluated beyond once, in an optimal schedule with `s` carries."""
  t = 0
  while math.comb(s + t, s) < n:
    t += 1
  return t


def binomial_recomputations(n: int, s: int) -> int:
  """Griewank's minimum number of recomputed steps, ``t*n - C(s+t, t-1)``."""
  t = repetitions(n, s)
  return t * n - (math.comb(s + t, t - 1) if t >= 1 else 0)


def binomial_table(n: int, s: int) -> np.ndarray:
  """``C(c + t, c)`` for ``c <= s`` and ``t <= repetitions(n, s)``: every
  part of the schedule needs no more repetitions than the whole. With one
  snapshot the split needs no table (see ``split``), so s = 1 gets none."""
  t_max = repetitions(n, s) if s >= 2 else 0
  table = [[math.comb(c + t, c) for t in range(t_max + 1)] for c in range(s + 1)]
  if table[s][t_max] >= 2**31:
    raise ValueError(f"schedule=('binomial', {s}) for {n} steps needs binomial numbers "
                     'past 32-bit integers; fewer steps per scan would do.')
  return np.array(table, dtype=np.int32)


def split(length, carries, table, xp):
  """Steps to advance before the next snapshot, reversing `length >= 2`
  steps with `carries >= 1` snapshots (the first one's included).

  With `t` the repetitions of this part, a head of `m` reversed with
  `carries` (so within `t - 1` repetitions) and a rest of ``length - m``
  reversed with ``carries - 1`` (within `t`) cost the optimum whenever both
  fit; the largest such `m` is ``min(C(c+t-1, c), length - C(c+t-2, c-1))``.
  With one snapshot the only move is to advance to the last step.
  """
  if table.shape[0] <= 2:  # s = 1
    return length - 1
  c = xp.clip(carries, 1, table.shape[0] - 1)  # in range even where unused
  t = (table[c] < length).sum()  # the least t with C(c + t, c) >= length
  before = xp.maximum(t - 1, 0)
  head = xp.minimum(table[c, before], length - table[c - 1, before])
  return xp.where(carries <= 1, length - 1, head)


def next_snapshot(pos, target, top, s, table, xp):
  """Where the next snapshot goes, for the stretch from the snapshot at
  `pos` (the newest of `top`) to `target`; `NEVER` when none is needed."""
  length = target - pos
  m = split(xp.maximum(length, 2), s - top + 1, table, xp)
  return xp.where((length >= 3) & (length - m >= 2), pos + m, NEVER)


class Control(NamedTuple):
  """The loop's state apart from the arrays: see the module docstring."""
  pos: Any
  target: Any
  top: Any
  positions: Any
  next_snapshot: Any


def start(n: int, s: int, slots: int, table, xp) -> Control:
  """Before the first step: the initial carry is the first snapshot."""
  positions = xp.zeros(slots, dtype=np.int32)
  return Control(xp.int32(0), xp.int32(n), xp.int32(1), positions,
                 xp.int32(next_snapshot(0, n, 1, s, table, xp)))


def after_advance(ctrl: Control, s: int, table, xp):
  """``(control, store, slot)`` after stepping from `pos` to ``pos + 1``:
  whether the new carry is stored as a snapshot, and in which slot (a
  valid index even when not storing)."""
  pos = ctrl.pos + 1
  store = pos == ctrl.next_snapshot
  slot = xp.minimum(ctrl.top, ctrl.positions.shape[0] - 1)
  positions = xp.where(store & (xp.arange(ctrl.positions.shape[0]) == slot), pos,
                       ctrl.positions)
  top = ctrl.top + store
  following = xp.where(store, next_snapshot(pos, ctrl.target, top, s, table, xp),
                       ctrl.next_snapshot)
  return Control(pos, ctrl.target, top, positions, following), store, slot


def after_vjp(ctrl: Control, s: int, table, xp):
  """``(control, slot)`` after the VJP of the step at `pos`: the cotangent
  moves to `pos`, a snapshot at `pos` is dropped, and the newest one left
  is restored from `slot`."""
  target = ctrl.pos
  newest = ctrl.positions[xp.maximum(ctrl.top - 1, 0)]
  top = ctrl.top - (newest == target)
  slot = xp.maximum(top - 1, 0)
  pos = ctrl.positions[slot]
  return Control(pos, target, top, ctrl.positions,
                 next_snapshot(pos, target, top, s, table, xp)), slot


def slots_needed(n: int, s: int) -> int:
  """Snapshot slots the schedule fills: at most `s`, and never the input
  of the last step (its VJP follows at once); at least one."""
  return max(1, min(s, n - 1))


def backward_turns(n: int, s: int) -> int:
  """Turns of the backward loop, one step evaluation each: all of the
  schedule's evaluations but the forward pass's `n`."""
  return binomial_recomputations(n, s)


def simulate(n: int, s: int) -> list[tuple[str, int]]:
  """The schedule's actions in order, run by the loop's own rules in plain
  Python: ``('advance', pos)``, ``('store', pos)``, ``('vjp', pos)``,
  ``('restore', pos)``, the forward pass's included. Checks as it goes that
  every VJP comes in order and that at most `s` snapshots are held."""
  table = binomial_table(n, s)
  slots = slots_needed(n, s)
  ctrl = start(n, s, slots, table, np)
  actions = []
  while int(ctrl.target) > 0:
    pos = int(ctrl.pos)
    if pos + 1 == int(ctrl.target):
      actions.append(('vjp', pos))
      ctrl, _ = after_vjp(ctrl, s, table, np)
      if int(ctrl.target) > 0:
        actions.append(('restore', int(ctrl.pos)))
    else:
      assert pos + 1 < int(ctrl.target), (n, s, actions[-3:])
      actions.append(('advance', pos))
      ctrl, store, _ = after_advance(ctrl, s, table, np)
      if store:
        actions.append(('store', int(ctrl.pos)))
    assert 1 <= int(ctrl.top) <= slots or int(ctrl.target) == 0, (n, s, ctrl)
  return actions
