"""What the interactive memory timeline shows, as plain data: a pure
function of a compiled program's timeline and its analysis.

The schedule (the entry computation's instructions in run order; a loop is
one instruction that runs all its iterations) is cut into at most
``MAX_BANDS`` bands of consecutive steps. Each band is drawn at its
highest step and carries the buffers live there (``live_at_peak`` at that
step), which the page shows on hover or click. Bands whose buffers read the
same share one list.

The forward/backward boundary is where the schedule turns from forward to
backward instructions (JAX's name stack in the HLO metadata says which
pass each one belongs to). XLA hoists small backward instructions (zeros
for the gradients, constants) into the forward pass, so the boundary is
the one cut that the most steps agree with: forward before it, backward
or recompute after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from remat_explorer.analysis import (CompiledCosts, PeakBuffer, explain_peak, live_at_peak,
                                    RematReport)

MAX_BANDS = 150
"""Bands drawn at most: enough to see the shape, few enough to embed each
band's buffers in the page."""
_BACKWARD = ('backward', 'recompute')
PASS_COLORS = {'forward': '#4c78a8', 'backward': '#f58518', 'recompute': '#9467bd',
               '': '#bbbbbb'}
"""Each pass's colour, in both drawings of the timeline."""


@dataclass(frozen=True)
class Band:
  """Consecutive steps ``first`` to ``last``, drawn at their highest."""
  first: int
  last: int
  step: int
  """The highest step of the band (the busiest at that height): the one
  whose buffers it lists."""
  instruction: str
  height: int
  """Device bytes at `step` (``MemoryTimeline.height``: XLA's placement
  where known)."""
  live: int
  """Bytes of the buffers live at `step`."""
  residual: int
  """Bytes of the residual buffers live at `step`."""
  pass_name: str
  """The pass `step` runs: 'forward', 'backward', 'recompute' or ''."""
  loops: tuple[str, ...]
  """The loop (``while``) instructions among the band's steps."""
  buffers: int
  """Index into ``TimelineView.buffers``: what is live at `step`."""


@dataclass(frozen=True)
class TimelineView:
  policy: str
  steps: int
  bands: tuple[Band, ...]
  buffers: tuple[tuple[PeakBuffer, ...], ...]
  """The buffers live at each band's step, largest first, each list once."""
  peak_band: int
  peak_bytes: int
  passes: tuple[tuple[int, int, str], ...]
  """``MemoryTimeline.passes()``: runs of one pass."""
  boundary: int | None
  """The first step of the backward pass (see the module), if any."""
  reference: tuple[str, int, tuple[tuple[float, int], ...]] | None = None
  """Another program's curve for comparison: (label, peak bytes, points
  (x in this schedule's steps, bytes)), its forward and backward passes
  stretched onto this one's."""
  peak_gap: tuple[int, int, str] | None = None
  """``explain_peak``'s (listed bytes, gap to the peak, why): what the
  buffers listed at the peak leave of XLA's peak, named."""

  @property
  def peak(self) -> Band:
    return self.bands[self.peak_band]


def forward_backward_boundary(step_passes) -> int | None:
  """The step where the backward pass starts: the cut with the most
  forward steps before it and backward (or recompute) steps from it on;
  None without a backward step. Steps without a pass count for neither."""
  if not any(p in _BACKWARD for p in step_passes):
    return None
  # Score of the cut before step i: forward steps before i, minus backward
  # ones before i (each moves from "after" to "before").
  best, best_score, score = 0, 0, 0
  for i, p in enumerate(step_passes):
    score += 1 if p == 'forward' else -1 if p in _BACKWARD else 0
    if score > best_score:
      best, best_score = i + 1, score
  return best


def timeline_view(report: RematReport, costs: CompiledCosts, *,
                  reference: tuple[str, CompiledCosts] | None = None,
                  max_bands: int = MAX_BANDS) -> TimelineView | None:
  """The timeline of `costs` (compiled under `report`'s policy) cut into
  bands, each with its live buffers; `reference`: (label, costs) of another
  program to draw beside it (e.g. no remat). None without a timeline."""
  timeline = None if costs.failed else costs.timeline
  if timeline is None or not timeline.steps:
    return None
  n = len(timeline.steps)
  boundary = forward_backward_boundary(timeline.step_passes)
  passes = tuple(timeline.passes())
  pass_at = _pass_of_each_step(passes, n)
  residual = timeline.residual_bytes_by_step()
  height = timeline.height
  lists: dict[tuple, int] = {}
  buffers: list[tuple[PeakBuffer, ...]] = []
  bands = []
  for first, last in _cuts(n, max_bands, boundary, timeline.peak_step):
    step = max(range(first, last + 1), key=lambda i: (height[i], timeline.live_bytes[i]))
    live = tuple(live_at_peak(report, costs, step))
    key = tuple((b.buffer, b.bytes, b.kind) for b in live)
    if key not in lists:
      lists[key] = len(buffers)
      buffers.append(live)
    loops = tuple(name for name in timeline.steps[first:last + 1] if _is_loop(name))
    bands.append(Band(first, last, step, timeline.steps[step], height[step],
                      timeline.live_bytes[step], residual[step], pass_at[step], loops,
                      lists[key]))
  peak_band = next(i for i, b in enumerate(bands)
                   if b.first <= timeline.peak_step <= b.last)
  # The peak band is drawn at the timeline's own peak step.
  explained = explain_peak(report, costs)
  return TimelineView(
      report.policy, n, tuple(bands), tuple(buffers), peak_band, timeline.peak_bytes,
      passes, boundary,
      None if reference is None else _reference(reference, n, boundary, max_bands),
      None if explained is None else (explained.listed_bytes, explained.gap_bytes,
                                      explained.gap_reason))


def _cuts(n: int, max_bands: int, boundary: int | None, peak: int) -> list[tuple[int, int]]:
  """(first, last) of each band: equal runs of steps, cut at the boundary
  too (no band straddles it), and the peak step a band of its own start."""
  edges = {round(i * n / max_bands) for i in range(max_bands + 1)} if n > max_bands \
      else set(range(n + 1))
  edges |= {0, n} | ({boundary} if boundary else set())
  if n > max_bands:
    edges.add(peak)  # the peak band shows the peak step itself
  edges = sorted(e for e in edges if 0 <= e <= n)
  return [(a, b - 1) for a, b in zip(edges, edges[1:]) if b > a]


def _pass_of_each_step(passes, n: int) -> list[str]:
  out = [''] * n
  for first, last, name in passes:
    out[first:last + 1] = [name] * (last - first + 1)
  return out


def _is_loop(instruction: str) -> bool:
  return instruction.split('.')[0] == 'while'


def _reference(reference, n: int, boundary: int | None, max_points: int):
  """Another program's heights at x positions of this schedule: its forward
  steps stretched over this forward pass, its backward steps over this
  backward pass (both linearly), so that the passes line up."""
  label, costs = reference
  timeline = None if costs.failed else costs.timeline
  if timeline is None or not timeline.steps:
    return None
  m = len(timeline.steps)
  theirs = forward_backward_boundary(timeline.step_passes)

  def x_of(j: int) -> float:
    if boundary is None or theirs is None or theirs in (0, m) or boundary in (0, n):
      return j * n / m
    if j < theirs:
      return j * boundary / theirs
    return boundary + (j - theirs) * (n - boundary) / (m - theirs)
  # At most `max_points` runs, each drawn at its highest.
  size = max(1, -(-m // max_points))
  points = []
  for start in range(0, m, size):
    stop = min(start + size, m)
    points.append((x_of(start), max(timeline.height[start:stop])))
  points.append((float(n), timeline.height[-1]))
  return label, timeline.peak_bytes, tuple(points)
