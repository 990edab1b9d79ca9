"""Point labels that do not overlap: grouped where points coincide, placed
where there is room, numbered and listed where there is none.

Several policies often compile to the same peak and FLOPs: their points
coincide and one label lists them all. Each label is then tried at a few
offsets around its point, and the first that overlaps no label already
placed, no point and nothing outside the axes is kept; a label with no free
place becomes a number beside its point, listed under the axes. Placement
measures text in display space, so it runs once the figure's layout is final
(``Figure.draw_without_rendering``), which labels (plain annotations) do not
change.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.transforms import Bbox

from remat_explorer.viz.charts._figures import SMALL_FONT

# Offsets in points around a point: right, left, above, below, then further.
_OFFSETS = [(6, 3, 'left', 'bottom'), (6, -3, 'left', 'top'), (-6, 3, 'right', 'bottom'),
            (-6, -3, 'right', 'top'), (0, 8, 'center', 'bottom'), (0, -8, 'center', 'top'),
            (12, 14, 'left', 'bottom'), (12, -14, 'left', 'top'),
            (-12, 14, 'right', 'bottom'), (-12, -14, 'right', 'top')]
_MARKER_PX = 10.0
"""Half the size of a drawn point and of the ring around a selected one, in
display pixels, kept clear of labels."""


@dataclass
class PointGroup:
  x: float
  y: float
  labels: list[str]

  @property
  def text(self) -> str:
    return ', '.join(self.labels)


def group_points(points: list[tuple[str, float, float]], *,
                 tolerance: float = 0.01) -> list[PointGroup]:
  """Points (label, x, y) merged where they lie within `tolerance` of each
  axis's span of each other (coinciding on the chart); order kept."""
  if not points:
    return []
  xs = [p[1] for p in points]
  ys = [p[2] for p in points]
  dx = (max(xs) - min(xs)) * tolerance
  dy = (max(ys) - min(ys)) * tolerance
  groups: list[PointGroup] = []
  for label, x, y in points:
    for g in groups:
      if abs(g.x - x) <= dx and abs(g.y - y) <= dy:
        g.labels.append(label)
        break
    else:
      groups.append(PointGroup(x, y, [label]))
  return groups


def label_points(ax, groups: list[PointGroup], *,
                 fontsize: float = SMALL_FONT) -> list[str]:
  """Label every group's point on `ax`; returns the footnote lines
  (``'1: a, b'``) of those that got a number, already drawn under the axes.

  The footnote takes room from the axes, which moves the points: placement
  is redone under the new layout until no further label needs a number.
  """
  fig = ax.figure
  numbered: list[int] = []
  for _ in range(len(groups) + 1):
    fig.draw_without_rendering()
    texts, needed = _place(ax, groups, numbered, fontsize)
    if not needed:
      break
    for text in texts:
      text.remove()
    numbered += needed
    fig.supxlabel('\n'.join(_footnotes(groups, numbered)), x=0.01, ha='left',
                  fontsize=fontsize)
  return _footnotes(groups, numbered)


def _footnotes(groups, numbered) -> list[str]:
  return [f'{n}: {groups[i].text}' for n, i in enumerate(numbered, 1)]


def _place(ax, groups, numbered, fontsize):
  """Annotate each group's point where its label overlaps nothing placed;
  groups in `numbered` get their number. Returns the annotations and the
  groups that found no free place for their label."""
  renderer = ax.figure.canvas.get_renderer()
  area = ax.get_window_extent(renderer)
  to_display = ax.transData.transform
  taken = [_marker_box(*to_display((g.x, g.y))) for g in groups]
  texts, needed = [], []
  for i, g in enumerate(groups):
    if i in numbered:
      text = _first_free(ax, g, str(numbered.index(i) + 1), fontsize, renderer, area, taken,
                         last_resort=True)
    else:
      text = _first_free(ax, g, g.text, fontsize, renderer, area, taken)
      if text is None:
        needed.append(i)
        continue
    texts.append(text)
    taken.append(text.get_window_extent(renderer))
  return texts, needed


def _first_free(ax, g: PointGroup, label: str, fontsize, renderer, area, taken,
                last_resort: bool = False):
  for dx, dy, ha, va in _OFFSETS:
    text = ax.annotate(label, (g.x, g.y), xytext=(dx, dy), textcoords='offset points',
                       ha=ha, va=va, fontsize=fontsize)
    text.set_in_layout(False)  # placed after the layout, never moving it
    box = text.get_window_extent(renderer)
    inside = (box.x0 >= area.x0 and box.x1 <= area.x1 and box.y0 >= area.y0
              and box.y1 <= area.y1)
    if inside and not any(box.overlaps(t) for t in taken):
      return text
    if last_resort and (dx, dy) == _OFFSETS[-1][:2]:
      return text  # a number goes somewhere, even crowded: it is listed
    text.remove()
  return None


def _marker_box(x: float, y: float) -> Bbox:
  return Bbox.from_extents(x - _MARKER_PX, y - _MARKER_PX, x + _MARKER_PX, y + _MARKER_PX)

