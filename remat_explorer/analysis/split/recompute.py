"""What the backward pass runs again for a block: the equations of its
staged half that read no (co)tangent, looked for through calls, scans and
nested blocks, each with its FLOPs (times its trips), line and module path.
"""

from __future__ import annotations

from jax.extend import core

from remat_explorer.analysis.source.origins import call_body, user_site, user_site_within
from remat_explorer.analysis.split import flops as flop_count
from remat_explorer.analysis.split.report import RecomputedEquation
from remat_explorer.engine import checkpoint_p, name_of_named_value, scan_consts_and_carries


def recomputed_equations(split, in_unknowns, nested, paths):
  """Equations of the staged half that do not depend on (co)tangents: what
  the backward pass runs again for this block."""
  staged = split.staged
  used_unknowns = [u for u, used in zip(in_unknowns, split.staged_inputs_used) if used]
  unknown_inputs = staged.invars[split.num_residuals:]
  tangents = {v for v, u in zip(unknown_inputs, used_unknowns) if u}
  return (_recomputed(*found, paths) for found in
          _tangent_free_equations(staged, tangents, None, nested))


def _tangent_free_equations(jaxpr, tangents: set, inside: int | None, nested,
                            trips: int = 1, context=None):
  """The equations of `jaxpr` that read no (co)tangent, given the variables
  in `tangents` (which grows as the walk goes), each run `trips` times, as
  ``(equation, index, inside, trips, context)`` for ``_recomputed``;
  `context` is the innermost enclosing equation that has a line of the
  user's code (JAX records only a body's own frames inside it).

  A call or ``scan`` in the staged half that also reads tangents is looked
  into. For a ``jit`` or a ``scan``, the part of its body that reads no
  tangent is recomputed here (a scan's as many times as it runs). For a
  nested block (split with this one, by this block's policy), what runs
  here is the known half of the block's own split, taken when the backward
  pass reaches it: the work it needs for its outputs and for what its own
  policy saves. What that policy does not save it recomputes once more
  later, in its own backward step; its own report counts that, so nothing
  is counted twice. Only the outputs that depend on tangents make later
  equations tangent-dependent.
  """
  for index, eqn in enumerate(jaxpr.eqns):
    reads = [isinstance(v, core.Var) and v in tangents for v in eqn.invars]
    where = index if inside is None else inside
    if not any(reads):
      yield eqn, index if inside is None else None, inside, trips, context
      continue
    body, body_reads, length = _looked_into(eqn, reads, nested)
    if body is None:
      tangents.update(eqn.outvars)
      continue
    body_tangents = {v for v, read in zip(body.invars, body_reads) if read}
    here = eqn if user_site(eqn.source_info) is not None else context
    found = list(_tangent_free_equations(body, body_tangents, where, nested,
                                         trips * length, here))
    own_split = nested.of(body) if eqn.primitive is checkpoint_p else None
    if own_split is not None:
      found = [(e, None, where, trips, here) for e in own_split.known.eqns]
    yield from found
    tangents.update(o for o, b in zip(eqn.outvars, body.outvars)
                    if isinstance(b, core.Var) and b in body_tangents)


def _looked_into(eqn, reads, nested):
  """(body, which body inputs carry tangents, trip count) of a call or scan
  whose body's outputs are the equation's, in order; (None, None, 0) else."""
  if eqn.primitive.name == 'scan':
    return (*_scan_body_reads(eqn, reads, nested), eqn.params['length'])
  body = call_body(eqn, custom=False)
  return (None, None, 0) if body is None else (body, reads, 1)


def _scan_body_reads(eqn, reads, nested):
  """A scan's body and which of its inputs carry tangents: a carry does if
  it enters with one or any iteration gives it one (a fixed point)."""
  body = eqn.params['jaxpr'].jaxpr
  first, num_carry = scan_consts_and_carries(eqn.params)
  carry = slice(first, first + num_carry)
  while True:
    body_tangents = {v for v, read in zip(body.invars, reads) if read}
    for _ in _tangent_free_equations(body, body_tangents, None, nested):
      pass  # walked for the tangents it finds
    carry_out = [isinstance(o, core.Var) and o in body_tangents
                 for o in body.outvars[:num_carry]]
    updated = [*reads[:first], *map(max, reads[carry], carry_out),
               *reads[carry.stop:]]
    if updated == reads:
      return body, reads
    reads = updated


def _recomputed(eqn, index, inside, trips, context, paths) -> RecomputedEquation:
  site = user_site_within(eqn, () if context is None else (context,))
  return RecomputedEquation(
      primitive=eqn.primitive.name,
      outputs=', '.join(v.aval.str_short(short_dtypes=True) for v in eqn.outvars),
      flops=flop_count.eqn_flops(eqn) * trips,
      source=None if site is None else str(site),
      name=name_of_named_value(eqn), index=index, inside=inside,
      site=site, module_path=paths.of(eqn) or (paths.of(context) if context else ''))
