"""Scan benchmark: the gradient of a long scan under each checkpointing schedule.

Compiles ``jax.grad`` of a 1,024-step scan with a 1 MiB float32 carry (the
step couples each element to its column's mean, so XLA cannot fuse steps
together) under ``lax.scan`` without remat, the ``scan(jax.checkpoint(f))``
idiom, a hand-written nested scan with ``jax.checkpoint``, and
``checkpointed_scan``'s schedules, all in the same run. For each it prints
what ``scan_schedule_costs`` predicts next to what was measured:

* carries: predicted snapshots, and XLA's temp bytes in units of the carry;
* recomputed: predicted recomputed steps, and the step's evaluations counted
  in the gradient's jaxpr (loop trip counts applied) minus n;
* temp MiB, GFLOP (our jaxpr count, trip counts applied; XLA's own count runs
  each loop body once, so it is shown apart), the median run time (the rows
  take turns), compile time, and ratios against ``lax.scan``.

    .venv/bin/python bench/scans.py [--steps N] [--side S] [--repeats R]

With the defaults it takes several minutes: the binomial programs are trees
of checkpointed blocks that XLA compiles for a minute or two each.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import remat_explorer as rx  # noqa: E402
from remat_explorer.analysis.flops import jaxpr_flops  # noqa: E402


def step(c, x):
  return jnp.tanh(c * x[0] + x[1] * jnp.mean(c, axis=0)), jnp.sum(c[0]) * x[0]


def hand_segments(n):
  """The largest k <= sqrt(n) dividing n."""
  return next(k for k in range(math.isqrt(n), 0, -1) if n % k == 0)


def nested_by_hand(f, init, xs):
  """k checkpointed segments of scan(jax.checkpoint(f)), k = sqrt(n) dividing n."""
  n = xs.shape[0]
  k = hand_segments(n)
  segment = lambda c, seg: jax.lax.scan(jax.checkpoint(f), c, seg)
  carry, ys = jax.lax.scan(jax.checkpoint(segment), init, xs.reshape(k, n // k, -1))
  return carry, ys.reshape(n)


def rows(n):
  """(label, scan function, predicted costs or None, why it cannot run or None)."""
  ours = lambda **kw: (lambda f, c, xs: rx.checkpointed_scan(f, c, xs, **kw))
  out = [('lax.scan (no remat)', jax.lax.scan, None, None),
         ('scan(jax.checkpoint(f))',
          lambda f, c, xs: jax.lax.scan(jax.checkpoint(f), c, xs),
          rx.scan_schedule_costs(n, 'every'), None),
         ('nested by hand (jax)', nested_by_hand,
          rx.scan_schedule_costs(n, segments=hand_segments(n)), None),
         ('ours: every', ours(schedule='every'), rx.scan_schedule_costs(n, 'every'), None),
         ('ours: sqrt', ours(schedule='sqrt'), rx.scan_schedule_costs(n, 'sqrt'), None)]
  for s in (8, 4, 2):
    costs = rx.scan_schedule_costs(n, ('binomial', s))
    refused = None
    try:
      rx.checkpointed_scan(lambda c, x: (c, None), 0.0, length=n, schedule=('binomial', s))
    except ValueError as e:
      refused = str(e).split(';')[0]
    out.append((f'ours: binomial s={s}', ours(schedule=('binomial', s)), costs, refused))
  return out


def loss_of(scan, f=step):
  def loss(c, xs):
    carry, ys = scan(f, c, xs)
    return jnp.sum(carry ** 2) + jnp.sum(ys)
  return loss


def evaluations(scan, c, xs):
  """Step evaluations in the gradient, counted in its jaxpr: the step gets a
  marker callback, and loop bodies count once per trip."""
  def marked(c, x):
    jax.debug.callback(lambda _: None, c[0, 0])
    return step(c, x)

  def count(jaxpr):
    total = 0
    for eqn in jaxpr.eqns:
      total += eqn.primitive.name == 'debug_callback'
      trips = eqn.params['length'] if eqn.primitive.name == 'scan' else 1
      total += trips * sum(count(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params))
    return total
  return count(jax.make_jaxpr(jax.grad(loss_of(scan, marked)))(c, xs).jaxpr)


def compile_row(scan, c, xs):
  grad = jax.grad(loss_of(scan))
  flops = jaxpr_flops(jax.make_jaxpr(grad)(c, xs))
  start = time.perf_counter()
  compiled = jax.jit(grad).lower(c, xs).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(c, xs))  # warm-up
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return dict(compiled=compiled, temp=compiled.memory_analysis().temp_size_in_bytes,
              flops=flops, xla_flops=cost.get('flops', float('nan')), compile_s=compile_s,
              evaluations=evaluations(scan, c, xs), times=[])


def time_rows(measured, c, xs, repeats):
  """Median run times, the rows taking turns so that a busy machine slows
  them alike."""
  for _ in range(repeats):
    for m in measured:
      start = time.perf_counter()
      jax.block_until_ready(m['compiled'](c, xs))
      m['times'].append(time.perf_counter() - start)
  for m in measured:
    m['seconds'] = statistics.median(m['times'])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=1024)
  parser.add_argument('--side', type=int, default=512, help='the carry is side x side float32')
  parser.add_argument('--repeats', type=int, default=5)
  args = parser.parse_args()
  n = args.steps
  rng = np.random.default_rng(0)
  c = jnp.asarray(rng.standard_normal((args.side, args.side)), jnp.float32)
  xs = jnp.asarray(rng.uniform(0.5, 1.0, (n, 2)), jnp.float32)
  carry_bytes = c.size * 4
  print(f'device: {jax.devices()[0].device_kind}  jax {jax.__version__}  {n} steps, '
        f'carry {args.side}x{args.side} float32 ({carry_bytes / 2**20:.2f} MiB)')
  header = (f"{'schedule':<24} {'carries':>7} {'(XLA)':>7} {'recomp':>7} {'(jaxpr)':>7} "
            f"{'temp MiB':>9} {'GFLOP':>8} {'XLA GF':>7} {'run ms':>8} {'compile s':>9} "
            f"{'temp/lax':>8} {'flops/lax':>9} {'time/lax':>8}")
  print(header)
  print('-' * len(header))
  table = []
  for label, scan, costs, refused in rows(n):
    table.append((label, costs, refused, None if refused else compile_row(scan, c, xs)))
  time_rows([m for *_, m in table if m], c, xs, args.repeats)
  base = table[0][3]
  for label, costs, refused, m in table:
    predicted = ((f'{costs.stored_carries:>7} ', f'{costs.recomputed_steps:>7} ')
                 if costs else (f"{'-':>7} ", f"{0:>7} "))
    if refused:
      print(f'{label:<24} {predicted[0]}{"":>8}{predicted[1]}  not run: {refused}')
      continue
    print(f'{label:<24} {predicted[0]}{m["temp"] / carry_bytes:>7.1f} {predicted[1]}'
          f'{m["evaluations"] - n:>7} {m["temp"] / 2**20:>9.1f} {m["flops"] / 1e9:>8.3f} '
          f'{m["xla_flops"] / 1e9:>7.3f} {m["seconds"] * 1e3:>8.1f} {m["compile_s"]:>9.1f} '
          f'{m["temp"] / base["temp"]:>8.4f} {m["flops"] / base["flops"]:>9.2f} '
          f'{m["seconds"] / base["seconds"]:>8.2f}')


if __name__ == '__main__':
  main()
