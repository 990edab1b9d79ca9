"""Visualization: pure rendering functions of the analysis data, and widgets.

* ``split_graph(report) -> graphviz.Digraph`` and ``to_svg`` / ``render_svg``:
  the known/staged split of each remat block, residual edges highlighted.
* ``diagram.viewer`` / ``widget.viewer_widget.DiagramViewer``: the diagram at natural size
  with pan and zoom (vendored d3-zoom), in the widget and the report.
* ``plot_memory_breakdown``, ``plot_pareto``, ``plot_residuals_by_origin``,
  ``plot_memory_timeline``, ``plot_per_device_memory``: matplotlib figures
  of compiled costs, sized to be shown unscaled (``charts._figures``).
* ``residual_table_html``, ``comparison_table_html``, ``report_jaxprs_html``,
  ``peak_table_html``: HTML tables and jaxpr listings.
* ``timeline_view`` / ``timeline_html``: the memory timeline as data and as
  inline SVG whose bands list the buffers live there (hover, click).
* ``report_html``: a self-contained HTML report (every compared policy's
  split diagram, each opened by a click).
* ``html.snapshot.snapshot_html``: the Explorer as static HTML (images of
  SVG, tables, text) for where widgets do not run; shown in a notebook,
  the Explorer's second output (``widget.notebook_output``).
* ``explore(f, *args)`` / ``Explorer``: the ipywidgets Explorer, which only
  wires controls to the functions above (``_work`` runs its compiles on
  workers and applies their results on the main thread).

Layers, each importing only those before it (``tests/test_conventions.py``
checks it); each subpackage's ``__init__`` lists its modules: ``text``
(figures and escaping, shared), ``diagram``, ``charts``, ``html``,
``widget``.
"""

from remat_explorer.viz.charts.costs import (plot_memory_breakdown, plot_pareto,
                                            plot_per_device_memory, plot_residuals_by_origin)
from remat_explorer.viz.charts.timeline_chart import plot_memory_timeline
from remat_explorer.viz.diagram.render import render_svg, to_svg
from remat_explorer.viz.diagram.split_graph import split_graph
from remat_explorer.viz.html.html_report import report_html
from remat_explorer.viz.html.tables import (comparison_table_html, jaxpr_html, peak_table_html,
                                            report_jaxprs_html, residual_table_html)
from remat_explorer.viz.widget.explorer import Explorer, explore
from remat_explorer.viz.html.snapshot import StaticView
from remat_explorer.viz.text import format_bytes, format_flops, memory_share_text

__all__ = [
    'split_graph', 'to_svg', 'render_svg', 'plot_memory_breakdown', 'plot_pareto',
    'plot_residuals_by_origin', 'plot_memory_timeline', 'plot_per_device_memory',
    'residual_table_html', 'peak_table_html',
    'comparison_table_html', 'jaxpr_html', 'report_jaxprs_html', 'report_html',
    'explore', 'Explorer', 'StaticView', 'format_bytes', 'format_flops', 'memory_share_text',
]
