"""Engine benchmark: our checkpoint against jax.checkpoint, same program, same run.

For a 16-layer MLP under `scan` and an 8-layer unrolled transformer stack,
and every built-in policy, compile the gradient with each implementation and
print the ratios ours/JAX of XLA's compiled temp bytes and FLOPs (target
1.00) and of trace+lower+compile time (target <= 1.05; median of several
interleaved runs, since machines are noisy).

    .venv/bin/python bench/engine.py [--repeats N]
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
from jax.ad_checkpoint import checkpoint_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import remat_explorer as rx  # noqa: E402


def mlp_scan(ck, policy, layers=16, width=256, batch=128):
  rng = np.random.default_rng(0)
  ws = jnp.asarray(rng.standard_normal((layers, width, width)) / np.sqrt(width), jnp.float32)
  x = jnp.asarray(rng.standard_normal((batch, width)), jnp.float32)

  def loss(ws, x):
    layer = ck(lambda h, w: (jnp.tanh(checkpoint_name(h @ w, 'a')), None), policy=policy)
    h, _ = jax.lax.scan(layer, x, ws)
    return jnp.sum(h ** 2)
  return loss, (ws, x)


def transformer_unrolled(ck, policy, layers=8, width=128, seq=64, batch=4, heads=4):
  rng = np.random.default_rng(1)
  init = lambda *s: jnp.asarray(rng.standard_normal(s) / np.sqrt(s[-2]), jnp.float32)
  params = [dict(qkv=init(width, 3 * width), out=init(width, width),
                 up=init(width, 4 * width), down=init(4 * width, width))
            for _ in range(layers)]
  x = jnp.asarray(rng.standard_normal((batch, seq, width)), jnp.float32)

  def block(p, h):
    q, k, v = jnp.split(checkpoint_name(h @ p['qkv'], 'a'), 3, axis=-1)
    split_heads = lambda t: t.reshape(batch, seq, heads, width // heads)
    q, k, v = map(split_heads, (q, k, v))
    scores = checkpoint_name(jnp.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(width // heads), 'b')
    attn = jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(scores), v).reshape(batch, seq, width)
    h = h + attn @ p['out']
    hidden = checkpoint_name(jax.nn.gelu(h @ p['up']), 'a')
    return h + hidden @ p['down']

  def loss(params, x):
    h = x
    for p in params:
      h = ck(block, policy=policy)(p, h)
    return jnp.mean(h ** 2)
  return loss, (params, x)


def policy_cases(policies):
  offload = dict(offload_src='device', offload_dst='pinned_host')
  return {
      'no policy (nothing saved)': None,
      'everything_saveable': policies.everything_saveable,
      'nothing_saveable': policies.nothing_saveable,
      'dots_saveable': policies.dots_saveable,
      'dots_with_no_batch_dims_saveable': policies.dots_with_no_batch_dims_saveable,
      'save_anything_except_these_names': policies.save_anything_except_these_names('a'),
      'save_any_names_but_these': policies.save_any_names_but_these('a'),
      'save_only_these_names': policies.save_only_these_names('a'),
      'save_from_both_policies': policies.save_from_both_policies(
          policies.dots_with_no_batch_dims_saveable, policies.save_only_these_names('b')),
      'save_and_offload_only_these_names': policies.save_and_offload_only_these_names(
          names_which_can_be_saved=['b'], names_which_can_be_offloaded=['a'], **offload),
      'offload_dot_with_no_batch_dims': policies.offload_dot_with_no_batch_dims(**offload),
  }


def compile_once(model, ck, policy):
  """Build a fresh program (so no cache is hit), then trace, lower, compile."""
  loss, args = model(ck, policy)
  start = time.perf_counter()
  compiled = jax.jit(jax.grad(loss)).lower(*args).compile()
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return seconds, memory.temp_size_in_bytes, cost.get('flops', float('nan'))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=int, default=5,
                      help='interleaved compiles per implementation (median time)')
  args = parser.parse_args()
  print(f'device: {jax.devices()[0].device_kind}  jax {jax.__version__}  '
        f'repeats: {args.repeats}')
  header = (f"{'model':<22} {'policy':<34} {'temp MiB':>9} {'temp':>6} "
            f"{'GFLOP':>8} {'flops':>6} {'ms ours':>8} {'ms jax':>8} {'time':>6}")
  print(header)
  print('-' * len(header))
  time_ratios = []
  ours_cases, jax_cases = policy_cases(rx.checkpoint_policies), policy_cases(jax.checkpoint_policies)
  for model_name, model in [('mlp_scan (16 layers)', mlp_scan),
                            ('transformer (8 layers)', transformer_unrolled)]:
    for policy_name in ours_cases:
      ours_times, jax_times = [], []
      for repeat in range(args.repeats):
        # Interleave, alternating who goes first, so drift hits both alike.
        order = [True, False] if repeat % 2 == 0 else [False, True]
        for ours in order:
          if ours:
            t, ours_temp, ours_flops = compile_once(model, rx.checkpoint, ours_cases[policy_name])
            ours_times.append(t)
          else:
            t, jax_temp, jax_flops = compile_once(model, jax.checkpoint, jax_cases[policy_name])
            jax_times.append(t)
      ours_t, jax_t = statistics.median(ours_times), statistics.median(jax_times)
      time_ratios.append(ours_t / jax_t)
      temp_ratio = ours_temp / jax_temp if jax_temp else float(ours_temp == jax_temp)
      print(f'{model_name:<22} {policy_name:<34} {ours_temp / 2**20:>9.2f} '
            f'{temp_ratio:>6.3f} {ours_flops / 1e9:>8.3f} {ours_flops / jax_flops:>6.3f} '
            f'{ours_t * 1e3:>8.1f} {jax_t * 1e3:>8.1f} {ours_t / jax_t:>6.3f}')
  print('-' * len(header))
  print('ratios are ours / jax.checkpoint; targets: temp 1.00, flops 1.00, time <= 1.05')
  print(f'compile-time ratio over {len(time_ratios)} programs: geometric mean '
        f'{statistics.geometric_mean(time_ratios):.3f}, median '
        f'{statistics.median(time_ratios):.3f}, max {max(time_ratios):.3f}')


if __name__ == '__main__':
  main()
