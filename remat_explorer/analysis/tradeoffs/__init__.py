"""Policies weighed against each other: the answers a user acts on.

The top layer of the analysis, built on ``split`` and ``xla``.

* ``compare``: every policy side by side, compiled and analyzed together;
  ``rows``: what a row and the table hold, and the Pareto front;
  ``row_warnings``: what is wrong with a row's figures;
  ``merged_recompute``: whether XLA dropped the recompute a policy asks for.
* ``search``: the policy that fits a memory budget with the fewest FLOPs;
  ``search_result``: what it answers, in words and as Python;
  ``budget``: that budget, checked and resolved to bytes;
  ``calibration``: the estimate scaled by what a search compiled.
* ``save_units``: what a search can save, priced, and its greedy choice.
* ``layouts``: ``checkpointed_scan``'s schedules, predicted beside measured.
"""
