"""Schedules for ``checkpointed_scan``: which steps are checkpointed, and how.

The nested schedules ('every', 'sqrt', segments) are *plans*: small trees
saying how the `n` steps of a scan are grouped into checkpointed blocks and
``lax.scan`` loops. ``scan.py`` turns a plan into a program. The binomial
schedule is no tree but one loop, run by ``revolve_scan`` under the rules of
``revolve``. This module is plain Python, so it also gives every schedule's
predicted costs (``scan_schedule_costs``) without tracing anything.

How nested checkpoints make a schedule. In ``y = rest(checkpoint(head)(x))``
the forward pass evaluates `head` once and keeps only its input `x`; `rest`
is differentiated while `x` is held, so it has one carry fewer to spend; then
`head` is evaluated again from `x` and differentiated with its own nested
structure. A step inside `d` nested checkpoints is evaluated `d + 1` times.
The last step of a block is not checkpointed: its intermediates (its "tape")
are used by the backward pass as soon as the block's forward ends.

Counting. For `n` steps, *step evaluations* are the evaluations of the step
function while computing the outputs and their VJP once (forward and backward
passes together); ``lax.scan`` without remat needs exactly `n`, so
*recomputed steps* are the evaluations beyond `n`. With `s` carries held at
most, Griewank's binomial schedule recomputes the fewest steps possible:

    p(n, s) = t*n - C(s + t, t - 1),  t the least integer with C(s + t, s) >= n,

the number of forward advances of the "revolve" algorithm (each step's final
evaluation, which records its tape, is the `n` already counted). Each step
is evaluated at most `t + 1` times.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from remat_explorer.engine.revolve import binomial_recomputations, repetitions

# -- plans ----------------------------------------------------------------------
#
# Plans are immutable and built through caches, so equal sub-plans are one
# object: the program traces each distinct block once.


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
  """One step: `checkpoint(f, policy=policy)` if `checkpointed`, else `f`."""
  checkpointed: bool
  length = 1


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
  """``lax.scan`` over `times` consecutive copies of `body`."""
  body: object
  times: int

  @property
  def length(self) -> int:
    return self.body.length * self.times


@dataclasses.dataclass(frozen=True, eq=False)
class Chain:
  """Parts one after another, in the order the steps run."""
  parts: tuple

  @property
  def length(self) -> int:
    return sum(p.length for p in self.parts)


@dataclasses.dataclass(frozen=True, eq=False)
class Checkpointed:
  """`body` under a checkpoint that saves nothing but its input carry."""
  body: object

  @property
  def length(self) -> int:
    return self.body.length


_CHECKPOINTED = Step(checkpointed=True)
_checkpointed = functools.cache(Checkpointed)


def _chain(*parts):
  """A chain of the non-empty parts, flattened; a single part stands alone."""
  flat = []
  for p in parts:
    if p is None:
      continue
    flat.extend(p.parts if isinstance(p, Chain) else (p,))
  return flat[0] if len(flat) == 1 else Chain(tuple(flat))


@functools.cache
def _loop(body, times):
  return None if times == 0 else body if times == 1 else Loop(body, times)


@functools.cache
def every_plan(n: int):
  """``scan(checkpoint(f))``: every step keeps its input carry."""
  return Loop(_CHECKPOINTED, n)


@functools.cache
def segments_plan(n: int, k: int):
  """`k` checkpointed segments, each a ``scan(checkpoint(f))``.

  The segment lengths differ by at most one: ``n % k`` segments of
  ``n // k + 1`` steps, then the rest of ``n // k``, as two loops.
  """
  k = min(k, n)
  length, longer = divmod(n, k)
  segment = lambda length: _checkpointed(every_plan(length))
  return _chain(_loop(segment(length + 1), longer) if longer else None,
                _loop(segment(length), k - longer))


# -- predicted costs -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ScanScheduleCosts:
  """What a schedule predicts for the VJP of an `n`-step scan.

  Counts assume the step's `policy` is ``None`` (a checkpointed step saves
  only its inputs); a policy that saves more recomputes less inside a step,
  not fewer steps.

  Example:
    >>> import remat_explorer as rx
    >>> rx.scan_schedule_costs(100, ('binomial', 4))
    ScanScheduleCosts(n=100, schedule='binomial s=4', stored_carries=4,
                      step_evaluations=474, recomputed_steps=374, levels=5)
  """
  n: int
  schedule: str
  """As given: 'every', 'sqrt', 'segments=k' or 'binomial s=S'."""
  stored_carries: int
  """The most carries held at once as residuals (the snapshots); each
  step's own tape, xs, and what a policy saves come on top."""
  step_evaluations: int
  """Evaluations of the step function for the outputs and one VJP,
  forward and backward passes together (``lax.scan`` without remat: n)."""
  recomputed_steps: int
  """``step_evaluations - n``: evaluations beyond those of ``lax.scan``."""
  levels: int
  """Nesting depth of the checkpoints around a step (1 for 'every'); for
  the binomial loop, `t`: a step is evaluated at most ``levels + 1`` times."""


def scan_schedule_costs(n: int, schedule='every', segments: int | None = None
                        ) -> ScanScheduleCosts:
  """Predicted stored carries and step evaluations of a schedule, in closed form.

  `schedule` and `segments` are as for ``checkpointed_scan``.

  Example:
    >>> import remat_explorer as rx
    >>> for schedule in ('every', 'sqrt', ('binomial', 4)):
    ...   costs = rx.scan_schedule_costs(1000, schedule)
    ...   print(costs.schedule, costs.stored_carries, costs.step_evaluations)
    every 1000 2000
    sqrt 63 3000
    binomial s=4 4 8998
  """
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise ValueError(f'scan_schedule_costs expects `n`, the number of steps, '
                     f'to be an int >= 1, got {n!r}.')
  kind, size = resolve_schedule(schedule, segments, n)
  if kind == 'every':
    stored, evaluations, levels, name = n, 2 * n, 1, 'every'
  elif kind == 'segments':
    # The k segment inputs, plus one segment's carries while it is reversed.
    # The longer segments run first, so the shorter ones' inputs are freed
    # by the time a longer one is reversed: k + n // k either way.
    k = min(size, n)
    stored, evaluations, levels = k + n // k, 3 * n, 2
    name = 'sqrt' if schedule == 'sqrt' else f'segments={size}'
  else:
    stored = min(size, n - 1)
    evaluations = n + binomial_recomputations(n, size)
    levels, name = repetitions(n, size), f'binomial s={size}'
  return ScanScheduleCosts(n, name, stored, evaluations, evaluations - n, levels)


def plan_for(n: int, schedule, segments=None):
  """The plan of a nested schedule ('every' or segments) for `n >= 1` steps;
  the binomial schedule is a loop (``revolve``), not a plan."""
  kind, size = resolve_schedule(schedule, segments, n)
  if kind == 'every':
    return every_plan(n)
  assert kind == 'segments', kind
  return segments_plan(n, size)


def sqrt_segments(n: int) -> int:
  """The number of segments of ``schedule='sqrt'`` for n >= 1: ceil(sqrt(n))."""
  return math.isqrt(n - 1) + 1


_SCHEDULES = ("'every', 'sqrt', 'segments' (with segments=k), or "
              "('binomial', s) with an int s >= 1")


def resolve_schedule(schedule, segments, n):
  """``(kind, size)``: ('every', None), ('segments', k) or ('binomial', s).

  `segments=k` chooses the nested layout with `k` segments; it goes with
  ``schedule='every'`` (the default, which it replaces) or 'segments', and
  conflicts with 'sqrt' (which picks k itself) and 'binomial'.
  """
  if segments is not None:
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
      raise ValueError(f'the `segments` argument of checkpointed_scan must be an '
                       f'int >= 1 (the number of checkpointed segments), got {segments!r}.')
    if not (isinstance(schedule, str) and schedule in ('every', 'segments')):
      raise ValueError(
          f'checkpointed_scan got both schedule={schedule!r} and segments={segments}; '
          "`segments=k` goes with schedule='segments' (or the default), since "
          f'{schedule!r} chooses its own layout.')
    return 'segments', segments
  if isinstance(schedule, str):
    if schedule == 'every':
      return 'every', None
    if schedule == 'sqrt':
      return 'segments', sqrt_segments(n)
    if schedule == 'segments':
      raise ValueError("schedule='segments' needs the number of segments: pass "
                       "`segments=k` with an int k >= 1, or use schedule='sqrt'.")
  elif (isinstance(schedule, tuple) and len(schedule) == 2
        and schedule[0] == 'binomial'):
    s = schedule[1]
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
      raise ValueError(
          f"the `schedule` argument ('binomial', s) needs s, the number of carries "
          f'to hold, to be an int >= 1, got s={s!r}.')
    return 'binomial', s
  raise ValueError(f'the `schedule` argument of checkpointed_scan must be one of '
                   f'{_SCHEDULES}; got {schedule!r}.')
