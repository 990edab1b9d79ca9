"""Memory along compiled schedules as a matplotlib chart (the report's view
of every policy at once; the interactive one of a single program is
``timeline_html``).

Each program's schedule is drawn in its own steps; where several share an
axes, the others' forward and backward passes are stretched onto the first
one's (``timeline_view.forward_backward_boundary``), so that the passes
line up. A strip under each axes colours its program's steps by pass, a
dashed line marks where the backward pass starts, and the peak is labelled
with its bytes.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from remat_explorer.analysis import CompiledCosts, MemoryTimeline
from remat_explorer.viz.charts._figures import (MAX_WIDTH_INCHES, SMALL_FONT, cycle_colors,
                                                legend_outside, literal_text, new_figure,
                                                short_label, unit_name)
from remat_explorer.viz.text import byte_unit, format_bytes
from remat_explorer.viz.charts.timeline_view import PASS_COLORS, forward_backward_boundary

OVERLAY_AT_MOST = 2
"""Timelines drawn over each other up to this many; more get a panel each."""
REFERENCE_COLOR = '#999999'


@literal_text
def plot_memory_timeline(costs_by_label: Mapping[str, CompiledCosts], *,
                         reference: str | None = None) -> Figure:
  """Device bytes along each compiled program's schedule.

  The x axis is the schedule of the axes' first program, in run order,
  its forward and backward passes named under it; other programs on the
  same axes are stretched to line up with those passes. The shaded band
  under each line is the part held by residual buffers; each peak is
  marked with its bytes. Up to `OVERLAY_AT_MOST` programs share one axes;
  more get one panel each, with the `reference` label's line (e.g.
  ``'no remat'``) repeated in grey in every panel for comparison.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> costs = {'as written': rx.compile_costs(loss_fn, *args),
    ...          'no remat': rx.compile_costs(loss_fn, *args, policy=rx.analysis.NO_REMAT)}
    >>> type(viz.plot_memory_timeline(costs, reference='no remat')).__name__
    'Figure'
  """
  shown = {k: c for k, c in costs_by_label.items()
           if not c.failed and c.timeline is not None and c.timeline.steps}
  scale = byte_unit(max((c.timeline.peak_bytes for c in shown.values()), default=1))
  kinds = sorted({c.device_kind for c in shown.values()})
  functions = sorted({c.function for c in shown.values()})
  title = (f'{", ".join(functions)}: memory along the schedule on {", ".join(kinds)}'
           ' (shaded: residual buffers)')
  if len(shown) <= OVERLAY_AT_MOST:
    return _overlaid(shown, scale, title)
  ref = shown.get(reference)
  panels = {k: c for k, c in shown.items() if k != reference}
  # Two columns at most: a third would make each panel too small to read
  # at the charts' widest (``_figures``).
  cols = 2
  rows = -(-len(panels) // cols)
  fig = new_figure(figsize=(MAX_WIDTH_INCHES, 2.6 * rows + 0.8))
  axes = fig.subplots(rows, cols, sharey=True, squeeze=False).ravel()
  for ax, (label, costs) in zip(axes, panels.items()):
    if ref is not None:
      ax.step(_steps_x(ref.timeline, costs.timeline), _curve(ref.timeline.height, scale),
              where='post', color=REFERENCE_COLOR, linewidth=1,
              label=f'{short_label(reference)} (peak {format_bytes(ref.timeline.peak_bytes)})')
    _draw(ax, costs.timeline, costs.timeline, scale, '#1f77b4', None, mark_peak=False)
    ax.set_title(f'{short_label(label)}: peak {format_bytes(costs.timeline.peak_bytes)}',
                 fontsize='medium')
    _passes_axis(ax, costs.timeline)
  for ax in axes[len(panels):]:
    ax.set_visible(False)
  fig.supxlabel("each policy's compiled step in run order, by pass"
                + (f' ({short_label(reference)} aligned to its passes)' if ref else ''))
  fig.supylabel(f'device memory ({unit_name(format_bytes(scale))})')
  fig.suptitle(title + (f'; grey: {short_label(reference)}' if ref is not None else ''))
  return fig


def _overlaid(shown: dict[str, CompiledCosts], scale: float, title: str) -> Figure:
  fig = new_figure(figsize=(MAX_WIDTH_INCHES, 4.5))
  ax = fig.add_subplot()
  first = next(iter(shown.values())).timeline if shown else None
  for (label, costs), color in zip(shown.items(), cycle_colors(len(shown))):
    _draw(ax, costs.timeline, first, scale, color,
          f'{short_label(label)} (peak {format_bytes(costs.timeline.peak_bytes)})')
  ax.set_ylabel(f'device memory ({unit_name(format_bytes(scale))})')
  if first is not None:
    _passes_axis(ax, first)
    others = ' (the other aligned to its passes)' if len(shown) > 1 else ''
    ax.set_xlabel(f'compiled step of {short_label(next(iter(shown)))} in run order{others}')
    legend_outside(ax)
  else:
    ax.text(0.5, 0.5, 'no compiled timeline', transform=ax.transAxes, ha='center')
  ax.set_title(title.replace(' (shaded', '\n(shaded'))
  return fig


def _draw(ax, timeline: MemoryTimeline, onto: MemoryTimeline, scale: float, color: str,
          label: str | None, mark_peak: bool = True) -> None:
  x = _steps_x(timeline, onto)
  ax.step(x, _curve(timeline.height, scale), where='post', color=color, label=label)
  ax.fill_between(x, _curve(timeline.residual_bytes_by_step(), scale), step='post',
                  color=color, alpha=0.18)
  px, py = x[timeline.peak_step], timeline.peak_bytes / scale
  ax.scatter([px], [py], color=color, zorder=3, s=25)
  if mark_peak:
    ax.annotate(f'peak {format_bytes(timeline.peak_bytes)}', (px, py), xytext=(0, 5),
                textcoords='offset points', ha='center', va='bottom', fontsize=SMALL_FONT,
                color=color)


def _curve(values, scale: float) -> np.ndarray:
  """`values` per step, and the last again where the schedule ends."""
  return np.append(np.asarray(values, dtype=float), values[-1]) / scale


def _steps_x(timeline: MemoryTimeline, onto: MemoryTimeline) -> np.ndarray:
  """Where each step of `timeline` starts (and, last, where it ends), in
  steps of `onto`'s schedule: itself, or its passes stretched onto
  `onto`'s (forward onto forward, backward onto backward)."""
  n, m = len(onto.steps), len(timeline.steps)
  j = np.arange(m + 1, dtype=float)
  if timeline is onto:
    return j
  theirs = forward_backward_boundary(timeline.step_passes)
  ours = forward_backward_boundary(onto.step_passes)
  if theirs in (None, 0, m) or ours in (None, 0, n):
    return j * n / m
  return np.where(j < theirs, j * ours / theirs,
                  ours + (j - theirs) * (n - ours) / (m - theirs))


def _passes_axis(ax, timeline: MemoryTimeline) -> None:
  """Under the axes, `timeline`'s steps coloured by pass; the x axis
  names the forward and backward passes; a dashed line where the backward
  pass starts."""
  n = len(timeline.steps)
  strip = blended_transform_factory(ax.transData, ax.transAxes)
  for first, last, name in timeline.passes():
    if name:
      ax.add_patch(_bar(first, last + 1 - first, PASS_COLORS[name], strip))
  boundary = forward_backward_boundary(timeline.step_passes)
  ax.set_xlim(0, n)
  ax.margins(y=0.1)  # room for the peak's label
  ax.grid(alpha=0.3, axis='y')
  if boundary is None:
    ax.set_xticks([n / 2], ['forward (no backward pass)'])
    return
  ax.axvline(boundary, color='#222222', linestyle='--', linewidth=1)
  ax.set_xticks([boundary / 2, (boundary + n) / 2],
                [f'forward\nsteps 0–{boundary - 1}', f'backward\nsteps {boundary}–{n - 1}'])
  ax.tick_params(axis='x', length=0)
  for tick, name in zip(ax.get_xticklabels(), ('forward', 'backward')):
    tick.set_color(PASS_COLORS[name])


def _bar(start: float, width: float, color: str, transform):
  from matplotlib.patches import Rectangle
  return Rectangle((start, 0), width, 0.025, transform=transform, color=color,
                   linewidth=0, zorder=4)
