"""GPU kernels compiled once, for the analysis compiles of a compile-only GPU.

Most of an XLA:GPU compile is ptxas turning each kernel's PTX into machine
code, one process per kernel. The policies of one step share most of
their kernels (a layer's fusions are the same whether its values are
saved or recomputed), and XLA reuses a kernel it compiled before when it
is given a kernel cache file (``xla_gpu_kernel_cache_file``): it loads the
file before it emits the module's kernels and adds the ones it compiled
after. The optimized module, its schedule and its buffer assignment are
made before that, so every figure read from the compile is the same
(tests/test_analysis_compile.py compares them with a compile made
without the file).

XLA reads and rewrites the file with no lock, and fails a compile that
adds a kernel under a name another writer added meanwhile. So each
compiling thread of each process has a file of its own, in a directory of
the process that is removed at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

from remat_explorer.engine import is_compile_only

_directory: dict[int, str] = {}  # process id -> its directory
_lock = threading.Lock()


def reuses_kernels(device) -> bool:
  """Whether an analysis compile for `device` takes the kernels its
  thread compiled before: a compile-only GPU's (a live GPU compiles as
  usual until the same check has been made on one)."""
  return device.platform == 'gpu' and is_compile_only(device)


def kernel_cache_options() -> dict:
  """The compiler option that gives this thread's compiles its kernel
  cache: call it on the thread that compiles."""
  return {'xla_gpu_kernel_cache_file': os.path.join(
      _process_directory(), f'kernels-{threading.get_ident()}.pb')}


def _process_directory() -> str:
  pid = os.getpid()  # a forked child makes a directory of its own
  with _lock:
    if pid not in _directory:
      _directory[pid] = tempfile.mkdtemp(prefix='remat_explorer_kernels_')
      atexit.register(shutil.rmtree, _directory[pid], True)
    return _directory[pid]
