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

Only when the process has grown by `WORTH_GIVING_BACK` since it last gave
memory back: trimming returns pages that the next compile faults in again,
which the kernel zeroes. Trimming after every compile cost 5% of a run of
small compiles, most of it the kernel's. At 64 MiB of growth, a process
running many small programs (the test suite's compare, estimate and compile
tests) still trimmed after one compile in five, each time about the 100-200
MiB that the next compiles faulted in again: 3.6 GiB over 160 compiles, and
5% of the run's time. A small program's compile reuses what the last one
freed; a large one (a Griffin's, gigabytes) grows the process far past it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

# Growth of the resident set since memory was last given back below which
# nothing is: more than what a small program's compile leaves free.
WORTH_GIVING_BACK = 256 << 20

_resident_after_giving_back = 0


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


def resident_bytes() -> int:
  """This process's resident set (Linux's ``/proc/self/statm``)."""
  with open('/proc/self/statm') as statm:
    return int(statm.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def give_back_freed_memory() -> bool:
  """Return the heaps' free pages to the system if the process grew by
  `WORTH_GIVING_BACK` or more since it last did; whether any were."""
  global _resident_after_giving_back
  trim = _malloc_trim()
  if trim is None:
    return False
  if resident_bytes() - _resident_after_giving_back < WORTH_GIVING_BACK:
    return False
  # Threads that finish compiles together may both trim: harmless.
  gave = bool(trim(0))
  _resident_after_giving_back = resident_bytes()
  return gave
