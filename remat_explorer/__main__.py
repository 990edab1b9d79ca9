"""Command line: ``python -m remat_explorer report [...]`` and ``share``.

``report`` writes a self-contained HTML report for an example model or for
a function of yours (``--fn module:function``, a function that returns
``(loss_fn, args)``), printing progress while it compiles; ``--target
v5e:16x16 --mesh data=64,model=4`` compiles it for an accelerator this
machine need not have. ``share
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


def _mesh_axes(text: str | None) -> dict[str, int] | None:
  """``'data=4,model=2'`` -> ``{'data': 4, 'model': 2}``."""
  if text is None:
    return None
  axes = {}
  for part in text.split(','):
    name, _, size = part.partition('=')
    if not name.strip().isidentifier() or not size.strip().isdigit() or int(size) < 1:
      raise SystemExit(f'--mesh expects axis=size pairs such as data=4,model=2, got {text!r}')
    axes[name.strip()] = int(size)
  return axes


def _target_problem(args, mesh):
  """The problem placed on `mesh` (a ``target_mesh``), its arguments
  abstract: the example transformer sharded over ('data', 'model'); an
  --fn whose function takes a ``mesh`` builds its own; any other
  program's arguments are replicated over the mesh."""
  import inspect
  from remat_explorer import examples, on_target
  if not args.fn and args.model in ('transformer', 'transformer_scan'):
    if set(mesh.axis_names) != set(examples.MESH_AXES):
      raise SystemExit(f'--model {args.model} on a target needs --mesh with the axes data and '
                       f'model (e.g. data={mesh.size},model=1), got {dict(mesh.shape)}')
    return examples.sharded_transformer(mesh, use_scan=args.model == 'transformer_scan')
  if args.fn:
    make = _function_of(args.fn)
    if 'mesh' in inspect.signature(make).parameters:
      return _checked(args.fn, make(mesh=mesh))
    loss_fn, fn_args = _checked(args.fn, make())
  else:
    loss_fn, fn_args = examples.build(args.model, abstract=True)
  return loss_fn, on_target(tuple(fn_args), mesh)


def _function_of(fn: str):
  module_name, _, attr = fn.partition(':')
  if not attr:
    raise SystemExit(f'--fn expects module:function, got {fn!r}')
  try:
    make = getattr(importlib.import_module(module_name), attr)
  except (ImportError, AttributeError) as e:
    raise SystemExit(f'cannot load {fn!r}: {e}') from e
  if not callable(make):
    raise SystemExit(f'--fn {fn!r} is a {type(make).__name__}, not a function '
                     'returning (loss_fn, args)')
  return make


def _checked(fn: str, made):
  if not (isinstance(made, (tuple, list)) and len(made) == 2 and callable(made[0])
          and isinstance(made[1], (tuple, list))):
    raise SystemExit(f'--fn {fn!r} must return (loss_fn, args): a function and a '
                     f'tuple of its arguments, but returned {_kind(made)}')
  return made[0], tuple(made[1])


def _load_problem(args):
  from remat_explorer import examples
  if args.target:
    from remat_explorer.analysis.targets import target_mesh
    try:
      mesh = target_mesh(args.target, _mesh_axes(args.mesh))
    except (ValueError, ModuleNotFoundError) as e:
      raise SystemExit(f'--target: {e}') from None
    print(f'compiling for {mesh.size} × {mesh.devices.flat[0].device_kind} '
          f'(mesh {dict(mesh.shape)}), from this machine', flush=True)
    return _target_problem(args, mesh)
  if args.mesh:
    raise SystemExit('--mesh needs --target: the devices it arranges')
  if args.fn:
    return _checked(args.fn, _function_of(args.fn)())
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
  parser.add_argument('--target', default=None,
                      help='compile for an accelerator this machine need not have: a TPU '
                           'topology (v5e:2x2, v5e:16x16, v5p:4x4x4) or a GPU and a count '
                           '(h100:8, h100:4x8 for 4 hosts of 8); arguments are abstract')
  parser.add_argument('--mesh', default=None,
                      help="the target's mesh axes, e.g. data=4,model=2 (default: data over "
                           'every device)')
  parser.add_argument('--out', default='report.html', type=Path)
  args = parser.parse_args(argv)

  from remat_explorer.analysis import analyze, builtin_policies, compare
  from remat_explorer.analysis.tradeoffs.rows import AS_WRITTEN, AS_WRITTEN_NO_REMAT
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
    extra = ' · lowering ' in label  # compiled besides a row: XLA merged its recompute
    print(f'{"  also" if extra else f"[{done}/{total}]"} compiled under {label} '
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
          '[--policy P] [--target T [--mesh data=4,model=2]] [--out report.html]\n'
          '       python -m remat_explorer share NOTEBOOK [--out COPY]', file=sys.stderr)
    return 2
  return COMMANDS[argv[0]](argv[1:])


if __name__ == '__main__':
  sys.exit(main())
