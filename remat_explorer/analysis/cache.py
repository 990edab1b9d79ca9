"""Bounded caches of analysis results, and ``clear_caches``.

``analyze`` and ``compile_costs`` keep their results, keyed on everything
that changes the answer (``Problem.cache_key``: the function, its argument
types and held values, the policy, argnums, has_aux, donation, the device,
the mesh and the enclosing lowering strategy). Each cache holds the most
recently used entries only: a compiled result holds its jaxprs, HLO
readings and timeline, so an unbounded cache would grow with every policy
a session tries.
"""

from __future__ import annotations

import collections
import threading

_caches: list['ResultCache'] = []
_memoized: list = []


class ResultCache:
  """A least-recently-used mapping of at most `max_entries` results."""

  def __init__(self, max_entries: int):
    self.max_entries = max_entries
    self._entries: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()  # the Explorer's threads share the caches
    _caches.append(self)

  def get(self, key):
    if key is None:
      return None
    with self._lock:
      value = self._entries.get(key)
      if value is not None:
        self._entries.move_to_end(key)
      return value

  def put(self, key, value) -> None:
    if key is None:
      return
    with self._lock:
      self._entries[key] = value
      self._entries.move_to_end(key)
      while len(self._entries) > self.max_entries:
        self._entries.popitem(last=False)

  def setdefault(self, key, value):
    """The entry of `key` if there is one, else `value`, entered: one step,
    so that of two threads entering one key, one wins and the other sees it."""
    if key is None:
      return value
    with self._lock:
      first = self._entries.setdefault(key, value)
      self._entries.move_to_end(key)
      while len(self._entries) > self.max_entries:
        self._entries.popitem(last=False)
      return first

  def pop(self, key):
    """The entry of `key`, taken out; None if there is none."""
    if key is None:
      return None
    with self._lock:
      return self._entries.pop(key, None)

  def clear(self) -> None:
    with self._lock:
      self._entries.clear()

  def __len__(self) -> int:
    return len(self._entries)


def cleared_with_results(*functions) -> None:
  """Have ``clear_caches`` also clear these memoized functions
  (``functools.lru_cache``): readings of a program's frames and paths,
  which hold its tracebacks and depend on the working directory."""
  _memoized.extend(functions)


def clear_caches() -> None:
  """Forget every cached report and compiled result, and the frames and
  paths read from programs (to measure again, or to free their memory).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda x: jnp.sum(jnp.sin(jnp.sin(x))))
    >>> x = jax.random.normal(jax.random.key(0), (16,))
    >>> report = rx.analyze(f, x)
    >>> rx.analyze(f, x) is report
    True
    >>> rx.clear_caches()
    >>> rx.analyze(f, x) is report
    False
  """
  for cache in _caches:
    cache.clear()
  for function in _memoized:
    function.cache_clear()
