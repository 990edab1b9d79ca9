"""HTML: tables, the interactive timeline and the self-contained report.

Above ``diagram`` and ``charts``, whose outputs it embeds.

* ``captions``: the lines around a view: what it shows, warnings, errors.
* ``tables``: residual, comparison, costs and peak tables, jaxpr listings.
* ``layout_tables``: ``checkpointed_scan`` layouts and nesting levels.
* ``timeline_html``: the memory timeline as inline SVG with the buffers
  live at each step.
* ``html_report``: ``report_html``, one file that opens offline.
* ``snapshot``: ``snapshot_html``, the Explorer as static HTML where its
  widget cannot run (images, tables and text only).
"""
