"""Matplotlib charts of compiled costs: pure functions from analysis data to a
``Figure``.

Figures are built with ``matplotlib.figure.Figure`` directly, never through
``pyplot``'s global state, so they can be drawn from the Explorer's
background thread and never pile up in a notebook. Memory on every axis is
in KiB/MiB/GiB and FLOPs in kFLOP/MFLOP/GFLOP, scaled to the data.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping

import numpy as np
from matplotlib.figure import Figure

from remat_explorer.analysis import (Comparison, PolicyRow, CompiledCosts, RematReport,
                                    mesh_text)
from remat_explorer.viz.charts import _labels
from remat_explorer.viz.charts._figures import (MAX_WIDTH_INCHES, SMALL_FONT, legend_below,
                                                legend_outside, literal_text, new_figure,
                                                short_label, unit_name)
from remat_explorer.viz.text import byte_unit, flop_unit, format_bytes, format_flops

BREAKDOWN_PARTS = ('arguments', 'outputs', 'residuals at peak', 'other temporaries')
BREAKDOWN_COLORS = ('#9ecae1', '#c6dbef', '#d62728', '#fdae6b')
FRONT_COLOR = '#2ca02c'


# -- memory by policy -------------------------------------------------------------

def memory_breakdown(row: PolicyRow) -> dict[str, int]:
  """A compiled row's device bytes split into `BREAKDOWN_PARTS`.

  Arguments, outputs and temporaries are XLA's ``memory_analysis``; the
  residual share of the temporaries is the residual buffers live at the
  compiled schedule's peak (0 when no timeline could be derived).
  """
  return costs_breakdown(row.costs)


def costs_breakdown(costs: CompiledCosts) -> dict[str, int]:
  """`memory_breakdown` of one compiled program: per device when it is
  partitioned, as XLA's figures are."""
  timeline = costs.timeline
  residuals = 0 if timeline is None else timeline.residual_bytes_at(timeline.peak_step)
  temp = costs.temp_bytes or 0
  residuals = min(residuals, temp)
  return {'arguments': costs.argument_bytes or 0, 'outputs': costs.output_bytes or 0,
          'residuals at peak': residuals, 'other temporaries': temp - residuals}


@literal_text
def plot_memory_breakdown(comparison: Comparison) -> Figure:
  """One stacked bar per compiled policy: arguments, outputs, residual
  buffers live at the peak and the other temporaries, as XLA compiled them.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> fig = viz.plot_memory_breakdown(rx.compare(loss_fn, *args, policies=['dots_saveable']))
    >>> type(fig).__name__
    'Figure'
  """
  rows = [r for r in comparison.rows if not r.failed]
  fig = new_figure(figsize=(8, 0.45 * len(rows) + 1.9))
  ax = fig.add_subplot()
  _, scale = _stacked_breakdown_bars(ax, [memory_breakdown(r) for r in rows])
  ax.set_yticks(range(len(rows)), [short_label(r.label) for r in rows])
  ax.invert_yaxis()
  _device_memory_line(ax, comparison.device_memory_bytes, scale, ax.get_xlim()[1], 'x')
  ax.set_xlabel(f'compiled device memory ({unit_name(format_bytes(scale))})')
  legend_below(fig, ax)
  ax.set_title(f'{comparison.function}: memory by policy on {_device_words(comparison)}')
  failed = [r.label for r in comparison.rows if r.failed]
  if failed:
    # Above the axes: the space below holds the legend.
    fig.suptitle('failed to compile: ' + ', '.join(failed), fontsize=SMALL_FONT,
                 color='#b00020', x=0.01, ha='left')
  return fig


def _device_words(comparison: Comparison) -> str:
  """``'TPU v5 lite (16 GiB)'``: the device and, where known, its memory."""
  memory = comparison.device_memory_bytes
  return comparison.device_kind + (f' ({format_bytes(memory)})' if memory else '')


DEVICE_MEMORY_SHOWN = 0.5
"""The device's memory is drawn as a line where the largest figure on the
axis reaches this share of it: nearer, whether it fits is the question;
farther, the line would squash every bar to the axis (the title says it)."""


def _device_memory_line(ax, memory: int | None, scale: float, largest: float, axis: str):
  if not memory or largest < DEVICE_MEMORY_SHOWN * memory / scale:
    return
  draw = ax.axvline if axis == 'x' else ax.axhline
  draw(memory / scale, color='#b00020', linestyle='-.', linewidth=1.2,
       label=f'device memory {format_bytes(memory)}')


def _stacked_breakdown_bars(ax, parts: list[dict[str, int]]) -> tuple[np.ndarray, float]:
  """One horizontal bar per breakdown, its `BREAKDOWN_PARTS` stacked; returns
  the bars' ends (in the axis unit) and the byte scale of that unit."""
  scale = byte_unit(max((sum(p.values()) for p in parts), default=1))
  ends = np.zeros(len(parts))
  for part, color in zip(BREAKDOWN_PARTS, BREAKDOWN_COLORS):
    widths = np.array([p[part] for p in parts], dtype=float) / scale
    ax.barh(range(len(parts)), widths, left=ends, color=color, label=part)
    ends += widths
  return ends, scale


# -- memory per device ---------------------------------------------------------------

def placement_text(costs: CompiledCosts) -> str:
  """``'8 devices (data=2 × model=4)'``: what a program is partitioned over."""
  mesh = mesh_text(costs.mesh_shape)
  where = f'{costs.num_devices} device' + ('s' if costs.num_devices != 1 else '')
  return where + (f' ({mesh})' if mesh else '')


def per_device_label(label: str, costs: CompiledCosts) -> str:
  """`label` with the devices and mesh its program is partitioned over."""
  return f'{label} · {placement_text(costs)}'


@literal_text
def plot_per_device_memory(costs: Comparison | Mapping[str, CompiledCosts]) -> Figure:
  """Compiled memory of one device, one stacked bar per program: arguments,
  outputs, residual buffers live at the peak and the other temporaries.

  `costs`: a ``Comparison`` (a bar per policy), or a mapping from a label to
  ``compile_costs`` results, e.g. the same step on growing meshes. XLA's
  memory analysis of a partitioned executable is what each device holds, so
  the bars show how sharding splits the arguments, the residuals and the
  temporaries.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> costs = {p: rx.compile_costs(loss_fn, *args, policy=p)
    ...          for p in ('nothing_saveable', 'everything_saveable')}
    >>> type(viz.plot_per_device_memory(costs)).__name__
    'Figure'
  """
  if isinstance(costs, Comparison):
    costs = {r.label: r.costs for r in costs.rows}
  shown = {k: c for k, c in costs.items() if not c.failed}
  fig = new_figure(figsize=(8, 0.45 * len(shown) + 1.9))
  ax = fig.add_subplot()
  left, scale = _stacked_breakdown_bars(ax, [costs_breakdown(c) for c in shown.values()])
  for i, total in enumerate(left):
    ax.annotate(format_bytes(total * scale), (total, i), xytext=(3, 0),
                textcoords='offset points', va='center', fontsize=SMALL_FONT)
  ax.set_xlim(0, max(left, default=1) * 1.15 or 1)  # room for the totals
  memories = {c.device_memory_bytes for c in shown.values()}
  if len(memories) == 1:
    _device_memory_line(ax, memories.pop(), scale, max(left, default=0), 'x')
  # Devices and mesh go on each bar where they differ, else in the title.
  placements = {(c.num_devices, c.mesh_shape) for c in shown.values()}
  labels = [per_device_label(k, c) if len(placements) > 1 else k for k, c in shown.items()]
  ax.set_yticks(range(len(shown)), [short_label(t, 48) for t in labels])
  ax.invert_yaxis()
  ax.set_xlabel(f'compiled memory per device ({unit_name(format_bytes(scale))})')
  legend_below(fig, ax)
  functions = sorted({c.function for c in shown.values()})
  kinds = sorted({c.device_kind for c in shown.values()})
  where = (' · ' + placement_text(next(iter(shown.values())))
           if len(placements) == 1 else '')
  ax.set_title(f'{", ".join(functions)}: memory per device on {", ".join(kinds)}{where}')
  failed = [k for k, c in costs.items() if c.failed]
  if failed:
    # Above the axes: the space below holds the legend.
    fig.suptitle('failed to compile: ' + ', '.join(failed), fontsize=SMALL_FONT,
                 color='#b00020', x=0.01, ha='left')
  return fig


# -- peak memory against FLOPs ------------------------------------------------------

def pareto_points(comparison: Comparison) -> list[tuple[str, int, int, bool]]:
  """``(label, peak bytes, FLOPs, on the front)`` for each compiled policy;
  FLOPs are the jaxpr's count (trip counts applied), as the charts use."""
  return [(r.label, r.peak_bytes, r.ranked_flops, r.on_pareto_front) for r in comparison.rows
          if not r.failed and r.peak_bytes is not None and r.ranked_flops is not None]


@literal_text
def plot_pareto(comparison: Comparison, *, selected: str | None = None,
                search_result=None) -> Figure:
  """Peak memory against FLOPs, one point per policy, with the Pareto front
  drawn, the `selected` policy ringed and the searched policy starred.

  Policies that compile to the same point share one label listing them;
  labels go where they overlap nothing (``_labels``); the legend sits
  outside the data.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> comparison = rx.compare(loss_fn, *args, policies=['dots_saveable'])
    >>> fig = viz.plot_pareto(comparison, selected='dots_saveable')
    >>> type(fig).__name__
    'Figure'
  """
  points = pareto_points(comparison)
  fig = new_figure(figsize=(MAX_WIDTH_INCHES, 5))
  ax = fig.add_subplot()
  # A search whose every candidate XLA refused for memory has no point.
  searched = search_result is not None and search_result.peak_bytes is not None
  extra = [(search_result.peak_bytes, search_result.flops)] if searched else []
  mem_scale = byte_unit(max([p[1] for p in points] + [m for m, _ in extra], default=1))
  flop_scale = flop_unit(max([p[2] for p in points] + [f for _, f in extra], default=1))
  for label, peak, flops, on_front in points:
    x, y = peak / mem_scale, flops / flop_scale
    ax.scatter([x], [y], s=45, zorder=3, color=FRONT_COLOR if on_front else '#7f7f7f')
    if label == selected:
      ax.scatter([x], [y], s=220, facecolors='none', edgecolors='#1f77b4', linewidths=2,
                 zorder=4, label=f'selected: {short_label(label)}')
  front = sorted((p[1], p[2]) for p in points if p[3])
  if front:
    xs, ys = zip(*front)
    ax.step(np.array(xs) / mem_scale, np.array(ys) / flop_scale, where='post',
            color=FRONT_COLOR, linestyle='--', zorder=2, label='Pareto front')
  if searched:
    ax.scatter([search_result.peak_bytes / mem_scale], [search_result.flops / flop_scale],
               marker='*', s=260, color='#ff7f0e', edgecolors='black', zorder=5,
               label=f'searched: {short_label(search_result.label)}')
  if search_result is not None:
    ax.axvline(search_result.budget_bytes / mem_scale, color='#ff7f0e', linestyle=':',
               label=f'budget {format_bytes(search_result.budget_bytes)}')
  _device_memory_line(ax, comparison.device_memory_bytes, mem_scale,
                      max([p[1] for p in points], default=0) / mem_scale, 'x')
  ax.set_xlabel(f'peak device memory ({unit_name(format_bytes(mem_scale))})')
  ax.set_ylabel(f'FLOPs, forward + backward ({unit_name(format_flops(flop_scale))})')
  ax.set_title(f'{comparison.function}: memory against FLOPs on {_device_words(comparison)}')
  ax.grid(alpha=0.3)
  ax.margins(0.15)  # room for labels around the outermost points
  legend_outside(ax)
  groups = _labels.group_points([(short_label(label), peak / mem_scale, flops / flop_scale)
                                 for label, peak, flops, _ in points])
  _labels.label_points(ax, groups)
  return fig


# -- residuals by origin ------------------------------------------------------------

def residual_bytes_by_origin(report: RematReport) -> dict[str, int]:
  """Residual bytes grouped by where they come from: a ``checkpoint_name``,
  an argument, or the primitive that produced them."""
  groups: dict[str, int] = defaultdict(int)
  for r in report.residuals:
    if r.name is not None:
      key = f'name: {r.name}'
    elif r.kind == 'argument':
      key = 'arguments'
    elif r.primitive is not None:
      key = f'primitive: {r.primitive}'
    else:
      key = r.kind
    groups[key] += r.bytes
  return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


_TITLE_CHARS = 64
"""The most characters of a title that fit the figure's width (about 7.5
pt each at its size): the figure is not widened to fit its text."""


@literal_text
def plot_residuals_by_origin(report: RematReport) -> Figure:
  """Horizontal bars: residual bytes by origin under one policy.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> fig = viz.plot_residuals_by_origin(rx.analyze(loss_fn, *args))
    >>> type(fig).__name__
    'Figure'
  """
  groups = residual_bytes_by_origin(report)
  fig = new_figure(figsize=(8, 0.35 * max(len(groups), 1) + 1.4))
  ax = fig.add_subplot()
  scale = byte_unit(max(groups.values(), default=1))
  ax.barh(range(len(groups)), [b / scale for b in groups.values()], color='#d62728')
  ax.set_yticks(range(len(groups)), [short_label(g) for g in groups])
  ax.invert_yaxis()
  for i, b in enumerate(groups.values()):
    ax.annotate(format_bytes(b), (b / scale, i), xytext=(3, 0), textcoords='offset points',
                va='center', fontsize=SMALL_FONT)
  ax.set_xlabel(f'residual bytes ({unit_name(format_bytes(scale))})')
  total = format_bytes(sum(groups.values()))
  title = f'{report.function} · {report.policy}: {total} of residuals'
  if len(title) > _TITLE_CHARS:  # the policy on a line of its own, cut (the tables give it whole)
    title = (f'{short_label(report.function, _TITLE_CHARS)}: {total} of residuals\n'
             f'{short_label(report.policy, _TITLE_CHARS)}')
  ax.set_title(title)
  if not groups:
    ax.text(0.5, 0.5, 'no residuals', transform=ax.transAxes, ha='center')
  return fig
