"""The peak resident memory of this process, for the benches that set the
explorer's memory against the same compiles done by hand."""

import resource
from pathlib import Path


def peak_rss_mib() -> float:
  """This process's peak resident memory (``VmHWM``). Not ``ru_maxrss``:
  Linux carries that over ``execve`` from the parent, so a child started by
  a large process would report the parent's peak."""
  status = Path('/proc/self/status')
  if status.exists():
    for line in status.read_text().splitlines():
      if line.startswith('VmHWM:'):
        return int(line.split()[1]) / 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
