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
they are placed, compiled (once per forward program: policies whose
forward passes lower alike share the answer), and
``compiled.output_shardings`` says how each residual is sharded; its
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
from typing import Iterable, Sequence

import jax
from jax.extend import core
from jax.sharding import NamedSharding

from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.context import note_compile
from remat_explorer.analysis.source.producers import is_scan_step
from remat_explorer.analysis.split.report import Residual
from remat_explorer.engine import rounded_residuals

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
lower alike (the program as written and ``nothing_saveable``, say) compile
it once."""


def compiled_output_shardings(closed: core.ClosedJaxpr, leaves: Sequence):
  """``compiled.output_shardings`` of `closed` jitted at `leaves` (arrays,
  placed as they are, or ``ShapeDtypeStruct``s with their shardings).
  Raises ``ShardingsUnknown`` where XLA refuses to compile it."""
  lowered = jax.jit(core.jaxpr_as_fun(closed)).lower(*leaves)
  # The text names the mesh's axes, not its devices: the arguments'
  # shardings do (two targets of one mesh shape lower alike).
  key = (hashlib.sha256(lowered.as_text().encode()).hexdigest(),
         tuple(getattr(leaf, 'sharding', None) for leaf in leaves))
  answer = _ASKED.get(key)
  if answer is None:
    note_compile()
    try:
      answer = tuple(lowered.compile().output_shardings)
    except jax.errors.JaxRuntimeError as e:
      answer = str(e).strip().splitlines()[0]  # XLA's refusal, kept as well
    _ASKED.put(key, answer)
  if isinstance(answer, str):
    raise ShardingsUnknown(answer)
  return list(answer)


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
