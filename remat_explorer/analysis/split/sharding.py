"""Sharded programs: what each residual costs per device.

A training step that does not fit on one device is one SPMD program that
XLA's partitioner splits over a device mesh: a ``jit`` whose arguments are
placed with ``NamedSharding``, a function jitted with ``in_shardings``, one
calling ``with_sharding_constraint`` inside ``jax.set_mesh``, or one using
``shard_map``. Every device then keeps its own shard of each residual, and
which dimensions are split is the partitioner's decision, not written
anywhere in the jaxpr (in JAX's default Auto sharding mode).

So we ask the partitioner. The forward half that ``analyze`` builds with
``jax.vjp`` (the outputs, then the residuals) is jitted on the arguments as
they are placed and lowered, and Shardy's propagation, the passes with
which XLA's compile begins, is run on it alone: it says how each residual
is sharded, in a fraction of a second where compiling that forward pass
for a pod took a quarter of the step's own compile. Where its answer is
not whole (another partitioner, a sub-axis), the forward pass is compiled
and ``compiled.output_shardings`` answers. Either is asked once per forward
program: policies whose forward passes lower alike share it. A residual's
per-device shape is ``sharding.shard_shape(shape)``.
The split itself stays the engine's (``engine/split.py``); this module only
reads where its results live.

Block residuals (what one run of a block saves) are matched to these program
residuals by type: a block residual is one of them, or, under ``scan``, a
slice of one stacked along the enclosing scans, and takes its sharding when
the stacking dimensions are not sharded. Where candidates disagree on the
per-device shape, none is given: a label is left out rather than guessed. Inside a
``shard_map`` body the block's values are per device already.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from typing import Iterable, Sequence

import jax
from jax.extend import core
from jax.sharding import NamedSharding, PartitionSpec

from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.context import note_compile
from remat_explorer.analysis.source.producers import is_scan_step
from remat_explorer.analysis.split.report import Residual
from remat_explorer.engine import propagated_result_shardings, rounded_residuals

SHARD_MAP_BODY = 'per device (shard_map body)'
"""The sharding text of a block residual inside a ``shard_map``: its shape
is already the per-device one."""


# -- residual shardings, from the partitioner ---------------------------------------

class ShardingsUnknown(Exception):
  """XLA refused the forward pass whose output shardings were asked for
  (it does not fit the target's memory, say): its message, one line."""


_ASKED = ResultCache(64)
"""The partitioner's answers by forward program (the SHA-256 of its lowered
text) and the shardings of its arguments: policies whose forward passes
lower alike (the program as written and ``nothing_saveable``, say) ask
once."""


def partitioner_output_shardings(closed: core.ClosedJaxpr, leaves: Sequence):
  """The shardings XLA gives the outputs of `closed` jitted at `leaves`
  (arrays, placed as they are, or ``ShapeDtypeStruct``s with their
  shardings): those of the partitioner's propagation
  (``propagated_shardings``) where it speaks for every output, else
  ``compiled.output_shardings``. Raises ``ShardingsUnknown`` where XLA
  refuses to compile it."""
  lowered = jax.jit(core.jaxpr_as_fun(closed)).lower(*leaves)
  # The text names the mesh's axes, not its devices: the arguments'
  # shardings do (two targets of one mesh shape lower alike).
  key = (hashlib.sha256(lowered.as_text().encode()).hexdigest(),
         tuple(getattr(leaf, 'sharding', None) for leaf in leaves))
  answer = _ASKED.get(key)
  if answer is None:
    answer = propagated_shardings(lowered, leaves, len(closed.out_avals))
    if answer is None:
      answer = _compiled_output_shardings(lowered)
    _ASKED.put(key, answer)
  if isinstance(answer, str):
    raise ShardingsUnknown(answer)
  return list(answer)


def _compiled_output_shardings(lowered) -> tuple | str:
  """``compiled.output_shardings`` of `lowered`, or XLA's refusal to compile
  it (its first line)."""
  note_compile()
  try:
    return tuple(lowered.compile().output_shardings)
  except jax.errors.JaxRuntimeError as e:
    return str(e).strip().splitlines()[0]


_SHARDY = re.compile(r'#sdy\.sharding<@(\w+), \[(.*)\]>')
_AXES = re.compile(r'\{((?:"\w+"(?:, )?)*)\}')


def propagated_shardings(lowered, leaves: Sequence, outputs: int) -> tuple | None:
  """The output shardings of `lowered` as Shardy's propagation decides
  them, the same passes XLA's compile runs first (a fraction of a second
  where the compile takes seconds to minutes on a pod): one
  ``NamedSharding`` per output (of `outputs`) over the arguments' mesh.
  None where that is not the whole answer: arguments on no mesh or on
  several, another partitioner, an output sharded over another mesh (the
  axes or their sizes differ) or by more than whole mesh axes (a sub-axis,
  an open dimension); the compile answers those."""
  shardings = [leaf.sharding for leaf in leaves if getattr(leaf, 'sharding', None) is not None]
  arg_meshes = {s.mesh for s in shardings if isinstance(s, NamedSharding)}
  if len(arg_meshes) != 1 or not all(isinstance(s, NamedSharding) for s in shardings):
    return None
  mesh, = arg_meshes
  propagated = propagated_result_shardings(lowered)
  if propagated is None or len(propagated[0]) != outputs:
    return None
  texts, meshes = propagated
  # The meshes the results name must be the arguments' (same axes, same sizes).
  axes = '[' + ', '.join(f'"{name}"={size}' for name, size in mesh.shape.items()) + ']'
  same = {name for name, text in meshes.items() if text.startswith(f'#sdy.mesh<{axes}')}
  answer = []
  for text in texts:
    spec = _spec_of(text, same)
    if spec is None:
      return None
    answer.append(NamedSharding(mesh, spec))
  return tuple(answer)


def _spec_of(text: str, meshes) -> PartitionSpec | None:
  """``#sdy.sharding<@mesh, [{"data"}, {}, {"model"}]>`` as
  ``P('data', None, 'model')``; '' (no sharding) as ``P()``; None for
  anything else, or a sharding over a mesh not among `meshes`."""
  if not text:
    return PartitionSpec()
  match = _SHARDY.fullmatch(text)
  if match is None or match.group(1) not in meshes:
    return None
  dims = re.split(r'(?<=\}), ', match.group(2)) if match.group(2) else []
  entries = []
  for dim in dims:
    axes = _AXES.fullmatch(dim)
    if axes is None:
      return None
    names = tuple(a.strip('"') for a in axes.group(1).split(', ') if a)
    entries.append(None if not names else names[0] if len(names) == 1 else names)
  return PartitionSpec(*entries)


def residual_positions(residual_jaxpr: core.Jaxpr, origins) -> list[int | None]:
  """For each residual origin, the position of its value among the outputs
  of `residual_jaxpr` (origins are grouped by kind and deduplicated, so not
  in output order; a rounded residual is named by the value it rounds)."""
  position = {}
  for k, v in enumerate(residual_jaxpr.outvars):
    if isinstance(v, core.Var):
      position.setdefault(v, k)
  for rounded, value in rounded_residuals(residual_jaxpr).items():
    if rounded in position:
      position.setdefault(value, position[rounded])
  literal_positions = iter(k for k, v in enumerate(residual_jaxpr.outvars)
                           if isinstance(v, core.Literal))
  return [next(literal_positions, None) if o.kind == 'literal'
          else position.get(o.var) for o in origins]


def with_sharding(residual: Residual, sharding) -> Residual:
  """`residual` with its sharding, per-device shape and bytes filled in."""
  if sharding is None:
    return residual
  local = tuple(int(d) for d in sharding.shard_shape(residual.shape))
  return _with_local(residual, sharding_text(sharding), local)


def sharding_text(sharding) -> str:
  """``P('data', None, 'model')``, ``replicated``, or the sharding's repr."""
  if sharding.is_fully_replicated:
    return 'replicated'
  if isinstance(sharding, NamedSharding):
    return _spec_text(tuple(sharding.spec))
  return str(sharding)


def _spec_text(entries: Iterable) -> str:
  entries = list(entries)
  while entries and entries[-1] is None:
    entries.pop()
  if not any(e is not None for e in entries):
    return 'replicated'
  return 'P(' + ', '.join(map(repr, entries)) + ')'


def _with_local(residual: Residual, text: str, local: tuple[int, ...]) -> Residual:
  itemsize = residual.bytes // max(math.prod(residual.shape), 1)
  return dataclasses.replace(residual, sharding=text, per_device_shape=local,
                             per_device_bytes=math.prod(local) * itemsize)


# -- block residuals -----------------------------------------------------------------

def block_residuals_with_shardings(residuals: Sequence[Residual], path: Sequence[str],
                                   program_residuals: Sequence[Residual],
                                   shardings: Sequence) -> tuple[Residual, ...]:
  """Sharding of each residual one run of a block saves, from the program's.

  In a ``shard_map`` body, shapes are per device already. Elsewhere a block
  residual is one of the program's residuals, or a slice of one stacked by
  enclosing scans: each program residual of the same dtype whose trailing
  dimensions are the block residual's shape, with the stacking dimensions
  unsharded, is a candidate, and the candidates must all agree.
  """
  if any(step == 'shard_map' for step in path):
    return tuple(_with_local(r, SHARD_MAP_BODY, r.shape) for r in residuals)
  scans = sum(map(is_scan_step, path))
  return tuple(_matched(r, program_residuals, shardings, {0, scans})
               for r in residuals)


def _matched(residual: Residual, program_residuals, shardings, depths) -> Residual:
  """`residual` with the sharding every candidate agrees on: a program
  residual of its dtype that is it (depth 0) or stacks it along the
  enclosing scans (a loop-invariant residual is hoisted out unstacked)."""
  found = set()
  for top, sharding in zip(program_residuals, shardings):
    if sharding is None or top.dtype != residual.dtype or not top.per_device_shape:
      continue
    depth = len(top.shape) - len(residual.shape)
    if depth not in depths or tuple(top.shape[depth:]) != tuple(residual.shape):
      continue
    if tuple(top.per_device_shape[:depth]) != tuple(top.shape[:depth]):
      continue  # the stacking dimensions are split: not one slice per device
    entries = tuple(sharding.spec)[depth:] if isinstance(sharding, NamedSharding) else None
    text = (_spec_text(entries) if entries is not None
            else 'replicated' if sharding.is_fully_replicated else str(sharding))
    found.add((text, tuple(top.per_device_shape[depth:])))
  if len(found) != 1:
    return residual
  (text, local), = found
  return _with_local(residual, text, local)
