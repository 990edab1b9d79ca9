"""A Graphviz diagram rendered: ``dot`` run on it, its SVG and its notes.

Shared by the Explorer, its static fallback and the report, so that all say
the same thing when Graphviz's ``dot`` is missing or warns.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import graphviz

from remat_explorer.viz.text import html_text


def to_svg(digraph: graphviz.Digraph) -> str:
  """Render `digraph` to SVG text with Graphviz's ``dot`` binary; its
  warnings are dropped (``render_svg`` keeps them).

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples, viz
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> svg = viz.to_svg(viz.split_graph(rx.analyze(loss_fn, *args)))
    >>> '<svg' in svg, svg.rstrip().endswith('</svg>')
    (True, True)
  """
  return render_svg(digraph).svg


@dataclass(frozen=True)
class RenderedSvg:
  svg: str
  warnings: tuple[str, ...]
  """What ``dot`` wrote on stderr, one line each, duplicates dropped, e.g.
  "Warning: Unable to reclaim box space in spline routing ..." (an edge it
  routed roughly). Kept for a note rather than printed into a notebook."""


def render_svg(digraph: graphviz.Digraph) -> RenderedSvg:
  """Render `digraph` with ``dot -Tsvg``, its stderr captured.

  ``dot`` is run directly rather than through ``graphviz.pipe``, which
  writes the warnings to ``sys.stderr`` (into the notebook cell).
  """
  dot = shutil.which('dot')
  if dot is None:
    raise RuntimeError(
        'Rendering needs the Graphviz `dot` program, which was not found on '
        'PATH. Install Graphviz (`apt-get install graphviz` on Debian/Ubuntu, '
        '`brew install graphviz` on macOS, `conda install graphviz` in conda). '
        'Without it, the diagram is still available as DOT text: '
        '`digraph.source`.')
  run = subprocess.run([dot, '-Tsvg'], input=digraph.source.encode('utf-8'),
                       capture_output=True, check=False)
  stderr = run.stderr.decode('utf-8', errors='replace')
  if run.returncode != 0:
    raise RuntimeError(f'Graphviz dot failed (exit {run.returncode}): {stderr.strip()}')
  warnings = tuple(dict.fromkeys(line.strip() for line in stderr.splitlines() if line.strip()))
  return RenderedSvg(run.stdout.decode('utf-8'), warnings)


@dataclass(frozen=True)
class RenderedDiagram:
  svg: str
  """The ``<svg>`` element (no XML prologue); '' when ``dot`` is missing."""
  notes_html: str
  """What to show beside it: Graphviz's warnings folded away, or, without
  ``dot``, how to install it and the DOT source."""


def render_diagram(digraph: graphviz.Digraph) -> RenderedDiagram:
  try:
    rendered = render_svg(digraph)
  except RuntimeError as e:
    return RenderedDiagram('', f'<p class="warning" style="color:#b00020">{html_text(e)}</p>'
                               f'<pre>{html_text(digraph.source)}</pre>')
  svg = rendered.svg[rendered.svg.index('<svg'):]
  return RenderedDiagram(svg, graphviz_notes_html(rendered.warnings))


def graphviz_notes_html(warnings) -> str:
  """Graphviz's stderr, folded: a line saying it warned, the lines inside."""
  if not warnings:
    return ''
  count = len(warnings)
  return ('<details class="remat-graphviz-notes" style="color:#666;font-size:0.85em">'
          f'<summary>Graphviz reported {count} layout warning{"s" * (count != 1)} '
          '(an edge may be routed roughly)</summary>'
          f'<pre>{html_text(chr(10).join(warnings))}</pre></details>')
