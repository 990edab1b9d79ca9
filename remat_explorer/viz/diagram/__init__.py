"""The split diagram: the analysis's plain graph drawn with Graphviz.

The lowest layer of the rendering, beside ``viz.text``.

* ``split_graph``: ``split_diagram`` / ``split_graph`` of a report.
* ``_grouped``: equations gathered by module path or function, opened one
  level at a time; ``_graph``: the drawing as data; ``_summarize``: a large
  drawing kept under a node budget.
* ``render``: ``dot`` run on a diagram, its SVG and its warnings.
* ``viewer``: the pan-and-zoom viewer (``static/``) and the image fallback.
"""
