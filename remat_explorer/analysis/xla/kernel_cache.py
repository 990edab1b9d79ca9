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
the process that is removed at exit. A process killed before its exit
handlers run (a notebook kernel shut down at once, one the system ends
for memory) cannot remove its own: each directory holds a file its
process keeps locked while it lives, and the next process to make a
directory removes those whose lock is free (the system frees it when the
process ends, however it ends).
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import tempfile
import threading

from remat_explorer.engine import is_compile_only

_PREFIX = 'remat_explorer_kernels_'
_HOLDER = 'in-use'
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
      _remove_abandoned(tempfile.gettempdir())
      _directory[pid], holder = _locked_directory(tempfile.gettempdir())
      # The exit handler holds the holder file open, and so locked, until
      # the process ends.
      atexit.register(_remove_own, _directory[pid], holder)
    return _directory[pid]


def _locked_directory(parent: str):
  """A new directory under `parent` and its holder file, locked. It is made
  under a hidden name and takes its own only once locked, so no other
  process sees it unlocked."""
  import fcntl  # compile-only GPUs come with the CUDA plugin: Linux only
  staging = tempfile.mkdtemp(prefix='.' + _PREFIX, dir=parent)
  holder = open(os.path.join(staging, _HOLDER), 'w')
  fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
  path = os.path.join(parent, os.path.basename(staging)[1:])
  os.rename(staging, path)
  return path, holder


def _remove_own(path: str, holder) -> None:
  shutil.rmtree(path, ignore_errors=True)
  holder.close()


def _remove_abandoned(parent: str) -> None:
  """Removes the kernel directories under `parent` whose process has ended
  (their holder file is no longer locked)."""
  import fcntl
  for path in glob.glob(os.path.join(parent, _PREFIX + '*')):
    try:
      with open(os.path.join(path, _HOLDER)) as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(path, ignore_errors=True)
    except OSError:  # held by a live process, or not ours to open
      continue
