"""Viz benchmark: how long drawing the split takes on large programs.

For each program: the plain graph of the split (``report.graph``), the
diagram drawn from it at the level of the user's code (groups closed, as
the Explorer first shows it; its node count, and the count once every group
is opened down to primitives and summarized), and ``to_svg`` (Graphviz's
layout), against tracing the gradient with ``jax.make_jaxpr(jax.grad(f))``
in the same run, the cost any JAX user pays to look at a program at all.
The target: a 5,000-equation program drawn in a few seconds, never a hang or
an SVG of tens of MB.

Then the memory timeline (what the Costs tab and the report draw from a
compile): ``timeline_view``, which describes the buffers live in each of up
to 150 bands in the user's terms, against ``compile_costs`` of the same
program in the same run. The target: a small share of the compile it shows.

    .venv/bin/python bench/viz.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import remat_explorer as rx  # noqa: E402
from remat_explorer import examples, viz  # noqa: E402
from remat_explorer.analysis import analyze  # noqa: E402
from remat_explorer.analysis.split.graph import split_graph_of  # noqa: E402
from remat_explorer.viz.diagram.split_graph import split_diagram  # noqa: E402


def unrolled_mlp(num_layers: int):
  """One checkpointed block of `num_layers` unrolled layers (about 13
  equations per layer across the forward and backward passes)."""
  def mlp(ws, x):
    for i, w in enumerate(ws):
      x = jnp.tanh(x @ w + 0.1)
      if i % 10 == 0:
        x = rx.checkpoint_name(x, f'layer{i}')
    return jnp.sum(x)
  keys = jax.random.split(jax.random.key(0), num_layers + 1)
  ws = [jax.random.normal(k, (8, 8)) * 0.3 for k in keys[:-1]]
  x = jax.random.normal(keys[-1], (4, 8))
  return rx.checkpoint(mlp, policy=rx.checkpoint_policies.dots_saveable), (ws, x)


def median_seconds(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def bench(label: str, f, args, repeats: int) -> None:
  report = analyze(f, *args)
  equations = sum(len(b.known_jaxpr.eqns) + len(b.staged_jaxpr.eqns)
                  for b in report.blocks if b.differentiated)
  trace = median_seconds(lambda: jax.make_jaxpr(jax.grad(f))(*args), repeats)
  record = median_seconds(lambda: split_graph_of(report), repeats)
  draw = median_seconds(lambda: viz.split_graph(report), repeats)
  digraph = viz.split_graph(report)
  svg_text = viz.to_svg(digraph)
  render = median_seconds(lambda: viz.to_svg(digraph), repeats)
  nodes = split_diagram(report).num_nodes()
  opened = split_diagram(report, expand='all').num_nodes()
  total = record + draw + render
  print(f'{label:<30} {equations:>7} {nodes:>6} {opened:>7} {record:>8.3f} {draw:>8.3f} '
        f'{render:>8.3f} {len(svg_text) / 1024:>8.0f} {trace:>8.3f} {total / trace:>7.2f}')


def bench_timeline(label: str, f, args, repeats: int) -> None:
  from remat_explorer.analysis import clear_caches, compile_costs
  from remat_explorer.viz.charts.timeline_view import timeline_view

  def compile_once():
    clear_caches()
    return compile_costs(f, *args)
  compile_seconds = median_seconds(compile_once, repeats)
  report, costs = analyze(f, *args), compile_costs(f, *args)

  def view_once():
    clear_caches()  # each view describes its buffers afresh, as a new compile's does
    return timeline_view(report, costs)
  view = timeline_view(report, costs)
  seconds = median_seconds(view_once, repeats)
  print(f'{label:<30} {len(costs.timeline.buffers):>8} {len(view.bands):>6} '
        f'{seconds:>8.3f} {compile_seconds:>10.3f} {seconds / compile_seconds:>7.1%}')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args(argv)
  print(f'{"program":<30} {"eqns":>7} {"nodes":>6} {"opened":>7} {"graph s":>8} '
        f'{"draw s":>8} {"dot s":>8} {"SVG KiB":>8} {"trace s":>8} {"ratio":>7}')
  print('(nodes: groups closed; opened: every group opened, summarized to 300; '
        'ratio: graph + draw + dot over jax.make_jaxpr(jax.grad(f)), same run)')
  for layers in (400, 1000):
    bench(f'unrolled MLP, {layers} layers', *unrolled_mlp(layers), args.repeats)
  bench('transformer, 24 layers', *examples.transformer(num_layers=24), args.repeats)
  bench('transformer under scan', *examples.transformer(num_layers=24, use_scan=True),
        args.repeats)
  try:
    from tests.framework_models import nnx_transformer
  except ImportError as e:  # Flax is in the dev extra
    print(f'Flax NNX transformer: skipped ({e})')
  else:
    bench('Flax NNX transformer (scan)', *nnx_transformer(), args.repeats)
  print()
  print(f'{"program":<30} {"buffers":>8} {"bands":>6} {"view s":>8} {"compile s":>10} '
        f'{"share":>7}')
  print('(view: timeline_view of a compile; share: of compile_costs of the same program, '
        'same run)')
  bench_timeline('transformer, 24 layers', *examples.transformer(num_layers=24), args.repeats)
  bench_timeline('transformer under scan', *examples.transformer(num_layers=24, use_scan=True),
                 args.repeats)
  return 0


if __name__ == '__main__':
  sys.exit(main())
