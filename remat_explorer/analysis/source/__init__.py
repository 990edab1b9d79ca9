"""The user's code: where a value comes from, in the user's terms.

The lowest layer of the analysis; every other reads lines, module paths and
names through it.

* ``origins``: a value's source line, module path and ``checkpoint_name``,
  read from the frames JAX records (cached, cleared by ``clear_caches``).
* ``module_paths``: the module path of an equation read from the parameters
  it uses, where the framework records no module names.
* ``producers``: the equation that really made a value, looked for through
  loops, calls, rounding and offloading.
* ``cells``: notebook code named as its user sees it (``In [12], line 5``).
"""
