"""Visualization: pure rendering functions of the analysis data, and widgets.

Planned (see the project's issues): Graphviz split diagrams, matplotlib cost
charts and an ipywidgets Explorer. Nothing is exported yet.
"""
