"""Pod-scale targets: a 1.3B-parameter Flax Linen LM on a v5e-256 and 32 H100s,
compiled from this machine, which has neither.

The model is written as its users write it: ``nn.scan(nn.remat(Block))``, 24
layers, d_model 2048, 16 heads, an MLP of 8192, sequences of 2048 tokens,
parameters in float32 computed in bfloat16, an optax cross-entropy. Its
parameters are sharded FSDP over ``data`` and Megatron-style over ``model``;
the batch over ``data``. Nothing is allocated: the arguments are
``jax.ShapeDtypeStruct``s on ``target_mesh``'s compile-only devices.

For each target it measures, in one run:

* ``compare`` of every built-in policy, the program as written and no remat:
  its time, the peak RSS of this process, and each row's per-device peak
  against the device's memory;
* the same steps compiled by hand (``jax.jit(jax.value_and_grad(f))``, each
  policy applied with ``jax.checkpoint``'s own policies through the model's
  ``nn.remat``), one at a time in a process of their own, first: their
  summed time and peak RSS, the ratios, and that each hand peak equals
  ``compare``'s row;
* ``search_policy`` at 90% of the device's memory: its time, compiles and
  answer, checked against every row of the comparison that fits (a searched
  policy is never beaten on both peak and FLOPs by a row of the same table).

    .venv/bin/python bench/pod_targets.py [--targets v5e:16x16 h100:4x8]
        [--layers 24] [--no-hand] [--no-search] [--json bench/results/pod_targets.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import remat_explorer as rx  # noqa: E402
from bench.process_memory import peak_rss_mib  # noqa: E402
from remat_explorer.analysis import builtin_policies  # noqa: E402
from remat_explorer.analysis.units import format_bytes, format_flops  # noqa: E402

VOCAB = 32000
MESHES = {'v5e:16x16': {'data': 64, 'model': 4}, 'h100:4x8': {'data': 8, 'model': 4}}
PER_DATA_SHARD_BATCH = 4


class Block(nn.Module):
  d_model: int
  num_heads: int
  d_ff: int
  mesh: object

  @nn.compact
  def __call__(self, x, _):
    dense = lambda features, name: nn.Dense(features, name=name, dtype=jnp.bfloat16)
    x = jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, P('data', None, None)))
    h = nn.LayerNorm(name='ln_attn', dtype=jnp.bfloat16)(x)
    qkv = checkpoint_name(dense(3 * self.d_model, 'qkv')(h), 'qkv')
    q, k, v = jnp.split(qkv, 3, axis=-1)
    b, t, d = q.shape
    heads = lambda y: y.reshape(b, t, self.num_heads, d // self.num_heads)
    logits = jnp.einsum('bqhd,bkhd->bhqk', heads(q), heads(k)) / (d // self.num_heads) ** 0.5
    causal = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
    attended = jnp.einsum('bhqk,bkhd->bqhd', probs, heads(v)).reshape(b, t, d)
    x = x + checkpoint_name(dense(d, 'attn_out')(attended), 'attn_out')
    h = nn.LayerNorm(name='ln_mlp', dtype=jnp.bfloat16)(x)
    h = checkpoint_name(jax.nn.gelu(dense(self.d_ff, 'mlp_in')(h)), 'mlp_hidden')
    return x + dense(d, 'mlp_out')(h), None


class LM(nn.Module):
  num_layers: int = 24
  d_model: int = 2048
  num_heads: int = 16
  d_ff: int = 8192
  policy: object = None
  mesh: object = None
  remat: bool = True

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, self.d_model, name='embed')(tokens).astype(jnp.bfloat16)
    block = nn.remat(Block, policy=self.policy, prevent_cse=False) if self.remat else Block
    x, _ = nn.scan(block, variable_axes={'params': 0}, split_rngs={'params': True},
                   length=self.num_layers)(self.d_model, self.num_heads, self.d_ff,
                                           self.mesh, name='layers')(x, None)
    x = nn.LayerNorm(name='ln_final', dtype=jnp.bfloat16)(x)
    return nn.Dense(VOCAB, name='head', dtype=jnp.bfloat16)(x)


def _spec(path: str, ndim: int) -> P:
  """FSDP over 'data' and tensor parallelism over 'model', by parameter."""
  lead = (None,) if path.startswith('layers') else ()
  if path.endswith(('qkv/kernel', 'mlp_in/kernel')):
    return P(*lead, 'data', 'model')
  if path.endswith(('attn_out/kernel', 'mlp_out/kernel')):
    return P(*lead, 'model', 'data')
  if path.endswith(('qkv/bias', 'mlp_in/bias')):
    return P(*lead, 'model')
  if path == 'embed/embedding':
    return P('model', 'data')
  if path == 'head/kernel':
    return P('data', 'model')
  return P(*([None] * ndim))


def lm_step(mesh, layers: int, policy=None, remat: bool = True):
  """(loss_fn, (params, tokens)), abstract and sharded over `mesh`."""
  model = LM(num_layers=layers, policy=policy, mesh=mesh, remat=remat)
  batch = PER_DATA_SHARD_BATCH * mesh.shape['data']
  tokens = jax.ShapeDtypeStruct((batch, 2048), jnp.int32,
                                sharding=NamedSharding(mesh, P('data', None)))
  shapes = jax.eval_shape(lambda t: model.init(jax.random.key(0), t)['params'], tokens)

  params = rx.on_target(shapes, mesh, lambda path, leaf: _spec(path, leaf.ndim))

  def loss_fn(params, tokens):
    logits = model.apply({'params': params}, tokens)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits[:, :-1], tokens[:, 1:]).mean()
  return loss_fn, (params, tokens)


def bench_target(target: str, layers: int, hand: bool, search: bool) -> dict:
  mesh = rx.target_mesh(target, MESHES[target])
  loss_fn, args = lm_step(mesh, layers)
  n_params = sum(int(jnp.prod(jnp.array(x.shape))) for x in jax.tree_util.tree_leaves(args[0]))
  print(f'\n== {target}: {mesh.size} × {mesh.devices.flat[0].device_kind}, mesh '
        f'{dict(mesh.shape)}, {n_params / 1e9:.2f}B parameters, batch {args[1].shape[0]} '
        f'× {args[1].shape[1]} tokens', flush=True)
  out = {'target': target, 'devices': mesh.size, 'parameters': n_params}

  start = time.perf_counter()
  table = rx.compare(loss_fn, *args, progress=lambda done, total, label: print(
      f'   [{done}/{total}] {label}', flush=True))
  out['compare_seconds'] = time.perf_counter() - start
  out['compare_rss_mib'] = peak_rss_mib()
  memory = table.device_memory_bytes
  print(f'compare: {out["compare_seconds"]:.1f} s, peak RSS {out["compare_rss_mib"]:.0f} MiB; '
        f'device memory {format_bytes(memory)}')
  rows = []
  for r in table.rows:
    share = None if r.peak_bytes is None else r.peak_bytes / memory
    rows.append({'label': r.label, 'peak_bytes': r.peak_bytes, 'share': share,
                 'flops': r.compiled_flops, 'compile_seconds': r.compile_seconds,
                 'error': r.costs.error if r.failed else None})
    if r.failed:
      print(f'   {r.label[:44]:44s} XLA refused it: {(r.costs.error or "")[:160]}')
    print(f'   {r.label[:44]:44s} peak {format_bytes(r.peak_bytes):>10s} '
          f'{"—" if share is None else f"{share:6.1%}"} of device '
          f'{"fits" if share is not None and share <= 1 else "DOES NOT FIT":12s} '
          f'FLOPs {format_flops(r.compiled_flops):>10s}', flush=True)
  out['rows'] = rows

  if hand:
    hand_out = _hand_in_a_process(target, layers)
    mismatches = [(label, table.row(label).peak_bytes, peak)
                  for label, peak in hand_out['peaks'].items()
                  if table.row(label) is not None and table.row(label).peak_bytes != peak]
    out.update(hand_seconds=hand_out['seconds'], hand_rss_mib=hand_out['rss_mib'],
               hand_mismatches=mismatches)
    print(f'by hand, in a process of its own: {len(hand_out["peaks"])} compiles one at a '
          f'time in {hand_out["seconds"]:.1f} s, peak RSS {hand_out["rss_mib"]:.0f} MiB; '
          f'compare of the same rows: {out["compare_seconds"] / hand_out["seconds"]:.2f}× '
          f'the time, {out["compare_rss_mib"] / hand_out["rss_mib"]:.2f}× the RSS; '
          f'peaks differing from compare\'s: {mismatches or "none"}')

  if search:
    start = time.perf_counter()
    found = rx.search_policy(loss_fn, *args, memory_budget='90%', progress=lambda d, t, l: print(
        f'   search [{d}/{t}] {l}', flush=True))
    out['search_seconds'] = time.perf_counter() - start
    beaten = [r.label for r in table.rows if r.peak_bytes is not None
              and r.compiled_flops is not None and r.peak_bytes <= found.budget_bytes
              and r.peak_bytes <= found.peak_bytes and r.compiled_flops < found.flops]
    out.update(search_label=found.label, search_peak=found.peak_bytes,
               search_flops=found.flops, search_compiles=found.compiles_used,
               search_rss_mib=peak_rss_mib(), search_beaten_by=beaten)
    print(f'search at 90% ({format_bytes(found.budget_bytes)}): {found.label} peak '
          f'{format_bytes(found.peak_bytes)} ({found.peak_bytes / memory:.1%}), FLOPs '
          f'{format_flops(found.flops)}; {found.compiles_used} compiles, '
          f'{out["search_seconds"]:.1f} s; beaten by a row of the table: {beaten or "none"}')
  return out


def hand_compiles(target: str, layers: int, names) -> dict:
  """Every row of the comparison compiled by hand, one at a time: the
  program as written (nn.remat's own policy), without remat, and each
  built-in policy (``jax.checkpoint``'s own, through nn.remat)."""
  mesh = rx.target_mesh(target, MESHES[target])
  programs = {'as written': dict(), 'no remat': dict(remat=False),
              **{label: dict(policy=jax_policy(p))
                 for label, p in builtin_policies(names).items()}}
  seconds, peaks = 0.0, {}
  for label, options in programs.items():
    hand_loss, hand_args = lm_step(mesh, layers, **options)
    start = time.perf_counter()
    try:
      compiled = jax.jit(jax.value_and_grad(hand_loss)).lower(*hand_args).compile()
      peaks[label] = compiled.memory_analysis().peak_memory_in_bytes
    except jax.errors.JaxRuntimeError as e:  # XLA refused it: out of memory, say
      peaks[label] = None
      print(f'   by hand {label[:40]:40s} refused: {str(e).splitlines()[0][:120]}')
    seconds += time.perf_counter() - start
    print(f'   by hand {label[:40]:40s} peak {format_bytes(peaks[label]):>10s}', flush=True)
  return {'seconds': seconds, 'rss_mib': peak_rss_mib(), 'peaks': peaks}


def _hand_in_a_process(target: str, layers: int) -> dict:
  """``hand_compiles`` in a process of its own, so its peak RSS is its own."""
  import subprocess
  import tempfile
  with tempfile.NamedTemporaryFile(suffix='.json') as f:
    subprocess.run([sys.executable, __file__, '--hand-only', '--targets', target,
                    '--layers', str(layers), '--json', f.name], check=True)
    return json.loads(Path(f.name).read_text())


def jax_policy(policy):
  """The engine's built-in policy as the ``jax.checkpoint`` policy of the same name,
  for the hand compiles (nn.remat is JAX's own remat)."""
  from remat_explorer.analysis import describe_policy  # noqa: F401
  name = getattr(policy, '__name__', None) or repr(policy)
  if hasattr(jax.checkpoint_policies, name):
    return getattr(jax.checkpoint_policies, name)
  return policy


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--targets', nargs='+', default=list(MESHES))
  parser.add_argument('--layers', type=int, default=24)
  parser.add_argument('--no-hand', action='store_true')
  parser.add_argument('--no-search', action='store_true')
  parser.add_argument('--json', default=None)
  parser.add_argument('--hand-only', action='store_true', help=argparse.SUPPRESS)
  a = parser.parse_args()
  if a.hand_only:  # the baseline, run by bench_target in a process of its own
    loss_fn, args = lm_step(rx.target_mesh(a.targets[0], MESHES[a.targets[0]]), a.layers)
    names = rx.analyze(loss_fn, *args).names_in_program
    Path(a.json).write_text(json.dumps(hand_compiles(a.targets[0], a.layers, names)))
    return
  results = [bench_target(t, a.layers, not a.no_hand, not a.no_search) for t in a.targets]
  if a.json:
    Path(a.json).write_text(json.dumps({'jax': jax.__version__, 'results': results},
                                       indent=1, default=str))


if __name__ == '__main__':
  main()
