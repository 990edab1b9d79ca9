"""Where a block's residuals, saved inputs and tangents sit in the two
jaxprs of its split: how the forward (known) half and the backward (staged)
half connect."""

from __future__ import annotations

from dataclasses import dataclass, field

from remat_explorer.analysis.split.report import BlockReport


@dataclass(frozen=True)
class BlockSplit:
  """The values crossing one block's split, as positions in its jaxprs."""
  num_residuals: int
  num_known_outputs: int
  saved_inputs: tuple[tuple[int | None, int], ...]
  """For each known input the backward pass reads: (index in the known
  jaxpr's invars, or None where the forward pass does not read it; index in
  the staged jaxpr's invars)."""
  tangent_inputs: tuple[int, ...]
  """Indices of the staged jaxpr's invars that are (co)tangents."""
  recomputed: frozenset[int] = field(default_factory=frozenset)
  """Indices of staged equations that recompute forward values."""


def block_split(block: BlockReport) -> BlockSplit:
  """Where `block`'s residuals, saved inputs and tangents sit in its jaxprs.

  The layout (``engine/split.py``): the known jaxpr reads the known block
  inputs it uses, in block order, and its outputs are the block's known
  outputs, then the residuals; the staged jaxpr's inputs are the same
  residuals, then the block inputs it reads, in block order (known ones are
  primals saved as they are, unknown ones are (co)tangents)."""
  num_res = block.num_residuals
  saved, tangents = [], []
  known_position = staged_position = 0
  known_used = iter(block.known_inputs_used)
  for unknown, staged_reads in zip(block.in_unknowns, block.staged_inputs_used):
    in_known = False if unknown else next(known_used)
    if staged_reads:
      staged_index = num_res + staged_position
      staged_position += 1
      if unknown:
        tangents.append(staged_index)
      else:
        saved.append((known_position if in_known else None, staged_index))
    known_position += in_known
  return BlockSplit(
      num_residuals=num_res,
      num_known_outputs=len(block.known_jaxpr.outvars) - num_res,
      saved_inputs=tuple(saved), tangent_inputs=tuple(tangents),
      recomputed=frozenset(e.index for e in block.recomputed if e.index is not None))
