"""The Explorer: ipywidgets that only wire controls to the functions of the
layers below (the ``[lab]`` extra).

* ``explorer``: ``explore`` / ``Explorer``.
* ``notebook_output``: its outputs, the widget, then its static snapshot
  (``viz.html.snapshot``) as ``text/html``, which follows the Explorer
  and hides itself where the widget is drawn; ``shared_notebook``: a
  saved notebook's widget views whose state was not saved dropped (``python
  -m remat_explorer share``; needs no widget library).
* ``_panels``: its HTML pieces, pure functions; ``_policy_controls``: which
  policy each block runs under (per block, as an expression, picked
  names); ``_search``: the memory budget and the search, the budget a
  ``budget_slider`` (a labelled range input, anywidget); ``_comparison``:
  the Compare tab and its pick of a row; ``_work``: compiles on workers,
  results applied on the main thread.
* ``viewer_widget``, ``html_widget`` and ``code_widget``: anywidget views of
  the diagram, of the timeline and of a policy as code (copied on a click);
  ``lab``: the optional dependencies, checked.
"""
