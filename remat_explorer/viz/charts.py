"""Matplotlib charts of compiled costs: pure functions from analysis data to a
``Figure``.

Figures are built with ``matplotlib.figure.Figure`` directly, never through
``pyplot``'s global state, so they can be drawn from the Explorer's
background thread and never pile up in a notebook. Memory on every axis is
in KiB/MiB/GiB and FLOPs in kFLOP/MFLOP/GFLOP, scaled to the data.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Mapping

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from remat_explorer.analysis.compare import Comparison, PolicyRow
from remat_explorer.analysis.compiled import CompiledCosts
from remat_explorer.analysis.report import RematReport
from remat_explorer.analysis.sharding import mesh_text
from remat_explorer.viz import _labels
from remat_explorer.viz.text import byte_unit, flop_unit, format_bytes, format_flops

BREAKDOWN_PARTS = ('arguments', 'outputs', 'residuals at peak', 'other temporaries')
BREAKDOWN_COLORS = ('#9ecae1', '#c6dbef', '#d62728', '#fdae6b')
FRONT_COLOR = '#2ca02c'


def _literal_text(plot):
  """Build the figure with mathtext off: labels hold names from the user's
  program, and a ``$`` in one must print as a ``$``, not start a formula
  that fails to render."""
  @functools.wraps(plot)
  def plot_with_literal_text(*args, **kwargs):
    with matplotlib.rc_context({'text.parse_math': False}):
      return plot(*args, **kwargs)
  return plot_with_literal_text


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


@_literal_text
def plot_memory_breakdown(comparison: Comparison) -> Figure:
  """One stacked bar per compiled policy: arguments, outputs, residual
  buffers live at the peak and the other temporaries, as XLA compiled them."""
  rows = [r for r in comparison.rows if not r.failed]
  fig = _figure(figsize=(8, 0.45 * len(rows) + 1.9))
  ax = fig.add_subplot()
  _, scale = _stacked_breakdown_bars(ax, [memory_breakdown(r) for r in rows])
  ax.set_yticks(range(len(rows)), [short_label(r.label) for r in rows])
  ax.invert_yaxis()
  ax.set_xlabel(f'compiled device memory ({_unit_name(format_bytes(scale))})')
  _legend_below(fig, ax)
  ax.set_title(f'{comparison.function}: memory by policy on {comparison.device_kind}')
  failed = [r.label for r in comparison.rows if r.failed]
  if failed:
    # Above the axes: the space below holds the legend.
    fig.suptitle('failed to compile: ' + ', '.join(failed), fontsize='small',
                 color='#b00020', x=0.01, ha='left')
  return fig


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


@_literal_text
def plot_per_device_memory(costs: Comparison | Mapping[str, CompiledCosts]) -> Figure:
  """Compiled memory of one device, one stacked bar per program: arguments,
  outputs, residual buffers live at the peak and the other temporaries.

  `costs`: a ``Comparison`` (a bar per policy), or a mapping from a label to
  ``compile_costs`` results, e.g. the same step on growing meshes. XLA's
  memory analysis of a partitioned executable is what each device holds, so
  the bars show how sharding splits the arguments, the residuals and the
  temporaries.
  """
  if isinstance(costs, Comparison):
    costs = {r.label: r.costs for r in costs.rows}
  shown = {k: c for k, c in costs.items() if not c.failed}
  fig = _figure(figsize=(8, 0.45 * len(shown) + 1.9))
  ax = fig.add_subplot()
  left, scale = _stacked_breakdown_bars(ax, [costs_breakdown(c) for c in shown.values()])
  for i, total in enumerate(left):
    ax.annotate(format_bytes(total * scale), (total, i), xytext=(3, 0),
                textcoords='offset points', va='center', fontsize=8)
  ax.set_xlim(0, max(left, default=1) * 1.15 or 1)  # room for the totals
  # Devices and mesh go on each bar where they differ, else in the title.
  placements = {(c.num_devices, c.mesh_shape) for c in shown.values()}
  labels = [per_device_label(k, c) if len(placements) > 1 else k for k, c in shown.items()]
  ax.set_yticks(range(len(shown)), [short_label(t, 48) for t in labels])
  ax.invert_yaxis()
  ax.set_xlabel(f'compiled memory per device ({_unit_name(format_bytes(scale))})')
  _legend_below(fig, ax)
  functions = sorted({c.function for c in shown.values()})
  kinds = sorted({c.device_kind for c in shown.values()})
  where = (' · ' + placement_text(next(iter(shown.values())))
           if len(placements) == 1 else '')
  ax.set_title(f'{", ".join(functions)}: memory per device on {", ".join(kinds)}{where}')
  failed = [k for k, c in costs.items() if c.failed]
  if failed:
    # Above the axes: the space below holds the legend.
    fig.suptitle('failed to compile: ' + ', '.join(failed), fontsize='small',
                 color='#b00020', x=0.01, ha='left')
  return fig


# -- peak memory against FLOPs ------------------------------------------------------

def pareto_points(comparison: Comparison) -> list[tuple[str, int, int, bool]]:
  """``(label, peak bytes, FLOPs, on the front)`` for each compiled policy;
  FLOPs are the jaxpr's count (trip counts applied), as the charts use."""
  return [(r.label, r.peak_bytes, r.flops, r.on_pareto_front) for r in comparison.rows
          if not r.failed and r.peak_bytes is not None and r.flops is not None]


@_literal_text
def plot_pareto(comparison: Comparison, *, selected: str | None = None,
                search_result=None) -> Figure:
  """Peak memory against FLOPs, one point per policy, with the Pareto front
  drawn, the `selected` policy ringed and the searched policy starred.

  Policies that compile to the same point share one label listing them;
  labels go where they overlap nothing (``_labels``); the legend sits
  outside the data.
  """
  points = pareto_points(comparison)
  fig = _figure(figsize=(9, 5))
  ax = fig.add_subplot()
  extra = [] if search_result is None else [(search_result.peak_bytes, search_result.flops)]
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
  if search_result is not None:
    ax.scatter([search_result.peak_bytes / mem_scale], [search_result.flops / flop_scale],
               marker='*', s=260, color='#ff7f0e', edgecolors='black', zorder=5,
               label=f'searched: {short_label(search_result.label)}')
    ax.axvline(search_result.budget_bytes / mem_scale, color='#ff7f0e', linestyle=':',
               label=f'budget {format_bytes(search_result.budget_bytes)}')
  ax.set_xlabel(f'peak device memory ({_unit_name(format_bytes(mem_scale))})')
  ax.set_ylabel(f'FLOPs, forward + backward ({_unit_name(format_flops(flop_scale))})')
  ax.set_title(f'{comparison.function}: memory against FLOPs on {comparison.device_kind}')
  ax.grid(alpha=0.3)
  ax.margins(0.15)  # room for labels around the outermost points
  _legend_outside(ax)
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


@_literal_text
def plot_residuals_by_origin(report: RematReport) -> Figure:
  """Horizontal bars: residual bytes by origin under one policy."""
  groups = residual_bytes_by_origin(report)
  fig = _figure(figsize=(8, 0.35 * max(len(groups), 1) + 1.4))
  ax = fig.add_subplot()
  scale = byte_unit(max(groups.values(), default=1))
  ax.barh(range(len(groups)), [b / scale for b in groups.values()], color='#d62728')
  ax.set_yticks(range(len(groups)), [short_label(g) for g in groups])
  ax.invert_yaxis()
  for i, b in enumerate(groups.values()):
    ax.annotate(format_bytes(b), (b / scale, i), xytext=(3, 0), textcoords='offset points',
                va='center', fontsize=8)
  ax.set_xlabel(f'residual bytes ({_unit_name(format_bytes(scale))})')
  total = format_bytes(sum(groups.values()))
  ax.set_title(f'{report.function} · {report.policy}: {total} of residuals')
  if not groups:
    ax.text(0.5, 0.5, 'no residuals', transform=ax.transAxes, ha='center')
  return fig


# -- memory along the schedule ---------------------------------------------------------

OVERLAY_AT_MOST = 2
"""Timelines drawn over each other up to this many; more get a panel each."""


@_literal_text
def plot_memory_timeline(costs_by_label: Mapping[str, CompiledCosts], *,
                         reference: str | None = None) -> Figure:
  """Live device bytes along each compiled program's schedule.

  Schedules differ in length, so the x axis is the position in the schedule
  (0 = first instruction, 1 = last). The shaded band under each line is the
  part held by residual buffers; a dot marks each peak. Up to
  `OVERLAY_AT_MOST` programs share one axes; more get one panel each
  (shared axes), with the `reference` label's line (e.g. ``'no remat'``)
  repeated in grey in every panel for comparison.
  """
  shown = {k: c for k, c in costs_by_label.items()
           if not c.failed and c.timeline is not None and c.timeline.steps}
  scale = byte_unit(max((c.timeline.peak_bytes for c in shown.values()), default=1))
  kinds = sorted({c.device_kind for c in shown.values()})
  functions = sorted({c.function for c in shown.values()})
  title = (f'{", ".join(functions)}: memory along the schedule on {", ".join(kinds)}'
           ' (shaded: residual buffers)')
  if len(shown) <= OVERLAY_AT_MOST:
    fig = _figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    for (label, costs), color in zip(shown.items(), _cycle_colors(len(shown))):
      _draw_timeline(ax, costs, scale, color,
                     f'{short_label(label)} (peak {format_bytes(costs.timeline.peak_bytes)})')
    _timeline_axes(ax, scale)
    if shown:
      _legend_outside(ax)
    else:
      ax.text(0.5, 0.5, 'no compiled timeline', transform=ax.transAxes, ha='center')
    ax.set_title(title.replace(' (shaded', '\n(shaded'))
    return fig
  ref = shown.get(reference)
  panels = {k: c for k, c in shown.items() if k != reference}
  cols = 2 if len(panels) <= 4 else 3
  rows = -(-len(panels) // cols)
  fig = _figure(figsize=(4.2 * cols, 2.4 * rows + 0.8))
  axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
  for ax, (label, costs) in zip(axes, panels.items()):
    if ref is not None:
      x = np.linspace(0, 1, len(ref.timeline.steps))
      ax.step(x, np.array(ref.timeline.height) / scale, where='post', color='#999999',
              linewidth=1, label=f'{short_label(reference)} (peak '
              f'{format_bytes(ref.timeline.peak_bytes)})')
    _draw_timeline(ax, costs, scale, '#1f77b4', None)
    ax.set_title(f'{short_label(label)}: peak {format_bytes(costs.timeline.peak_bytes)}',
                 fontsize='medium')
    _timeline_axes(ax, scale, labels=False)
  for ax in axes[len(panels):]:
    ax.set_visible(False)
  fig.supxlabel('position in the compiled schedule')
  fig.supylabel(f'live device memory ({_unit_name(format_bytes(scale))})')
  fig.suptitle(title + (f'; grey: {short_label(reference)}' if ref is not None else ''))
  return fig


def _draw_timeline(ax, costs: CompiledCosts, scale: float, color: str,
                   label: str | None) -> None:
  t = costs.timeline
  x = np.linspace(0, 1, len(t.steps))
  ax.step(x, np.array(t.height) / scale, where="post", color=color, label=label)
  ax.fill_between(x, np.array(t.residual_bytes_by_step()) / scale, step='post', color=color,
                  alpha=0.18)
  ax.scatter([x[t.peak_step]], [t.peak_bytes / scale], color=color, zorder=3, s=25)


def _timeline_axes(ax, scale: float, labels: bool = True) -> None:
  if labels:
    ax.set_xlabel('position in the compiled schedule')
    ax.set_ylabel(f'live device memory ({_unit_name(format_bytes(scale))})')
  ax.grid(alpha=0.3)
  ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f'{v:.0%}'))


# -- helpers ----------------------------------------------------------------------------

def _figure(figsize) -> Figure:
  """A figure with constrained layout and its own Agg canvas, so that text
  can be measured (label placement) without pyplot."""
  fig = Figure(figsize=figsize, layout='constrained')
  FigureCanvasAgg(fig)
  return fig


def _legend_outside(ax) -> None:
  """The legend right of the axes, clear of the data; constrained layout
  makes room for it."""
  if ax.get_legend_handles_labels()[0]:
    ax.legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
              fontsize='small')


def _legend_below(fig: Figure, ax) -> None:
  """The legend in one row under the axes, outside the data."""
  handles, labels = ax.get_legend_handles_labels()
  if handles:
    fig.legend(handles, labels, loc='outside lower center', ncols=len(handles),
               fontsize='small', frameon=False)


def short_label(label: str, limit: int = 36) -> str:
  """`label` cut to `limit` characters: policy labels that list many names
  would otherwise squeeze the axes away (the tables keep them whole)."""
  return label if len(label) <= limit else label[:limit - 1] + '…'


def _unit_name(formatted_one_unit: str) -> str:
  """'1.0 MiB' -> 'MiB': the unit a scale formats to."""
  return formatted_one_unit.split()[-1]


def _cycle_colors(n: int) -> list[str]:
  palette = ['#1f77b4', '#ff7f0e', '#2ca02c', '#9467bd', '#8c564b', '#e377c2',
             '#17becf', '#bcbd22', '#7f7f7f', '#d62728']
  return [palette[i % len(palette)] for i in range(n)]
