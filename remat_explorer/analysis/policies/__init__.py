"""Policies as data: described in words, written as text, and the one the
search returns.

Above ``source`` (a policy's description names the user's lines); below
``program`` (which sets policies on blocks).

* ``policy_info``: what a policy is in words, and its silent mistakes.
* ``policy_text``: policies written as text and parsed back, safely.
* ``chosen_policy``: ``SaveChosen``, the search's answer, and its source.
* ``policy_source``: any policy choice as Python that needs only JAX.
"""
