"""Memory and time of ``compare`` against the same compiles done by hand.

For an unrolled model and a scanned one (the example transformer both ways)
and a Griffin-style recurrent Flax Linen LM (``--models recurrent``: its
blocks ``nn.remat``ed and unrolled, each a gated linear recurrence under an
unrolled inner scan; ``tests/framework_models.linen_recurrent``), and
recurrentgemma's own Griffin installed from PyPI (``--models griffin``, after
``pip install recurrentgemma``: its blocks cycle recurrent, recurrent,
attention; its RG-LRU scan is unrolled 128 steps at a time), and Hugging
Face's Flax Whisper (``--models whisper``, after ``pip install
'transformers<5'``: an encoder-decoder over 1,500 log-mel frames, its
layers remat'ed by ``enable_gradient_checkpointing``), it
runs in one process ``compare`` of every built-in policy, the program as
written and no remat, and in a process of its own the same training steps
compiled by hand one at a time (``jax.jit(jax.value_and_grad(f))`` with
``jax.checkpoint``'s own policies). It prints each process's peak RSS and
time, and their ratios (targets: RSS at most 1.5x, time at most 1x), then
the peak RSS of the tool's process after a ``search_policy`` and the HTML
report that follow the ``compare`` in it.

    .venv/bin/python bench/memory.py [--layers 12] [--width 256]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests'))
import framework_models  # noqa: E402
import remat_explorer as rx  # noqa: E402
from bench.process_memory import peak_rss_mib  # noqa: E402
from remat_explorer import examples, viz  # noqa: E402
from remat_explorer.analysis import builtin_policies  # noqa: E402

MODELS = ('unrolled', 'scanned', 'recurrent')  # griffin and whisper too, when installed


@contextlib.contextmanager
def _remat_given(model: str, policy):
  """Flax's remat with ``policy``, for outside models that take none, as a
  user would give one: by replacing the remat the model's module calls
  while the step is traced. recurrentgemma's Griffin calls ``nn.remat(block,
  static_argnums=4)``; Hugging Face's Flax Whisper the ``remat`` it took
  from ``flax.linen.partitioning``."""
  if model == 'griffin':
    from flax import linen as owner
  elif model == 'whisper':
    from transformers.models.whisper import modeling_flax_whisper as owner
  else:
    yield
    return
  remat = owner.remat
  if policy is not None:
    owner.remat = functools.partial(remat, policy=policy)
  try:
    yield
  finally:
    owner.remat = remat


def _problem(model: str, layers: int, width: int, policy=None, remat=True):
  if model == 'griffin':
    return framework_models.griffin(layers, width, remat)  # its policy: _remat_given
  if model == 'whisper':
    return framework_models.hf_whisper(layers, width, remat=remat)  # likewise
  if model == 'recurrent':
    return framework_models.linen_recurrent(batch=8, seq=256, width=width, depth=layers,
                                            remat=remat, policy=policy)
  return examples.transformer(num_layers=layers, d_model=width, seq_len=256, batch=16,
                              use_scan=model == 'scanned', policy=policy, remat=remat)


def by_hand(model: str, layers: int, width: int, names: list[str]) -> dict:
  """Every row of the comparison compiled by hand, one at a time. `names`:
  the program's checkpoint names, found by the parent so that this process
  runs nothing of the tool."""
  programs = {'as written': {}, 'no remat': {'remat': False},
              **{label: {'policy': p} for label, p in builtin_policies(names).items()}}
  start = time.perf_counter()
  for options in programs.values():
    loss_fn, args = _problem(model, layers, width, **options)
    with _remat_given(model, options.get('policy')):
      lowered = jax.jit(jax.value_and_grad(loss_fn)).lower(*args)
    lowered.compile().memory_analysis()
  return {'seconds': time.perf_counter() - start, 'rss_mib': peak_rss_mib(),
          'compiles': len(programs)}


def with_compare(model: str, layers: int, width: int) -> dict:
  """``compare`` as the hand side's counterpart, then what a user runs next
  in the same process: ``search_policy`` at half the way from saving
  nothing to saving everything, and the HTML report of the comparison. The
  peak RSS after each."""
  loss_fn, args = _problem(model, layers, width)
  start = time.perf_counter()
  table = rx.compare(loss_fn, *args)
  result = {'seconds': time.perf_counter() - start, 'rss_mib': peak_rss_mib(),
            'rows': len(table.rows)}
  start = time.perf_counter()
  found = rx.search_policy(loss_fn, *args, memory_budget=0.5)
  result.update(search_seconds=time.perf_counter() - start, search_rss_mib=peak_rss_mib(),
                search_compiles=found.compiles_used)
  start = time.perf_counter()
  viz.report_html(table, table.rows[0].report)
  result.update(report_seconds=time.perf_counter() - start, report_rss_mib=peak_rss_mib())
  return result


def _in_a_process(mode: str, model: str, layers: int, width: int, names=()) -> dict:
  with tempfile.NamedTemporaryFile(suffix='.json') as f:
    subprocess.run([sys.executable, __file__, '--run', mode, '--model', model,
                    '--layers', str(layers), '--width', str(width), '--json', f.name,
                    '--names', *names], check=True)
    return json.loads(Path(f.name).read_text())


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--layers', type=int, default=12)
  parser.add_argument('--width', type=int, default=256)
  parser.add_argument('--models', nargs='+', default=list(MODELS))
  parser.add_argument('--run', choices=('hand', 'compare'), help=argparse.SUPPRESS)
  parser.add_argument('--model', help=argparse.SUPPRESS)
  parser.add_argument('--json', help=argparse.SUPPRESS)
  parser.add_argument('--names', nargs='*', default=[], help=argparse.SUPPRESS)
  a = parser.parse_args()
  if a.run:  # one side, in a process of its own
    result = (by_hand(a.model, a.layers, a.width, a.names) if a.run == 'hand'
              else with_compare(a.model, a.layers, a.width))
    Path(a.json).write_text(json.dumps(result))
    return
  print(f'{a.layers} layers (blocks) of width {a.width}; each side in a '
        'process of its own (peak RSS is the process\'s)')
  for model in a.models:
    loss_fn, args = _problem(model, a.layers, a.width)
    names = rx.analyze(loss_fn, *args).names_in_program
    hand = _in_a_process('hand', model, a.layers, a.width, names)
    ours = _in_a_process('compare', model, a.layers, a.width)
    print(f'{model:9s} by hand: {hand["compiles"]} compiles in {hand["seconds"]:6.1f} s, '
          f'{hand["rss_mib"]:6.0f} MiB | compare: {ours["rows"]} rows in '
          f'{ours["seconds"]:6.1f} s, {ours["rss_mib"]:6.0f} MiB | ratios: time '
          f'{ours["seconds"] / hand["seconds"]:.2f}x, RSS {ours["rss_mib"] / hand["rss_mib"]:.2f}x\n'
          f'{"":9s} then search_policy(memory_budget=0.5): {ours["search_compiles"]} '
          f'compiles in {ours["search_seconds"]:.1f} s, RSS {ours["search_rss_mib"]:.0f} MiB '
          f'({ours["search_rss_mib"] / hand["rss_mib"]:.2f}x); the HTML report: '
          f'{ours["report_seconds"]:.1f} s, RSS {ours["report_rss_mib"]:.0f} MiB '
          f'({ours["report_rss_mib"] / hand["rss_mib"]:.2f}x)',
          flush=True)


if __name__ == '__main__':
  main()
