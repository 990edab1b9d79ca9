"""Analysis benchmark: how long the explorer takes, against XLA's own time.

1. ``analyze`` on a 24-layer unrolled transformer (thousands of equations),
   warm (a cached report; target under 0.2 s), and uncached against
   ``jax.make_jaxpr(jax.grad(f))`` of the same program; nothing is compiled.
2. ``compare`` over every built-in policy on a transformer: its total time
   over the sum of bare XLA compile times of the same training steps
   (``jax.value_and_grad``, as ``compile_costs`` compiles), measured in the
   same run (target <= 1.10); and with its compiles on parallel threads
   (one per usable core), its time over one compile at a time. Beside it,
   bare XLA's compiles alone in as many threads over their serial sum, and
   the cores one XLA compile keeps busy by itself: the ceiling threads can
   reach here. And ``compare`` as a user calls it (analysis compiles on
   worker threads, pipelined with its tracing and reading) over the same
   steps compiled by hand one at a time (target <= 0.70).
3. ``search_policy`` at a few budgets: compiles used, and its (peak, FLOPs)
   point against every built-in policy's.
4. The memory timeline's peak against XLA's allocation (arguments + outputs
   + temporaries - aliases) for every example model under every policy.
5. The analysis compile (``analysis_compiler_options``): for every example
   model x built-in policy x lowering, whether every figure equals a full
   compile's, and its compile time over the full compile's.

    .venv/bin/python bench/analysis.py [--layers 24] [--compare-layers 4]
        [--sections analyze compare search timeline flops analysis-compile]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from remat_explorer import examples  # noqa: E402
from remat_explorer.analysis import (NO_REMAT, analyze, builtin_policies,  # noqa: E402
                                     clear_caches, compare, compile_costs)
from remat_explorer.analysis.tradeoffs.search import search_policy  # noqa: E402


def usable_cores() -> int:
  """The cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def bench_analyze(layers: int) -> None:
  loss_fn, args = examples.transformer(num_layers=layers)
  uncached, baseline = [], []
  for _ in range(3):
    clear_caches()
    start = time.perf_counter()
    report = analyze(loss_fn, *args)
    uncached.append(time.perf_counter() - start)
    # What tracing the same gradient costs JAX alone: trace, JVP, partial
    # eval and transpose, which analyze does once too.
    start = time.perf_counter()
    grad_jaxpr = jax.make_jaxpr(jax.grad(loss_fn))(*args)
    baseline.append(time.perf_counter() - start)
  start = time.perf_counter()
  analyze(loss_fn, *args)
  warm = time.perf_counter() - start
  total_eqns = sum(len(b.known_jaxpr.eqns) + len(b.staged_jaxpr.eqns)
                   for b in report.blocks if b.differentiated)
  print(f'analyze, {layers}-layer unrolled transformer ({len(grad_jaxpr.jaxpr.eqns)} '
        f'top-level equations in its gradient, {total_eqns} in the block splits):')
  print(f'  warm (cached report): {warm * 1e3:.2f} ms (target < 200 ms)')
  print(f'  uncached: {min(uncached):.3f} s; jax.make_jaxpr(jax.grad(f)) alone: '
        f'{min(baseline):.3f} s; ratio {min(uncached) / min(baseline):.2f}')


def bench_compare(layers: int, repeats: int) -> None:
  loss_fn, args = examples.transformer(num_layers=layers)
  policies = {'no remat': NO_REMAT, **builtin_policies(
      analyze(loss_fn, *args).names_in_program)}

  def bare_compiles() -> float:
    """Bare XLA: the same steps (loss and gradient), traced, lowered and
    compiled by jax alone, on freshly built models (nothing cached)."""
    seconds = 0.0
    for policy in policies.values():
      f = examples.transformer(num_layers=layers, remat=policy is not NO_REMAT,
                               policy=None if policy is NO_REMAT else policy)[0]
      start = time.perf_counter()
      jax.jit(jax.value_and_grad(f)).lower(*args).compile()
      seconds += time.perf_counter() - start
    return seconds

  def bare_threaded(threads: int) -> tuple[float, float, float]:
    """The same steps' compiles alone (lowered first), `threads` at a
    time: (wall seconds, serial sum of the compile times, the cores one
    serial compile kept busy on average)."""
    def lowered_steps():
      return [jax.jit(jax.value_and_grad(examples.transformer(
          num_layers=layers, remat=p is not NO_REMAT,
          policy=None if p is NO_REMAT else p)[0])).lower(*args)
          for p in policies.values()]

    def timed_compile(lowered) -> float:
      start = time.perf_counter()
      lowered.compile()
      return time.perf_counter() - start

    steps = lowered_steps()
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    serial_sum = sum(timed_compile(s) for s in steps)
    cores_busy = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
    steps = lowered_steps()
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
      list(pool.map(timed_compile, steps))
    return time.perf_counter() - start, serial_sum, cores_busy

  def explorer_compare(parallel, suggest_lowering=False) -> tuple[float, object]:
    # The same compiles as by hand: without the extra compile of each row
    # whose recompute XLA merged away (timed apart below).
    clear_caches()
    start = time.perf_counter()
    comparison = compare(loss_fn, *args, policies=policies, include_no_remat=False,
                         include_as_written=False, parallel=parallel,
                         suggest_lowering=suggest_lowering)
    return time.perf_counter() - start, comparison

  # Alternated, so that neither side gains from running second on a shared
  # machine; the medians are compared.
  bare, serial, serial_compiles, parallel, threaded = [], [], [], [], []
  cores = usable_cores()
  for _ in range(repeats):
    bare.append(bare_compiles())
    threaded.append(bare_threaded(cores))
    seconds, comparison = explorer_compare(1)
    serial.append(seconds)
    serial_compiles.append(sum(r.compile_seconds for r in comparison.rows))
    seconds, comparison = explorer_compare(None)
    parallel.append(seconds)
  bare, serial = statistics.median(bare), statistics.median(serial)
  serial_compiles, parallel = statistics.median(serial_compiles), statistics.median(parallel)
  print(f'compare, {layers}-layer transformer, {len(comparison.rows)} policies '
        f'(medians of {repeats}):')
  print(f'  one compile at a time: {serial:.2f} s; bare jit+compile of the same steps '
        f'{bare:.2f} s; ratio {serial / bare:.2f} (target <= 1.10)')
  print(f'  {cores} compiles at a time ({cores} usable cores): {parallel:.2f} s over one '
        f'at a time, ratio {parallel / serial:.2f} (the sum of its XLA compile times, '
        f'one at a time: {serial_compiles:.2f} s)')
  print(f'  compare as called (analysis compiles, {cores} at a time) against the '
        f'same steps compiled by hand one after another: {parallel:.2f} s / {bare:.2f} s, '
        f'ratio {parallel / bare:.2f} (target <= 0.70)')
  suggesting, with_suggestions = explorer_compare(None, suggest_lowering=True)
  extra = sum(r.kept_recompute is not None for r in with_suggestions.rows)
  print(f'  with suggest_lowering (the default): {suggesting:.2f} s, {extra} more '
        "compile(s) under lowering='cond' for the rows whose recompute XLA merged away")
  wall, serial_sum, cores_busy = (statistics.median(t[i] for t in threaded)
                                  for i in range(3))
  print(f'  bare XLA, the same compiles {cores} at a time: {wall:.2f} s over their serial '
        f'sum {serial_sum:.2f} s, ratio {wall / serial_sum:.2f}; one compile alone keeps '
        f'{cores_busy:.2f} cores busy')
  for row in comparison.rows:
    print(f'  {row.label:<40} peak {row.peak_bytes / 2**20:8.2f} MiB  temp '
          f'{row.temp_bytes / 2**20:8.2f} MiB  FLOPs(compiled) '
          f'{(row.compiled_flops or 0) / 1e9:8.3f} G  FLOPs(jaxpr) {(row.flops or 0) / 1e9:8.3f} G'
          + ('  [front]' if row.on_pareto_front else '')
          + ('  [recompute merged by XLA]' if row.recompute_eliminated else ''))


def bench_search(layers: int, budgets) -> None:
  loss_fn, args = examples.transformer(num_layers=layers)
  for budget in budgets:
    start = time.perf_counter()
    result = search_policy(loss_fn, *args, memory_budget=budget)
    seconds = time.perf_counter() - start
    print(f'search, budget {budget} -> {result.budget_bytes / 2**20:.2f} MiB: '
          f'{result.label}; peak {result.peak_bytes / 2**20:.2f} MiB, '
          f'{result.flops / 1e9:.3f} GFLOP, {result.compiles_used} compiles, {seconds:.1f} s')
    beaten_by = []
    for c in result.candidates:
      if c.label.startswith('search'):
        continue
      verdict = 'fits' if c.fits else 'over budget'
      if (c.peak_bytes <= result.peak_bytes and c.flops <= result.flops
          and (c.peak_bytes, c.flops) != (result.peak_bytes, result.flops)):
        beaten_by.append(c.label)
      print(f'    {c.label:<40} peak {c.peak_bytes / 2**20:8.2f} MiB  '
            f'{c.flops / 1e9:8.3f} GFLOP executed  {verdict}; search/candidate FLOPs '
            f'{result.flops / c.flops:.3f}')
    print(f'    answer dominated by: {", ".join(beaten_by) or "none"} '
          f'(of {len(result.candidates)} compiled)')


def bench_timeline_peaks() -> None:
  print('timeline peak against XLA\'s allocation (arguments + outputs + temp - alias):')
  models = {
      'mlp (scan)': examples.mlp(num_layers=8, width=256, batch=64),
      'transformer (unrolled)': examples.transformer(num_layers=4),
      'transformer (scan)': examples.transformer(num_layers=4, use_scan=True),
      'convnet': examples.convnet(),
  }
  worst = 0.0
  for name, (loss_fn, args) in models.items():
    errors = []
    for label, policy in {'no remat': NO_REMAT, **builtin_policies()}.items():
      costs = compile_costs(loss_fn, *args, policy=policy)
      error = costs.timeline.peak_bytes / costs.total_bytes - 1
      live = max(costs.timeline.live_bytes) / costs.timeline.peak_bytes
      errors.append((label, error, live))
      worst = max(worst, abs(error))
    print(f'  {name:<24} ' + '  '.join(
        f'{label}: {error:+.2%} (largest live set {live:.1%} of it)'
        for label, error, live in errors))
  print(f'  largest error: {worst:.2%} (target within 1%)')


def bench_executed_flops() -> None:
  """Each example model stacked under a scan, per policy: the executed FLOPs
  (loops counted) against XLA's count of the same model unrolled."""
  print('executed FLOPs (loops counted) of scanned models against their unrolled twin '
        '(XLA cost_analysis), cond lowering:')
  worst = 0.0
  twins = {'transformer': lambda scan: examples.transformer(num_layers=4, use_scan=scan)}
  for name, build in twins.items():
    (scanned, s_args), (unrolled, u_args) = build(True), build(False)
    for label, policy in {'no remat': NO_REMAT, **builtin_policies()}.items():
      a = compile_costs(scanned, *s_args, policy=policy, lowering='cond')
      b = compile_costs(unrolled, *u_args, policy=policy, lowering='cond')
      error = a.executed_flops / b.xla_flops - 1
      worst = max(worst, abs(error))
      print(f'  {name} / {label:<34} scanned {a.executed_flops / 1e9:8.3f} G '
            f'(cost_analysis {a.xla_flops / 1e9:7.3f} G)  unrolled {b.xla_flops / 1e9:8.3f} G  '
            f'{error:+.2%}')
  print(f'  largest difference: {worst:.2%} (target within 2%)')


def bench_analysis_compile() -> None:
  from remat_explorer.analysis import LOWERINGS
  print('analysis compile against a full compile (every figure, compile time):')
  ratios, differing, cases = [], [], 0
  for name in sorted(examples.MODELS):
    loss_fn, args = examples.build(name)
    policies = builtin_policies(analyze(loss_fn, *args).names_in_program)
    for label, policy in policies.items():
      for lowering in LOWERINGS:
        clear_caches()
        quick = compile_costs(loss_fn, *args, policy=policy, lowering=lowering)
        full = compile_costs(loss_fn, *args, policy=policy, lowering=lowering,
                             compiler_options={})
        cases += 1
        same = all(getattr(quick, f) == getattr(full, f) for f in (
            'memory_analysis', 'cost_analysis', 'buffer_assignment_proto',
            'temp_bytes', 'peak_memory_bytes', 'xla_flops')) and (
            quick.timeline.to_dict() == full.timeline.to_dict())
        if not same:
          differing.append(f'{name} / {label} / {lowering}')
        ratios.append(quick.compile_seconds / full.compile_seconds)
  print(f'  {cases} cases, {cases - len(differing)} identical'
        + (f'; differing: {", ".join(differing)}' if differing else ''))
  print(f'  compile time, analysis over full: median {statistics.median(ratios):.2f}, '
        f'range {min(ratios):.2f}-{max(ratios):.2f}')


SECTIONS = ('analyze', 'compare', 'search', 'timeline', 'flops', 'analysis-compile')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--layers', type=int, default=24)
  parser.add_argument('--compare-layers', type=int, default=4)
  parser.add_argument('--budgets', type=float, nargs='*', default=[0.25, 0.5, 0.75])
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--sections', nargs='*', choices=SECTIONS, default=SECTIONS)
  args = parser.parse_args()
  print(f'device: {jax.devices()[0].device_kind} ({jax.devices()[0].platform})')
  run = set(args.sections)
  if 'analyze' in run:
    bench_analyze(args.layers)
  if 'compare' in run:
    bench_compare(args.compare_layers, args.repeats)
  if 'search' in run:
    bench_search(args.compare_layers, args.budgets)
  if 'timeline' in run:
    bench_timeline_peaks()
  if 'flops' in run:
    bench_executed_flops()
  if 'analysis-compile' in run:
    bench_analysis_compile()


if __name__ == '__main__':
  main()
