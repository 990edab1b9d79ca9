"""Memory that a compile and its reading freed, given back to the system.

A large compiled program, its lowered module and what reading it builds
(its HLO text, the buffer assignment, the memory timeline, the executed
FLOPs) take gigabytes, all dropped once its figures are read. glibc's
allocator keeps freed memory in its heaps for reuse, fragmented, and rarely
returns it: after one ``compile_costs`` of recurrentgemma's Griffin (3.5M
parameters, its RG-LRU scan unrolled 128 times), with nothing holding the
program, the process stayed at 2.4 GiB resident; ``malloc_trim(0)`` brought
it to 1.2 GiB, where it started. So each compile, once read, gives the
freed pages back (glibc only: elsewhere nothing is done).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _malloc_trim():
  """glibc's ``malloc_trim``, or None where the C library has none (macOS,
  Windows, musl)."""
  if not sys.platform.startswith('linux'):
    return None
  try:
    trim = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6').malloc_trim
  except (OSError, AttributeError):
    return None
  trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
  return trim


def give_back_freed_memory() -> bool:
  """Return the heaps' free pages to the system; whether any were."""
  trim = _malloc_trim()
  return bool(trim(0)) if trim is not None else False
