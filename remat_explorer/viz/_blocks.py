"""Reading a ``BlockReport``'s two jaxprs: which values cross the split.

``BlockReport`` carries the known and staged jaxprs but not the bookkeeping
of the ``Split`` they came from (``num_residuals``, which inputs are known,
which each half reads). This module recovers it from the jaxprs and the
block's residual list; where a future ``BlockReport`` carries
``num_residuals`` it is used as is.

The layout (``engine/split.py``): the known jaxpr's outputs are the block's
known outputs, then the residuals; the staged jaxpr's inputs are the same
residuals, then the block inputs it reads, in block order, known ones
(primals, saved as they are) before unknown ones (tangents).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from jax.extend.core import Literal, Var

from remat_explorer.analysis.report import BlockReport

# ``analyze`` describes known inputs that the backward pass reads this way;
# residuals computed by the known jaxpr never are ("from the argument ...").
_SAVED_INPUT = re.compile(r'^input .* of the block$', re.S)


@dataclass(frozen=True)
class BlockSplit:
  """The values crossing one block's split, as positions in its jaxprs."""
  num_residuals: int
  num_known_outputs: int
  saved_inputs: tuple[tuple[int | None, int], ...]
  """For each known input the backward pass reads: (index in the known
  jaxpr's invars or None where the forward pass does not read it, index in
  the staged jaxpr's invars)."""
  tangent_inputs: tuple[int, ...]
  """Indices of the staged jaxpr's invars that are (co)tangents."""
  recomputed: frozenset[int] = field(default_factory=frozenset)
  """Indices of staged equations that recompute forward values."""


def aval_bytes(aval) -> int:
  shape = getattr(aval, 'shape', ())
  dtype = getattr(aval, 'dtype', None)
  size = 1
  for d in shape:
    size *= int(d)
  return size * (dtype.itemsize if dtype is not None else 0)


def aval_text(atom) -> str:
  aval = atom.aval
  try:
    return aval.str_short(short_dtypes=True)
  except TypeError:  # abstract values other than arrays take no arguments
    return aval.str_short()


def _type_key(atom) -> tuple:
  aval = atom.aval
  return (tuple(getattr(aval, 'shape', ())), str(getattr(aval, 'dtype', aval)))


def block_split(block: BlockReport) -> BlockSplit:
  """Recover the split's bookkeeping from `block`'s jaxprs."""
  known, staged = block.known_jaxpr, block.staged_jaxpr
  saved = [r for r in block.residuals
           if r.kind == 'argument' and _SAVED_INPUT.match(r.description or '')]
  num_res = getattr(block, 'num_residuals', None)
  if num_res is None:
    num_res = _consistent_residual_count(
        known, staged, len(block.residuals) - len(saved))
  staged_inputs = list(range(num_res, len(staged.invars)))
  saved_staged = _match_in_order([(tuple(r.shape), r.dtype) for r in saved],
                                 staged_inputs, [_type_key(v) for v in staged.invars])
  saved_known = _match_in_order(
      [_type_key(staged.invars[i]) for i in saved_staged],
      list(range(len(known.invars))), [_type_key(v) for v in known.invars],
      allow_missing=True)
  tangents = tuple(i for i in staged_inputs if i not in set(saved_staged))
  recomputed = _recomputed(staged, tangents)
  if [staged.eqns[j].primitive.name for j in recomputed] != [
      e.primitive for e in block.recomputed]:
    # The recovered inputs disagree with ``analyze``; trust its list.
    recomputed = _match_recomputed(staged, block.recomputed)
  return BlockSplit(
      num_residuals=num_res, num_known_outputs=len(known.outvars) - num_res,
      saved_inputs=tuple(zip(saved_known, saved_staged)),
      tangent_inputs=tangents, recomputed=frozenset(recomputed))


def residual_vars(block: BlockReport) -> tuple[list, list]:
  """The residuals of `block` as variables of its known jaxpr (outputs, or
  inputs saved as they are) and of its staged jaxpr (inputs): for
  ``jaxpr_html(..., highlight_vars=...)``."""
  split = block_split(block)
  known, staged = block.known_jaxpr, block.staged_jaxpr
  num_res = split.num_residuals
  known_vars = [v for v in known.outvars[len(known.outvars) - num_res:]
                if isinstance(v, Var)]
  known_vars += [known.invars[k] for k, _ in split.saved_inputs if k is not None]
  staged_vars = list(staged.invars[:num_res])
  staged_vars += [staged.invars[s] for _, s in split.saved_inputs]
  return known_vars, staged_vars


def _consistent_residual_count(known, staged, guess: int) -> int:
  """`guess` if the residual avals line up there, else the nearest count
  that lines them up (residuals end the known outputs and start the staged
  inputs, so their types must agree position by position)."""
  limit = min(len(known.outvars), len(staged.invars))

  def lines_up(n):
    outs = known.outvars[len(known.outvars) - n:] if n else []
    return [aval_text(v) for v in outs] == [aval_text(v) for v in staged.invars[:n]]
  for n in sorted(range(limit + 1), key=lambda n: (abs(n - guess), -n)):
    if lines_up(n):
      return n
  return 0


def _match_in_order(wanted: list, candidates: list[int], types: list,
                    allow_missing: bool = False) -> list:
  """Match each wanted type, in order, to the next candidate of that type.

  Known inputs come in block order in both jaxprs, so an in-order match by
  type is exact unless two known inputs of the same type are read by one
  half and not the other; then the picture may attach an edge to the wrong
  one of them, which is all this is used for.
  """
  out, start = [], 0
  for want in wanted:
    hit = next((j for j in range(start, len(candidates))
                if types[candidates[j]] == want), None)
    if hit is None:
      if not allow_missing:
        hit = min(start, len(candidates) - 1)
      else:
        out.append(None)
        continue
    out.append(candidates[hit])
    start = hit + 1
  return out


def _match_recomputed(staged, listed) -> list[int]:
  """Staged equations matching `listed` (in program order) by primitive and
  output types."""
  out, j = [], 0
  for e in listed:
    while j < len(staged.eqns):
      eqn = staged.eqns[j]
      j += 1
      outputs = ', '.join(aval_text(v) for v in eqn.outvars)
      if eqn.primitive.name == e.primitive and outputs == e.outputs:
        out.append(j - 1)
        break
  return out


def _recomputed(staged, tangent_inputs) -> list[int]:
  """Staged equations reading no (co)tangent: the rule ``analyze`` uses."""
  depends = {staged.invars[i] for i in tangent_inputs}
  recomputed = []
  for j, eqn in enumerate(staged.eqns):
    if any(not isinstance(v, Literal) and v in depends for v in eqn.invars):
      depends.update(eqn.outvars)
    else:
      recomputed.append(j)
  return recomputed
