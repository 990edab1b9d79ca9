"""What every chart shares: a figure of its own, literal text, legends out
of the data, short labels and units."""

from __future__ import annotations

import base64
import functools
import io

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from remat_explorer.viz.text import html_text


def literal_text(plot):
  """Build the figure with mathtext off: labels hold names from the user's
  program, and a ``$`` in one must print as a ``$``, not start a formula
  that fails to render."""
  @functools.wraps(plot)
  def plot_with_literal_text(*args, **kwargs):
    with matplotlib.rc_context({'text.parse_math': False}):
      return plot(*args, **kwargs)
  return plot_with_literal_text


def new_figure(figsize) -> Figure:
  """A figure with constrained layout and its own Agg canvas, so that text
  can be measured (label placement) without pyplot."""
  fig = Figure(figsize=figsize, layout='constrained')
  FigureCanvasAgg(fig)
  return fig


def legend_outside(ax) -> None:
  """The legend right of the axes, clear of the data; constrained layout
  makes room for it."""
  if ax.get_legend_handles_labels()[0]:
    ax.legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
              fontsize='small')


def legend_below(fig: Figure, ax) -> None:
  """The legend in one row under the axes, outside the data."""
  handles, labels = ax.get_legend_handles_labels()
  if handles:
    fig.legend(handles, labels, loc='outside lower center', ncols=len(handles),
               fontsize='small', frameon=False)


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
  buffer = io.BytesIO()
  figure.savefig(buffer, format='png', dpi=110, bbox_inches='tight')
  return 'data:image/png;base64,' + base64.b64encode(buffer.getvalue()).decode('ascii')


def chart_img(figure: Figure, alt: str = '', css_class: str = 'chart') -> str:
  return (f'<img class="{css_class}" style="max-width:100%" alt="{html_text(alt)}" '
          f'src="{figure_png_data_uri(figure)}">')
