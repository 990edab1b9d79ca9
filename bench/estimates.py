"""Estimates before the compile: ``estimate_costs`` against ``compile_costs``.

For every example model (``remat_explorer/examples.py``, the transformer
also under ``scan``), the transformer over 512 tokens, the convnet written
channels-first, and the Flax /
Equinox models of
``tests/framework_models.py``, and two outside models as users install
them, where they are: recurrentgemma's own Griffin (``pip install
recurrentgemma``, its inner recurrence unrolled) and Hugging Face's Flax
BERT and Flax Whisper (``pip install 'transformers<5'``, their layers a list run by a
loop; Whisper's encoder starts with convolutions),
under no remat and every built-in policy
(the model's own names policy included): the estimated peak against the
compiled one (``CompiledCosts.peak_bytes``), the estimated FLOPs against the
compiled program's executed FLOPs, and the estimate's time over the
uncached ``compile_costs`` call's, both measured in this run with the caches
cleared: in full (its trace of the step included) and what it adds to the
compile, which traces the same step once with it (``trace_step``), less any
full garbage collection of the process that fell inside it. Targets:
peak within 10% on every model x policy, median within 5%, an estimate
under 2% of the compile's time; no two policies whose compiled peaks
differ by more than 10% ordered the other way, and none that save
different residuals and compile to peaks more than 1% apart given one
estimate.

With ``--target h100`` (any ``target_mesh`` name) every step's arguments
are placed on one device of that target (abstract, replicated) and the
estimate is measured against what XLA compiles for it: the estimate
follows the target's platform (``split/backend.py``).

Then ``search_policy(rank_by_estimate=True)`` on the example transformer at
a few budgets, and on the Flax Linen, NNX and Equinox transformers between
the extremes (also at the tests' sizes, batch 2 and 8 tokens): the
compiles it runs (target: at most 3), its answer beside
the search that compiles every candidate, and the candidates that search
compiled which beat it (target: none); and the rows its own table shows at
calibrated estimates: how far they land from their compiles, and any that
beats its answer (target: none). With a target of several
devices (``--target h100:8``) the search's transformer is data parallel
over all of them.

    .venv/bin/python bench/estimates.py [--no-frameworks] [--no-search] [--only griffin ...]
                                        [--target h100]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tests'))
from remat_explorer import examples  # noqa: E402
from remat_explorer.analysis import (NO_REMAT, builtin_policies, clear_caches,  # noqa: E402
                                     compile_costs, estimate_costs, search_policy)


EXAMPLES = ('mlp (scan)', 'transformer (unrolled)', 'transformer (scan)', 'convnet')
"""The models the targets are set on; the others are measured beside them."""


def models(frameworks: bool):
  yield 'mlp (scan)', examples.mlp(), examples.MLP_NAMES
  yield 'transformer (unrolled)', examples.transformer(), examples.TRANSFORMER_NAMES
  yield 'transformer (scan)', examples.transformer(use_scan=True), examples.TRANSFORMER_NAMES
  yield 'convnet', examples.convnet(), examples.CONVNET_NAMES
  # Attention over 512 tokens: its probabilities, not the layers' widths,
  # fill the memory (the example's default is 64 tokens).
  yield 'transformer (512 tokens)', examples.transformer(seq_len=512), examples.TRANSFORMER_NAMES
  import framework_models
  yield 'convnet (NCHW)', framework_models.channels_first_convnet(), ('conv_output',)
  if frameworks:
    yield 'flax linen', framework_models.linen_transformer(), ()
    yield 'flax nnx', framework_models.nnx_transformer(), ()
    yield 'equinox', framework_models.equinox_transformer(), ()
    yield 'linen recurrent', framework_models.linen_recurrent(batch=8, seq=256, width=256,
                                                              depth=4), ()
    # Outside models, installed as packages: pip install recurrentgemma
    # 'transformers<5' (each left out where it is not installed).
    if _installed('recurrentgemma', 'its Griffin'):
      yield 'griffin (recurrentgemma)', framework_models.griffin(), ()
    if _installed('transformers', 'its Flax BERT'):
      yield 'bert (transformers)', framework_models.hf_bert(), ()
      yield 'whisper (transformers)', framework_models.hf_whisper(), ()


def _installed(package: str, what: str) -> bool:
  try:
    __import__(package)
  except ImportError:
    print(f'({package} is not installed: {what} is left out)')
    return False
  return True


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--no-frameworks', action='store_true',
                      help='skip the Flax and Equinox models')
  parser.add_argument('--no-search', action='store_true',
                      help='skip the search ranked by estimate')
  parser.add_argument('--only', nargs='+', metavar='MODEL',
                      help="these models alone, by the start of their names ('griffin')")
  parser.add_argument('--target', metavar='TARGET',
                      help="compile for this target's first device ('h100', 'v5e:2x2')")
  options = parser.parse_args()
  if options.target:
    import jax
    jax.config.update('jax_platforms', 'cpu')  # before the CUDA plugin loads
  bench_estimates(not options.no_frameworks, options.only, options.target)
  if not options.no_search:
    bench_search(options.target, not options.no_frameworks)


def on_one_device(args, target: str | None):
  """`args` as abstract arguments on one device of `target` (as they are
  where `target` is None)."""
  if target is None:
    return args
  import numpy as np
  from jax.sharding import Mesh
  from remat_explorer import on_target, target_mesh
  device = target_mesh(target).devices.flat[0]
  return on_target(args, Mesh(np.array([device]), ('data',)))


class FullCollections:
  """When Python's full garbage collections ran: a full collection walks
  every object the process holds, and one that falls inside an estimate's
  few milliseconds is the process's cost, not the estimate's."""

  def __init__(self):
    self.spans: list[tuple[float, float]] = []
    self._start = None
    gc.callbacks.append(self._note)

  def _note(self, phase, info):
    if info['generation'] == 2:
      if phase == 'start':
        self._start = time.perf_counter()
      elif self._start is not None:
        self.spans.append((self._start, time.perf_counter()))

  def within(self, start: float, end: float) -> float:
    """Seconds of full collections between `start` and `end`."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.spans)


def bench_estimates(frameworks: bool, only=None, target=None) -> None:
  peak_errors, flops_errors, time_ratios, added_ratios = [], [], [], []
  outside_errors, peaks = [], {}
  collections, collected = FullCollections(), []
  matched = False
  print(f'{"model":<24} {"policy":<36} {"peak est/compiled":>24} {"error":>8} '
        f'{"FLOPs error":>11} {"time (of compile)":>18} {"added":>7}')
  for name, (loss_fn, args), names in models(frameworks):
    if only and not any(name.startswith(start) for start in only):
      continue
    args = on_one_device(args, target)
    matched = True
    for label, policy in {'no remat': NO_REMAT, **builtin_policies(names)}.items():
      clear_caches()
      estimate = estimate_costs(loss_fn, *args, policy=policy)
      start = time.perf_counter()
      # The model ran last in the call that just returned.
      in_model = collections.within(start - estimate.model_seconds, start)
      costs = compile_costs(loss_fn, *args, policy=policy)
      # The compile reuses the estimate's trace of the step: alone, it
      # would have traced it too.
      trace_seconds = estimate.seconds - estimate.model_seconds
      compile_seconds = time.perf_counter() - start + trace_seconds
      if costs.failed:  # XLA's own failure: nothing to measure against
        print(f'{name:<24} {label[:36]:<36} XLA did not compile it: {costs.error_line[:90]}')
        continue
      peak_error = estimate.peak_bytes / costs.peak_bytes - 1
      flops_error = (estimate.flops / costs.executed_flops - 1
                     if costs.executed_flops else None)
      ratio = estimate.seconds / compile_seconds
      added = (estimate.model_seconds - in_model) / compile_seconds
      collected.append(in_model)
      (peak_errors if name in EXAMPLES else outside_errors).append(abs(peak_error))
      peaks.setdefault(name, {})[label] = (estimate.peak_bytes, costs.peak_bytes,
                                           estimate.residual_bytes)
      if flops_error is not None:
        flops_errors.append(abs(flops_error))
      time_ratios.append(ratio)
      added_ratios.append(added)
      print(f'{name:<24} {label[:36]:<36} '
            f'{estimate.peak_bytes / 2**20:9.2f} / {costs.peak_bytes / 2**20:7.2f} MiB '
            f'{peak_error:+8.2%} '
            + (f'{flops_error:+11.2%} ' if flops_error is not None else f'{"n/a":>11} ')
            + f'{estimate.seconds * 1e3:5.0f} ms {ratio:6.1%} {added:6.2%}')
  if not matched:
    print(f'no model matched --only {" ".join(only)}')
  if not peaks:
    return
  for which, errors, targets in (('example models', peak_errors, True),
                                 ('the others', outside_errors, False)):
    if errors:
      print(f'peak, {which}: largest error {max(errors):.1%}'
            + (' (target 10%)' if targets else '') + f', median {statistics.median(errors):.1%}'
            + (' (target 5%)' if targets else '')
            + f', within 10% on {sum(e <= 0.10 for e in errors)} of {len(errors)}')
  pairs = [(name, a, b, row_a, row_b) for name, rows in peaks.items()
           for (a, row_a), (b, row_b) in itertools.combinations(rows.items(), 2)]
  inverted = [(name, a, b) for name, a, b, (est_a, got_a, _), (est_b, got_b, _) in pairs
              if abs(got_a / got_b - 1) > 0.10 and (est_a < est_b) != (got_a < got_b)]
  print(f'order: {len(inverted)} pairs of policies whose compiled peaks differ by more than '
        f'10% ordered the other way by the estimate (target 0)'
        + ''.join(f'\n  {name}: {a} / {b}' for name, a, b in inverted))
  alike = [(name, a, b) for name, a, b, (est_a, got_a, res_a), (est_b, got_b, res_b) in pairs
           if res_a != res_b and est_a == est_b and abs(got_a / got_b - 1) > 0.01]
  print(f'alike: {len(alike)} pairs of policies that save different residuals and compile to '
        f'peaks more than 1% apart, given one estimated peak (target 0)'
        + ''.join(f'\n  {name}: {a} / {b}' for name, a, b in alike))
  if flops_errors:
    print(f'FLOPs: largest error {max(flops_errors):.1%}, median '
          f'{statistics.median(flops_errors):.1%}')
  print(f'time: the estimate, its trace included, over compile_costs alone: median '
        f'{statistics.median(time_ratios):.1%}, largest {max(time_ratios):.1%}; '
        f'what it adds to the compile, which shares its trace: median '
        f'{statistics.median(added_ratios):.2%}, largest {max(added_ratios):.2%} (target 2%), '
        f'not counting the full garbage collections that fell inside it '
        f'({sum(c > 0 for c in collected)} of {len(collected)}, at most '
        f'{max(collected) * 1e3:.0f} ms)')



def bench_search(target=None, frameworks=True) -> None:
  """On a target of several devices (``h100:8``) the transformer is data
  parallel over all of them, eight sequences each, and a budget in bytes
  (the 0.5 budget's) is tried too: a sharded program's estimate is the
  whole program's, and the budget per device. On one device the Flax
  Linen, NNX and Equinox transformers are searched too, at budgets between
  the extremes. Each answer ranked by estimate is held against every
  candidate the search that compiles them all compiled: the labels of
  those that beat it (a peak and FLOPs no higher, one of them lower)."""
  from remat_explorer import target_mesh
  devices = target_mesh(target).size if target else 1
  print('search_policy ranked by estimate vs every candidate compiled'
        + (f' for {target}' if target else '')
        + (f', the transformer data parallel over {devices} devices:' if devices > 1 else ':'))
  if devices > 1:
    mesh = target_mesh(target, {'data': devices, 'model': 1})
    searched = {'transformer': examples.sharded_transformer(
        mesh, num_layers=4, d_model=128, seq_len=64, batch=8 * devices)}
  else:
    loss_fn, args = examples.transformer()
    searched = {'transformer': (loss_fn, on_one_device(args, target))}
  if frameworks and devices == 1:
    import framework_models
    builds = (('flax linen', framework_models.linen_transformer),
              ('flax nnx', framework_models.nnx_transformer),
              ('equinox', framework_models.equinox_transformer))
    # Also at the sizes tests/test_search_front.py searches them at, where
    # the compiled peaks are under a megabyte and lie bytes apart.
    for suffix, sizes in (('', {}), (' (batch 2, seq 8)', {'batch': 2, 'seq': 8})):
      for name, build in builds:
        loss_fn, args = build(**sizes)
        searched[name + suffix] = (loss_fn, on_one_device(args, target))
  for name, (loss_fn, args) in searched.items():
    budgets = (0.0, 0.5, 1.0, 'bytes') if name == 'transformer' else (0.25, 0.5, 0.75)
    half = None
    for budget in budgets:
      if budget == 'bytes':
        budget = half
      found = {}
      for rank_by_estimate in (True, False):
        clear_caches()
        start = time.perf_counter()
        result = search_policy(loss_fn, *args, memory_budget=budget,
                               rank_by_estimate=rank_by_estimate)
        found[rank_by_estimate] = result, time.perf_counter() - start
      (quick, quick_s), (full, full_s) = found[True], found[False]
      if budget == 0.5:
        half = full.budget_bytes
      beats = lambda c: (c.peak_bytes is not None and c.fits
                         and c.peak_bytes <= quick.peak_bytes and c.flops <= quick.flops
                         and (c.peak_bytes < quick.peak_bytes or c.flops < quick.flops))
      beaten_by = [c.label for c in full.candidates if beats(c)]
      # The rows the search by estimate did not compile: their calibrated
      # figures against the compiles of the search that compiled them.
      compiled = {c.label: c for c in full.candidates if not c.estimated}
      errors = [(c.peak_bytes / compiled[c.label].peak_bytes - 1,
                 c.flops / compiled[c.label].flops - 1)
                for c in quick.candidates if c.estimated and c.label in compiled
                and compiled[c.label].peak_bytes]
      rows = (f'its {len(errors)} estimated rows within {max(abs(p) for p, _ in errors):.1%} '
              f'(peak) and {max(abs(f) for _, f in errors):.1%} (FLOPs) of their compiles'
              if errors else 'no estimated row')
      shown = f'{budget / 2**20:.2f} MiB' if isinstance(budget, int) else budget
      print(f'  {name}, budget {shown}: by estimate {quick.compiles_used} compiles, '
            f'{quick_s:.1f} s, {quick.label[:40]!r} peak {quick.peak_bytes / 2**20:.2f} MiB '
            f'(fits: {quick.peak_bytes <= quick.budget_bytes}) {quick.flops / 1e6:.3f} MFLOP | '
            f'all compiled {full.compiles_used} compiles, {full_s:.1f} s, {full.label[:40]!r} '
            f'{full.peak_bytes / 2**20:.2f} MiB {full.flops / 1e6:.3f} MFLOP '
            f'({quick.flops / full.flops - 1:+.2%}) | '
            f'beaten by: {", ".join(beaten_by) or "none"} (target: none); {rows}, '
            f'beating it: {", ".join(c.label for c in quick.candidates if beats(c)) or "none"} '
            '(target: none)')


if __name__ == '__main__':
  main()
