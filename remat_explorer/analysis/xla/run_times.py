"""The compiled step run: its median time over repeated runs, and the
device's measured peak where the device reports one (``compile_costs``
with ``repeats``), on an executable kept only until it is timed."""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax

from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.xla.costs import CompiledCosts


class Runnable:
  """The executable a compile made to be run, until it is timed and
  dropped; calling it gives the executable, or None (a compile for figures
  only, a refused program, or one dropped)."""

  def __init__(self, executable=None):
    self._executable = executable

  def __call__(self):
    return self._executable

  def drop(self) -> None:
    self._executable = None


def timed_costs(pending, repeats: int, *,
                keep_executable: bool = False) -> CompiledCosts:
  """The figures of `pending` (a ``PendingCosts``), with the median time of
  `repeats` runs. Timed once per number of runs, on the executable compiled
  for the figures where it was compiled to run, else on one compiled in full
  now. That executable is then dropped, unless `keep_executable` (a
  comparison's rows may share one program: it drops theirs once all are
  timed, with ``Runnable.drop``)."""
  costs, runnable = pending.entry()
  if not repeats or costs.failed:
    return costs
  timed_key = None if pending.key is None else (pending.key, repeats)
  timed = _timed.get(timed_key)
  if timed is None:
    executable = runnable()
    if executable is None:  # figures of an analysis compile, which keeps nothing to run
      executable = pending.compiled_to_run()
    timed = with_run_times(costs, executable, pending.leaves, repeats, pending.donated)
    _timed.put(timed_key, timed)
  if not keep_executable:
    runnable.drop()
  return timed


_timed = ResultCache(max_entries=64)


def with_run_times(costs: CompiledCosts, compiled, leaves, repeats: int,
                   donate_argnums=()) -> CompiledCosts:
  """`costs` with the median time of `repeats` runs of `compiled` (after
  a warm-up) and the device's measured peak where it reports one."""
  notes = list(costs.notes)
  run_seconds, measured_peak = _run(compiled, leaves, repeats, donate_argnums, notes)
  return dataclasses.replace(costs, run_seconds=run_seconds,
                             measured_peak_bytes=measured_peak, notes=tuple(notes))


def _run(compiled, leaves, repeats, donate_argnums, notes):
  if repeats <= 0:
    return None, None
  if any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
    notes.append('not run: the arguments are shapes only (ShapeDtypeStruct)')
    return None, None
  if donate_argnums:
    notes.append('run with fresh copies of donated arguments each time')

  def fresh():
    return [jax.numpy.array(x, copy=True) if i in donate_argnums else x
            for i, x in enumerate(leaves)]

  device = jax.devices()[0]
  peak_before = device_peak_bytes(device)
  jax.block_until_ready(compiled(*fresh()))  # warm-up
  times = []
  for _ in range(repeats):
    args = fresh()
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times), _own_peak(peak_before, device_peak_bytes(device), notes)


def device_peak_bytes(device) -> int | None:
  """The most bytes `device` has held at once since the process began, where
  it reports it (GPUs, TPUs; the CPU reports no memory statistics)."""
  stats = device.memory_stats()
  return None if not stats else stats.get('peak_bytes_in_use')


def _own_peak(before: int | None, after: int | None, notes: list) -> int | None:
  """The runs' own peak. JAX cannot reset the device's peak, which is the
  process's: it is the runs' only when they raised it. Otherwise an
  earlier program held more, and the runs' own peak is unknown (None)."""
  if before is None or after is None:
    return None
  if after > before:
    return after
  notes.append(f'measured peak unknown: the device held more ({before} bytes) before '
               'these runs, and its peak cannot be reset')
  return None
