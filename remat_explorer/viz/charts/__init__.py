"""Matplotlib charts of the analysis's data, pure functions to a ``Figure``.

* ``costs``: memory breakdown, Pareto front, residuals by origin, memory per
  device.
* ``timeline_chart``: memory along compiled schedules.
* ``timeline_view``: what a memory timeline shows, as plain data (also drawn
  as HTML by ``viz.html.timeline_html``).
* ``_figures``: what every chart shares (figures, labels, PNG embedding);
  ``_labels``: point labels that do not overlap.
"""
