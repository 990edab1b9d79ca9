"""The suite's XLA cache and options, its order (the longest runs first) and its
garbage collector.

Many tests compile the same programs again in other processes (the two
workers, each notebook's kernel, the sharded checks' subprocess) or in
eager control flow (an eager ``cond`` compiles its branches on each call).
The suite gives them one JAX persistent compilation cache, a new directory
for each run, so a program XLA compiled once is loaded the next time: JAX
keys an entry on the program and the compile options, so a changed program
or option still compiles. Every process the suite starts inherits it
through the environment. A cache directory already set is kept.

Under ``-n 2 --dist loadgroup`` a worker takes the next test (or the next
group of tests that share one worker) as it frees up, in collection order.
A long group collected last would leave the other worker idle while it
runs, so the groups and the slowest modules are moved to the front; the
rest keep their order.
"""

import gc
import os
import shutil
import tempfile

_OWN_CACHE = ('PYTEST_XDIST_WORKER' not in os.environ
              and 'JAX_COMPILATION_CACHE_DIR' not in os.environ)
if _OWN_CACHE:  # set before JAX is imported, which reads it then
  os.environ.update(JAX_COMPILATION_CACHE_DIR=tempfile.mkdtemp(prefix='remat-explorer-xla-'),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')

# On an NVIDIA GPU, JAX runs float32 matmuls in TF32 by default, and the
# tests compare values at float32's tolerances: they run at full precision.
if os.path.exists('/dev/nvidiactl'):
  os.environ.setdefault('JAX_DEFAULT_MATMUL_PRECISION', 'highest')
# Without a GPU, the tests' own compiles (each figure is checked against a
# compile by hand) are made at the backend optimization level the
# explorer's analysis compile uses on the CPU: it changes only the machine
# code LLVM makes from the optimized HLO, not the HLO, its schedule or its
# buffer assignment (tests/test_analysis_compile.py checks that against
# XLA's default level; the compile-only H100 and TPU peaks are unchanged
# by it too), and takes about a fifth off the time of the modules that
# compile most (docs/pages/install.md has the measurement).
else:
  # Imported only now: the cache above is read when JAX is imported, these
  # options when its first backend starts.
  from remat_explorer.analysis.xla.compiled import analysis_compiler_options
  _flags = os.environ.get('XLA_FLAGS', '')
  os.environ['XLA_FLAGS'] = ' '.join(
      [_flags] + [f'--{name}={value}' for name, value in analysis_compiler_options('cpu').items()
                  if name not in _flags]).strip()


def pytest_unconfigure(config):
  if _OWN_CACHE:
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)


# Modules whose tests take tens of seconds each (notebooks run in kernels of
# their own; the sharded checks in a subprocess with 8 host devices; the
# README's quick start in a process of its own, compiling for a TPU pod).
SLOW_MODULES = ('test_notebooks.py', 'test_sharded_analysis.py', 'test_search_front.py',
                'test_quick_start.py')


def _rank(item) -> int:
  if item.get_closest_marker('xdist_group') is not None:
    return 0
  return 1 if item.path.name in SLOW_MODULES else 2


def pytest_collection_modifyitems(items):
  items.sort(key=_rank)  # stable: each module's own order is kept


def pytest_collection_finish(session):
  """Tracing makes and drops objects by the million, and a worker holds
  many more alive (its modules, JAX's caches, the results a test keeps):
  at Python's default thresholds the collector ran about every 700
  allocations and walked the survivors again and again, some 6% of a
  worker's time. What is alive once the tests are collected is frozen out
  of every later collection, and the collector runs less often."""
  gc.collect()
  gc.freeze()
  gc.set_threshold(50_000, 20, 20)
