"""What every chart shares: a figure of its own, readable literal text,
legends out of the data, short labels and units.

A chart is a PNG shown at its natural size, and that size is chosen so
that its text is readable. An image scaled down to fit its container
scales its text with it (a 9-inch figure at 72 dpi in a notebook showed
8 px labels), so every figure is drawn at `CHART_DPI`, in the notebook
(IPython draws a figure at its own dpi) and in ``chart_img`` alike, with
no text under `MIN_TEXT_PX` at that size, and at most `MAX_WIDTH_INCHES`
wide: 860 px, which fits a JupyterLab cell at a 1440-px window (900-1100
px) and the report unscaled. ``chart_img`` never lets a page shrink it: a
narrower container scrolls it sideways. SVG would shrink the same way when
scaled, and would weigh more for the long timelines; a PNG keeps the report
small and a notebook's outputs plain images.
"""

from __future__ import annotations

import base64
import functools
import io

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from remat_explorer.viz.text import html_text


CHART_DPI = 100
"""Pixels per inch of every chart, wherever it is shown."""
MIN_TEXT_PX = 12
"""The smallest text of a chart at its natural size, in px: 11 px is the
least that reads comfortably, and this leaves room for a page that zooms
out a little."""
SMALL_FONT = MIN_TEXT_PX * 72 / CHART_DPI
"""Points of the smallest text (legends, annotations, footnotes): 8.64 pt.
Matplotlib's relative sizes ('small' is 0.83 of the base) are not used."""
MAX_WIDTH_INCHES = 8.6
"""The widest a figure is drawn, 860 px at `CHART_DPI`."""
_TEXT_SETTINGS = {
    # Labels hold names from the user's program: a ``$`` in one prints as a
    # ``$`` rather than starting a formula that fails to render.
    'text.parse_math': False,
    'font.size': 10, 'axes.titlesize': 11, 'axes.labelsize': 10, 'xtick.labelsize': 10,
    'ytick.labelsize': 10, 'legend.fontsize': SMALL_FONT, 'legend.title_fontsize': 10,
    'figure.titlesize': 11, 'figure.labelsize': 10,
}


def literal_text(plot):
  """Build the figure under the charts' text settings: mathtext off, and
  every size absolute and at least `SMALL_FONT`."""
  @functools.wraps(plot)
  def plot_with_literal_text(*args, **kwargs):
    with matplotlib.rc_context(_TEXT_SETTINGS):
      return plot(*args, **kwargs)
  return plot_with_literal_text


def new_figure(figsize) -> Figure:
  """A figure at `CHART_DPI`, at most `MAX_WIDTH_INCHES` wide, with
  constrained layout and its own Agg canvas, so that text can be measured
  (label placement) without pyplot."""
  width, height = figsize
  fig = Figure(figsize=(min(width, MAX_WIDTH_INCHES), height), dpi=CHART_DPI,
               layout='constrained')
  FigureCanvasAgg(fig)
  return fig


def legend_outside(ax) -> None:
  """The legend right of the axes, clear of the data; constrained layout
  makes room for it."""
  if ax.get_legend_handles_labels()[0]:
    ax.legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
              fontsize=SMALL_FONT)


def legend_below(fig: Figure, ax) -> None:
  """The legend in one row under the axes, outside the data."""
  handles, labels = ax.get_legend_handles_labels()
  if handles:
    fig.legend(handles, labels, loc='outside lower center', ncols=len(handles),
               fontsize=SMALL_FONT, frameon=False)


def short_label(label: str, limit: int = 36) -> str:
  """`label` cut to `limit` characters: policy labels that list many names
  would otherwise squeeze the axes away (the tables keep them whole)."""
  return label if len(label) <= limit else label[:limit - 1] + '…'


def unit_name(formatted_one_unit: str) -> str:
  """'1.0 MiB' -> 'MiB': the unit a scale formats to."""
  return formatted_one_unit.split()[-1]


def cycle_colors(n: int) -> list[str]:
  palette = ['#1f77b4', '#ff7f0e', '#2ca02c', '#9467bd', '#8c564b', '#e377c2',
             '#17becf', '#bcbd22', '#7f7f7f', '#d62728']
  return [palette[i % len(palette)] for i in range(n)]


def figure_png_data_uri(figure: Figure) -> str:
  """`figure` as a PNG data URI, exactly its size at `CHART_DPI`.

  Its constrained layout already fits its contents into the figure. A
  ``bbox_inches='tight'`` save draws the figure twice (once to measure
  what it holds: a comparison's four charts took 908 ms rather than 764)
  and lets text wider than the figure widen the image past
  `MAX_WIDTH_INCHES`."""
  buffer = io.BytesIO()
  figure.savefig(buffer, format='png', dpi=CHART_DPI)
  return 'data:image/png;base64,' + base64.b64encode(buffer.getvalue()).decode('ascii')


def chart_img(figure: Figure, alt: str = '', css_class: str = 'chart') -> str:
  """`figure` as an ``<img>`` at its natural size (never scaled down, its
  text would shrink with it), in a box that scrolls sideways where the
  page is narrower."""
  return (f'<div class="remat-chart" style="overflow-x:auto;max-width:100%">'
          f'<img class="{css_class}" style="max-width:none" alt="{html_text(alt)}" '
          f'src="{figure_png_data_uri(figure)}"></div>')
