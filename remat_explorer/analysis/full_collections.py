"""Python's full garbage collections, held off while a batch of analyses runs.

A full collection walks every object the process holds: JAX's caches, the
user's model, every jaxpr and parsed program kept so far. Tracing and
reading programs allocate fast enough to set one off every few tenths of a
second, and each then costs tens of milliseconds with Python's lock held:
in a ``compare`` of six policies, about half a second of work that XLA's
compiles on other threads wait behind. Held off, the collections that would
have run are left to Python's usual schedule once the batch is done;
the young generations, which free most cycles, are collected as usual.
"""

from __future__ import annotations

import contextlib
import gc
import threading

_lock = threading.Lock()
_holders = 0
_threshold: tuple[int, ...] = ()
_held: tuple[int, ...] = ()

# Python's count of young collections before a full one, while held off: as
# good as never within one batch.
_HELD_OFF = 2**31 - 1


@contextlib.contextmanager
def full_collections_held_off():
  """Within the body (on any thread; bodies may overlap), no full
  collection runs; the thresholds in effect before are restored after the
  last body ends, whatever it raised, unless something else set its own
  meanwhile."""
  global _holders, _threshold, _held
  with _lock:
    if _holders == 0:
      _threshold = gc.get_threshold()
      _held = (*_threshold[:2], _HELD_OFF)
      gc.set_threshold(*_held)
    _holders += 1
  try:
    yield
  finally:
    with _lock:
      _holders -= 1
      if _holders == 0 and gc.get_threshold() == _held:
        gc.set_threshold(*_threshold)
