"""Each figure on compile-only targets against XLA's own, over a matrix of
programs: the memory timeline's peak against ``peak_memory_in_bytes``, the
peak ``compile_costs`` reports against the same step compiled by hand, and
at every step of the schedule the buffers the timeline lists as live
against XLA's heap simulation there (``live_bytes`` against
``placed_bytes``: the most they exceed it and fall under it, as a share of
the peak; not compared where the peak is a TPU's on-chip memory's, whose
heap holds other buffers than the device memory's listed).

Targets ``v5e:2x2``, ``v4:2x2x1`` and ``h100:8``; programs: a residual tanh
stack under ``scan``, rolled and unrolled, small (it lives in a TPU's
on-chip memory) and large, under ``nothing_saveable`` and
``everything_saveable``; and the example transformer sharded data x model
(FSDP), scanned and unrolled, under three policies.

    .venv/bin/python bench/target_figures.py [--targets v5e:2x2 h100:8 v4:2x2x1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import remat_explorer as rx  # noqa: E402
from remat_explorer import examples  # noqa: E402


def _stack_loss(policy, unroll):
  def body(x, w):
    return x + jnp.tanh(x @ w), None

  def loss(w, x):
    x, _ = jax.lax.scan(rx.checkpoint(body, policy=policy), x, w, unroll=unroll)
    return jnp.mean(x ** 2)
  return loss


def programs(target: str):
  mesh = rx.target_mesh(target)
  for size, (layers, batch, seq, width) in (('small', (8, 64, 128, 512)),
                                            ('large', (8, 64, 1024, 2048))):
    w = jax.ShapeDtypeStruct((layers, width, width), jnp.float32,
                             sharding=NamedSharding(mesh, P()))
    x = jax.ShapeDtypeStruct((batch, seq, width), jnp.float32,
                             sharding=NamedSharding(mesh, P('data')))
    for unroll in (1, True):
      for name in ('nothing_saveable', 'everything_saveable'):
        policy = getattr(rx.checkpoint_policies, name)
        yield (f'stack {size} {"unrolled" if unroll is True else "rolled"}', name,
               _stack_loss(policy, unroll), (w, x))
  mesh = rx.target_mesh(target, {'data': mesh.size // 2, 'model': 2})
  for use_scan in (True, False):
    for name in ('nothing_saveable', 'dots_saveable', 'everything_saveable'):
      loss, args = examples.sharded_transformer(
          mesh, num_layers=4, d_model=512, num_heads=8, seq_len=256, batch=16,
          use_scan=use_scan, fsdp=True, policy=getattr(rx.checkpoint_policies, name))
      yield f'transformer {"scan" if use_scan else "unrolled"}', name, loss, args


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--targets', nargs='+', default=['v5e:2x2', 'v4:2x2x1', 'h100:8'])
  a = parser.parse_args()
  worst_timeline = worst_peak = worst_over = worst_under = 0.0
  count = 0
  for target in a.targets:
    for program, policy, loss, args in programs(target):
      costs = rx.compile_costs(loss, *args)
      hand = jax.jit(jax.value_and_grad(loss)).lower(*args).compile().memory_analysis()
      xla = hand.peak_memory_in_bytes
      timeline = costs.timeline.peak_bytes / xla - 1
      peak = costs.peak_bytes / xla - 1
      worst_timeline, worst_peak = max(worst_timeline, abs(timeline)), max(worst_peak, abs(peak))
      count += 1
      steps = ''
      if costs.timeline.peak_memory == 'device':
        apart = [live - placed for live, placed in zip(costs.timeline.live_bytes,
                                                       costs.timeline.placed_bytes)]
        over, under = max(0, max(apart)) / xla, max(0, -min(apart)) / xla
        worst_over, worst_under = max(worst_over, over), max(worst_under, under)
        steps = f'  live vs heap +{over:.2%} / -{under:.2%}'
      print(f'{target:9s} {program:24s} {policy:20s} XLA {xla:>15,} B  reported {peak:+.3%}  '
            f'timeline {timeline:+.3%} ({costs.timeline.peak_memory} memory){steps}', flush=True)
  print(f'{count} programs: largest difference from XLA\'s peak: reported {worst_peak:.3%}, '
        f'timeline {worst_timeline:.3%} (target 1%); the buffers listed live at a step '
        f'against XLA\'s heap there, of the peak: at most {worst_over:.2%} over, '
        f'{worst_under:.2%} under')


if __name__ == '__main__':
  main()
