"""The suite's order: the longest runs first.

Under ``-n 2 --dist loadgroup`` a worker takes the next test (or the next
group of tests that share one worker) as it frees up, in collection order.
A long group collected last would leave the other worker idle while it
runs, so the groups and the slowest modules are moved to the front; the
rest keep their order.
"""

# Modules whose tests take tens of seconds each (notebooks run in kernels of
# their own; the sharded checks in a subprocess with 8 host devices).
SLOW_MODULES = ('test_notebooks.py', 'test_sharded_analysis.py', 'test_search_front.py')


def _rank(item) -> int:
  if item.get_closest_marker('xdist_group') is not None:
    return 0
  return 1 if item.path.name in SLOW_MODULES else 2


def pytest_collection_modifyitems(items):
  items.sort(key=_rank)  # stable: each module's own order is kept
