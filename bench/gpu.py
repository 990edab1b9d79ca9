"""The GPU at hand against the compile-only GPU target made from its own config.

One command, for a machine with a GPU (the run that matters) and for one
without (the same script, prepared and checked: the CPU stands in for the
live device, and the compile-only target is OpenXLA's H100 SXM):

    .venv/bin/python bench/gpu.py [--quick] [--json bench/results/gpu-<device>.json]

Without a GPU the sizes are ``--quick``'s: its full sizes (and 20 timed
runs of each step) are a GPU's minutes and a CPU's hours.

On the example transformer, under ``scan`` and unrolled, for "as written"
and every built-in policy:

1. **live against compile-only**: XLA's compiled peak, temp and executed
   FLOPs on the live device, beside the same step compiled for a
   compile-only target made from the live GPU's own target config (captured
   here with ``rx.gpu_target_config()`` and written beside the JSON). Equal,
   or the difference printed: a live GPU autotunes its kernels, a
   compile-only one compiles with XLA's defaults.
2. **timeline against XLA**: the memory timeline's peak against
   ``peak_memory_in_bytes``; and on a live GPU, the device's
   ``memory_stats()`` peak after running the step against the compiled peak.
3. **step time per policy** (median of 20 runs after a warm-up) against
   executed FLOPs, with the Pareto front in time.
4. **the four lowerings** of one policy: FLOPs executed, and whether XLA kept
   the recompute (``barrier`` is JAX's own).
5. **offloading**: ``save_and_offload_only_these_names`` to ``pinned_host``
   against saving the same names on the device: device temp and step time.
6. **``rx.checkpoint`` against ``jax.checkpoint``**: temp and FLOPs ratios,
   step time ratio.
7. **``checkpointed_scan`` against Equinox's checkpointed ``while_loop``**
   (``bench/scans.py``'s rows, each in a process of its own).

Each section records what failed, with its reason, and goes on: a short
device run still gives the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import remat_explorer as rx  # noqa: E402
from remat_explorer import examples  # noqa: E402
from remat_explorer.analysis import builtin_policies, compare, compile_costs  # noqa: E402
from remat_explorer.analysis import recompute_eliminated  # noqa: E402
from remat_explorer.analysis.units import format_bytes, format_flops  # noqa: E402

RESULTS = ROOT / 'bench' / 'results'


def _section(results: dict, name: str, save):
  """A decorator running one section into ``results[name]``, its failure
  recorded rather than raised, and the results so far written out by
  `save` (a run cut short by its time limit keeps its finished sections)."""
  def run(fn):
    start = time.perf_counter()
    print(f'\n== {name}', flush=True)
    try:
      results[name] = fn()
    except Exception as e:  # recorded: the other sections still run
      results[name] = {'error': f'{type(e).__name__}: {e}',
                       'traceback': traceback.format_exc(limit=4)}
      print(f'   failed: {type(e).__name__}: {e}', flush=True)
    results[name + ' seconds'] = time.perf_counter() - start
    save()
    return fn
  return run


def _live_and_target(quick: bool):
  """(the live device, the target mesh, the target config used, why no
  target could be made or None): the GPU here and a compile-only copy of
  it, or the CPU and OpenXLA's H100."""
  gpus = [d for d in jax.devices() if d.platform == 'gpu']
  if gpus:
    config = rx.gpu_target_config()
    try:
      rx.register_gpu_target('live_gpu', config)
      return gpus[0], rx.target_mesh('live_gpu'), config, None
    except Exception as e:  # the live figures are still worth having
      traceback.print_exc()
      return gpus[0], None, config, f'{type(e).__name__}: {e}'
  from remat_explorer.analysis.targets.gpu_configs import gpu_target
  return jax.devices()[0], rx.target_mesh('h100'), gpu_target('h100').config, None


def _transformer(use_scan: bool, quick: bool, **kwargs):
  sizes = (dict(num_layers=2, d_model=128, seq_len=128, batch=8) if quick else
           dict(num_layers=6, d_model=1024, seq_len=1024, batch=8))
  return examples.transformer(use_scan=use_scan, **sizes, **kwargs)


def live_against_target(live, mesh, quick: bool) -> dict:
  rows = []
  for use_scan in (True, False):
    loss_fn, args = _transformer(use_scan, quick)
    names = rx.analyze(loss_fn, *args).names_in_program
    for label, policy in {'as written': None, **builtin_policies(names)}.items():
      row = {'model': 'scan' if use_scan else 'unrolled', 'policy': label}
      rows.append(row)
      try:
        here = compile_costs(loss_fn, *args, policy=policy)
        there = (compile_costs(loss_fn, *rx.on_target(args, mesh), policy=policy)
                 if mesh is not None else None)
      except Exception as e:  # recorded: the other policies still run
        row['error'] = f'{type(e).__name__}: {e}'
        print(f'   {row["model"]:8s} {label[:40]:40s} failed: {row["error"][:200]}', flush=True)
        continue
      for side, c in (('live', here), ('target', there)):
        if c is None:
          continue
        row.update({f'{side}_{k}': getattr(c, k) for k in (
            'peak_bytes', 'temp_bytes', 'executed_flops', 'xla_flops', 'peak_memory_bytes',
            'failed')})
        row[f'{side}_timeline_peak'] = c.timeline.peak_bytes if c.timeline else None
        row[f'{side}_kind'] = c.device_kind
      if there is None:
        print(f'   {row["model"]:8s} {label[:40]:40s} peak {format_bytes(here.peak_bytes):>10s}'
              f' FLOPs {format_flops(here.executed_flops):>10s}', flush=True)
        continue
      same = row['live_peak_bytes'] == row['target_peak_bytes']
      traced = (f"{row['target_timeline_peak'] / there.peak_bytes:.4f}"
                if row['target_timeline_peak'] and there.peak_bytes else 'none')
      print(f'   {row["model"]:8s} {label[:40]:40s} peak {format_bytes(here.peak_bytes):>10s} '
            f'| target {format_bytes(there.peak_bytes):>10s} {"=" if same else "≠"} | FLOPs '
            f'{format_flops(here.executed_flops):>10s} | {format_flops(there.executed_flops):>10s}'
            f' | target timeline/XLA {traced}', flush=True)
  return {'rows': rows, 'live': live.device_kind,
          'target': mesh.devices.flat[0].device_kind if mesh is not None else None}


def step_times(quick: bool) -> dict:
  """Median step time of each policy against its executed FLOPs, and the
  device's measured peak against the compiled one."""
  loss_fn, args = _transformer(True, quick)
  repeats = 5 if quick else 20
  table = compare(loss_fn, *args, repeats=repeats, suggest_lowering=False)
  rows = [{'policy': r.label, 'peak_bytes': r.peak_bytes, 'flops': r.compiled_flops,
           'run_seconds': r.run_seconds, 'measured_peak_bytes': r.costs.measured_peak_bytes}
          for r in table.rows if not r.failed]
  timed = [r for r in rows if r['run_seconds'] is not None]
  front = [r['policy'] for r in timed if not any(
      o['peak_bytes'] <= r['peak_bytes'] and o['run_seconds'] < r['run_seconds']
      for o in timed if o is not r)]
  for r in rows:
    print(f'   {r["policy"][:40]:40s} peak {format_bytes(r["peak_bytes"]):>10s} FLOPs '
          f'{format_flops(r["flops"]):>10s} step {1e3 * (r["run_seconds"] or 0):8.2f} ms '
          f'measured peak {format_bytes(r["measured_peak_bytes"]):>10s}'
          f'{"  (front in time)" if r["policy"] in front else ""}', flush=True)
  return {'rows': rows, 'front_in_time': front, 'repeats': repeats}


def lowerings(quick: bool) -> dict:
  """The unrolled step under ``nothing_saveable`` in each lowering, beside
  the same step saving everything: the FLOPs the recompute adds where XLA
  kept it, and what the matmul counts say (``recompute_eliminated``)."""
  loss_fn, args = _transformer(False, quick)
  policy = rx.checkpoint_policies.nothing_saveable
  saving = compile_costs(loss_fn, *args, policy=rx.checkpoint_policies.everything_saveable)
  report = rx.analyze(loss_fn, *args, policy=policy)
  out = {'everything_saveable': {'peak_bytes': saving.peak_bytes,
                                 'flops': saving.executed_flops},
         'recompute_flops_in_jaxpr': report.recompute_flops}
  for lowering in ('barrier', 'cond', 'while', 'none'):
    c = compile_costs(loss_fn, *args, policy=policy, lowering=lowering)
    merged = recompute_eliminated(
        rx.analyze(loss_fn, *args, policy=policy, lowering=lowering), c)
    added = (c.executed_flops - saving.executed_flops
             if c.executed_flops is not None and saving.executed_flops is not None else None)
    out[lowering] = {'peak_bytes': c.peak_bytes, 'flops': c.executed_flops,
                     'flops_added': added, 'matmuls': (c.lowered_matmuls, c.compiled_matmuls),
                     'matmul_counts_say_merged': bool(merged)}
    share = (f'{added / report.recompute_flops:6.1%}' if added is not None
             and report.recompute_flops else '     —')
    print(f'   {lowering:8s} peak {format_bytes(c.peak_bytes):>10s} FLOPs '
          f'{format_flops(c.executed_flops):>10s}, {share} of the recompute executed; '
          f'matmuls lowered {c.lowered_matmuls}, compiled {c.compiled_matmuls}', flush=True)
  return out


def offloading(quick: bool) -> dict:
  loss_fn, args = _transformer(True, quick)
  names = ('mlp_hidden', 'attention_output')
  pol = jax.checkpoint_policies
  choices = {'device': pol.save_only_these_names(*names),
             'pinned_host': pol.save_and_offload_only_these_names(
                 names_which_can_be_saved=(), names_which_can_be_offloaded=list(names),
                 offload_src='device', offload_dst='pinned_host')}
  out = {}
  for where, policy in choices.items():
    c = compile_costs(loss_fn, *args, policy=policy, repeats=5 if quick else 20)
    out[where] = {'temp_bytes': c.temp_bytes, 'host_temp_bytes': c.host_temp_bytes,
                  'peak_bytes': c.peak_bytes, 'run_seconds': c.run_seconds,
                  'failed': c.failed, 'error': c.error}
    print(f'   residuals on {where:12s} device temp {format_bytes(c.temp_bytes):>10s} host temp '
          f'{format_bytes(c.host_temp_bytes):>10s} step {1e3 * (c.run_seconds or 0):8.2f} ms',
          flush=True)
  return out


def against_jax_checkpoint(quick: bool) -> dict:
  """The same unrolled transformer, its blocks under ``rx.checkpoint`` and
  under ``jax.checkpoint`` (``bench/engine.py``'s model)."""
  from bench.engine import transformer_unrolled
  sizes = dict(layers=2, width=64, seq=32) if quick else dict(layers=8, width=256, seq=256)
  policy = jax.checkpoint_policies.dots_saveable
  repeats = 5 if quick else 20
  measured = {name: compile_costs(*transformer_unrolled(ck, policy, **sizes)[:1],
                                  *transformer_unrolled(ck, policy, **sizes)[1],
                                  repeats=repeats)
              for name, ck in (('ours', rx.checkpoint), ('jax', jax.checkpoint))}
  ours, theirs = measured['ours'], measured['jax']
  ratio = lambda a, b: None if a is None or not b else a / b
  out = {'temp_ratio': ratio(ours.temp_bytes, theirs.temp_bytes),
         'flops_ratio': ratio(ours.executed_flops, theirs.executed_flops),
         'time_ratio': ratio(ours.run_seconds, theirs.run_seconds)}
  print(f'   rx.checkpoint / jax.checkpoint: temp {out["temp_ratio"]}, FLOPs '
        f'{out["flops_ratio"]}, step time {out["time_ratio"]}', flush=True)
  return out


def scans(quick: bool) -> dict:
  from bench import scans as scan_bench
  n, s = (256, 4) if quick else (1024, 8)
  rows = {}
  for method in ('ours: binomial', 'equinox checkpointed'):
    rows[method] = scan_bench.run_row(method, n, s, repeats=5, timeout=180)
    print(f'   {method:24s} {rows[method]}', flush=True)
  return {'n': n, 's': s, 'rows': rows}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true', help='small sizes, fewer runs')
  parser.add_argument('--json', default=None)
  parser.add_argument('--only', nargs='+', metavar='SECTION', help=(
      'run only the sections whose names start with these words '
      '(live, step, rx.checkpoint, lowerings, offloading, checkpointed_scan)'))
  a = parser.parse_args()
  live, mesh, config, no_target = _live_and_target(a.quick)
  target_kind = mesh.devices.flat[0].device_kind if mesh is not None else None
  a.quick = a.quick or live.platform == 'cpu'
  results_quick = a.quick
  results = {'jax': jax.__version__, 'quick': results_quick, 'live_device': live.device_kind,
             'live_platform': live.platform, 'target': target_kind,
             'no_target': no_target}
  print(f'live: {live.device_kind} ({live.platform}); compile-only target: '
        f'{target_kind or no_target}; JAX {jax.__version__}')
  name = live.device_kind.replace(' ', '_').lower()
  out = Path(a.json) if a.json else RESULTS / f'gpu-{name}.json'
  out.parent.mkdir(parents=True, exist_ok=True)
  if live.platform == 'gpu':
    (out.parent / f'target_config-{name}.txtpb').write_text(config)
  save = lambda: out.write_text(json.dumps(results, indent=1, default=str))
  wanted = lambda name: not a.only or any(name.startswith(w) for w in a.only)
  section = lambda name: (_section(results, name, save) if wanted(name)
                          else (lambda fn: fn))
  section('live against compile-only')(lambda: live_against_target(live, mesh, a.quick))
  section('step times')(lambda: step_times(a.quick))
  section('rx.checkpoint against jax.checkpoint')(lambda: against_jax_checkpoint(a.quick))
  section('lowerings')(lambda: lowerings(a.quick))
  section('offloading')(lambda: offloading(a.quick))
  section('checkpointed_scan against equinox')(lambda: scans(a.quick))
  print(f'\nwrote {out}')


if __name__ == '__main__':
  main()
