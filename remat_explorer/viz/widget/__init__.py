"""The Explorer: ipywidgets that only wire controls to the functions of the
layers below (the ``[lab]`` extra).

* ``explorer``: ``explore`` / ``Explorer``.
* ``_panels``: its HTML pieces, pure functions; ``_search``: the memory
  budget and the search; ``_work``: compiles on workers, results applied on
  the main thread.
* ``viewer_widget`` and ``html_widget``: anywidget views of the diagram and
  of the timeline; ``lab``: the optional dependencies, checked.
"""
