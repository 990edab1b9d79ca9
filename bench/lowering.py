"""Lowering benchmark: one 16-layer model, the recompute lowered four ways.

Compiles the gradient of a 16-layer unrolled MLP (each layer checkpointed,
nothing saved) with each lowering strategy and prints XLA's compiled temp
bytes, FLOPs and the median run time side by side, next to jax.checkpoint's
(which lowers with an optimization barrier) measured in the same run.

    .venv/bin/python bench/lowering.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import remat_explorer as rx  # noqa: E402

LAYERS, WIDTH, BATCH = 16, 512, 256


def model(checkpoint):
  def loss(ws, x):
    for w in ws:
      x = checkpoint(lambda h, w: jnp.tanh(h @ w) * jnp.sin(h))(x, w)
    return jnp.mean(x ** 2)
  rng = np.random.default_rng(0)
  ws = [jnp.asarray(rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH), jnp.float32)
        for _ in range(LAYERS)]
  x = jnp.asarray(rng.standard_normal((BATCH, WIDTH)), jnp.float32)
  return loss, (ws, x)


def measure(checkpoint, repeats):
  loss, args = model(checkpoint)
  compiled = jax.jit(jax.grad(loss)).lower(*args).compile()
  jax.block_until_ready(compiled(*args))  # warm-up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return (compiled.memory_analysis().temp_size_in_bytes, cost.get('flops', float('nan')),
          statistics.median(times))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=int, default=20)
  args = parser.parse_args()
  print(f'device: {jax.devices()[0].device_kind}  jax {jax.__version__}  '
        f'{LAYERS} layers, width {WIDTH}, batch {BATCH}')
  jax_temp, jax_flops, jax_time = measure(jax.checkpoint, args.repeats)
  header = f"{'lowering':<22} {'temp MiB':>9} {'GFLOP':>8} {'run ms':>8} {'temp/jax':>9} {'flops/jax':>9} {'time/jax':>9}"
  print(header)
  print('-' * len(header))
  rows = [('jax.checkpoint', jax.checkpoint)] + [
      (f'ours: {name}', lambda f, name=name: rx.checkpoint(f, lowering=name))
      for name in ('barrier', 'cond', 'while', 'none')]
  for label, ck in rows:
    temp, flops, seconds = ((jax_temp, jax_flops, jax_time) if ck is jax.checkpoint
                            else measure(ck, args.repeats))
    print(f'{label:<22} {temp / 2**20:>9.2f} {flops / 1e9:>8.3f} {seconds * 1e3:>8.2f} '
          f'{temp / jax_temp:>9.3f} {flops / jax_flops:>9.3f} {seconds / jax_time:>9.3f}')


if __name__ == '__main__':
  main()
