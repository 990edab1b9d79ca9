"""Command line: ``python -m remat_explorer report [...]`` and ``share``.

``report`` writes a self-contained HTML report for an example model or for
a function of yours (``--fn module:function``, a function that returns
``(loss_fn, args)``), printing progress while it compiles. ``share
NOTEBOOK`` makes a notebook saved without its widgets' state show its
Explorers' snapshots when reopened (``viz/widget/shared_notebook.py``).

The default model is the transformer whose layers are a ``scan``: XLA keeps
a recompute inside a loop body apart from the forward pass, so its
policies differ even on the CPU, where XLA merges the recompute of
unrolled layers back into the forward pass (``--lowering cond`` keeps it).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path


def _load_problem(args):
  from remat_explorer import examples
  if args.fn:
    module_name, _, attr = args.fn.partition(':')
    if not attr:
      raise SystemExit(f'--fn expects module:function, got {args.fn!r}')
    try:
      make = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
      raise SystemExit(f'cannot load {args.fn!r}: {e}') from e
    if not callable(make):
      raise SystemExit(f'--fn {args.fn!r} is a {type(make).__name__}, not a function '
                       'returning (loss_fn, args)')
    made = make()
    if not (isinstance(made, (tuple, list)) and len(made) == 2 and callable(made[0])
            and isinstance(made[1], (tuple, list))):
      raise SystemExit(f'--fn {args.fn!r} must return (loss_fn, args): a function and a '
                       f'tuple of its arguments, but returned {_kind(made)}')
    loss_fn, fn_args = made
    return loss_fn, tuple(fn_args)
  if args.model == 'transformer_scan':
    return examples.transformer(use_scan=True)
  return examples.build(args.model)


def _kind(value) -> str:
  if isinstance(value, (tuple, list)):
    return f'a {type(value).__name__} of {len(value)}: ({", ".join(type(v).__name__ for v in value)})'
  return f'a {type(value).__name__}'


def _check_writable(out: Path, example: str = 'report.html') -> str | None:
  """Why a file cannot be written to `out`, or None: said before anything
  compiles, not after."""
  if out.is_dir():
    return f'--out {str(out)!r} is a directory; name a file, e.g. {str(out / example)!r}'
  folder = out.parent if str(out.parent) else Path('.')
  if not folder.is_dir():
    return f'--out {str(out)!r}: the folder {str(folder)!r} does not exist'
  if not os.access(out if out.exists() else folder, os.W_OK):
    return f'--out {str(out)!r} cannot be written (no permission)'
  return None


def report_main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m remat_explorer report',
      description='Write a self-contained HTML report on a model\'s remat policies.')
  source = parser.add_mutually_exclusive_group()
  source.add_argument('--model', default='transformer_scan',
                      choices=['transformer_scan', 'transformer', 'mlp', 'convnet'],
                      help='an example model at its default size (transformer_scan: '
                           'its layers a scan; transformer: unrolled)')
  source.add_argument('--fn', help='module:function returning (loss_fn, args)')
  parser.add_argument(
      '--policy', default=None,
      help="the policy shown in detail: 'as written' (the program's own), "
           "'no remat', or any policy jax.checkpoint_policies builds, e.g. "
           "\"save_only_these_names('mlp_hidden', 'qkv')\"")
  from remat_explorer.analysis import LOWERINGS
  parser.add_argument('--lowering', choices=list(LOWERINGS), default=None,
                      help='how remat blocks are lowered (default: the library\'s); '
                           'cond keeps a recompute XLA would merge into the forward pass')
  parser.add_argument('--out', default='report.html', type=Path)
  args = parser.parse_args(argv)

  from remat_explorer.analysis import analyze, builtin_policies, compare
  from remat_explorer.analysis.tradeoffs.compare import AS_WRITTEN, AS_WRITTEN_NO_REMAT
  from remat_explorer.analysis.policies.policy_info import describe_policy
  from remat_explorer.analysis.policies.policy_text import parse_policy
  from remat_explorer.viz.html.html_report import report_html

  unwritable = _check_writable(args.out)
  if unwritable:
    print(unwritable, file=sys.stderr)
    return 2
  loss_fn, fn_args = _load_problem(args)
  start = time.perf_counter()
  first = analyze(loss_fn, *fn_args, lowering=args.lowering)
  policies = builtin_policies(first.names_in_program)
  shown = args.policy or AS_WRITTEN
  because = ('asked for with --policy' if args.policy else
             'the program as written; --policy shows another')
  if shown not in (AS_WRITTEN, AS_WRITTEN_NO_REMAT, 'no remat', *policies):
    try:  # said before anything compiles
      policy = parse_policy(shown)
    except ValueError as e:
      print(f'--policy: {e}', file=sys.stderr)
      return 2
    shown = describe_policy(policy)
    policies.setdefault(shown, policy)
  if shown == AS_WRITTEN and not first.blocks:
    shown = AS_WRITTEN_NO_REMAT

  def progress(done, total, label):
    print(f'[{done}/{total}] compiled under {label} '
          f'({time.perf_counter() - start:.1f} s)', flush=True)
  comparison = compare(loss_fn, *fn_args, policies=policies, lowering=args.lowering,
                       progress=progress)
  args.out.write_text(report_html(comparison, comparison.row(shown).report,
                                  shown_because=because), encoding='utf-8')
  print(f'wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB) in '
        f'{time.perf_counter() - start:.1f} s')
  return 0


def share_main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m remat_explorer share',
      description='Make a saved notebook show its Explorers\' snapshots when reopened: '
                  'drop the widget views whose state was not saved with it (JupyterLab '
                  'would say "model not found" for them).')
  parser.add_argument('notebook', type=Path)
  parser.add_argument('--out', type=Path, default=None,
                      help='where to write the shared copy (default: in place)')
  args = parser.parse_args(argv)
  from remat_explorer.viz.widget.shared_notebook import share_notebook
  if not args.notebook.is_file():
    print(f'{str(args.notebook)!r} is not a file', file=sys.stderr)
    return 2
  if args.out is not None:
    unwritable = _check_writable(args.out, args.notebook.name)
    if unwritable:
      print(unwritable, file=sys.stderr)
      return 2
  try:
    done = share_notebook(args.notebook, args.out)
  except ValueError as e:
    print(e, file=sys.stderr)
    return 2
  out = args.out or args.notebook
  print(f'{out}: {done.dropped} widget view(s) without saved state dropped, their '
        f'static output shown instead ({done.bare} of them text only); '
        f'{done.kept} kept (their state is saved)')
  return 0


COMMANDS = {'report': report_main, 'share': share_main}


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] not in COMMANDS:
    print('usage: python -m remat_explorer report [--model M | --fn module:function] '
          '[--policy P] [--out report.html]\n'
          '       python -m remat_explorer share NOTEBOOK [--out COPY]', file=sys.stderr)
    return 2
  return COMMANDS[argv[0]](argv[1:])


if __name__ == '__main__':
  sys.exit(main())
