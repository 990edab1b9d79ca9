"""``analyze``: a function and a policy in, a ``RematReport`` out.

The steps, in order:

1. Trace the user's function to a jaxpr and find its remat blocks, ours or
   JAX's, setting the policy asked for (``program.find_blocks``). A function
   with no block is checkpointed as a whole.
2. Differentiate it symbolically (``jax.vjp`` under ``jax.make_jaxpr``) while
   recording every split the engine takes (``observe_splits``): the forward
   and backward jaxprs are the ones JAX would run, and each block's split is
   the very one differentiation used, not a second computation of it.
3. Describe: residuals and their origins (as ``saved_residuals`` words them),
   per block what is saved and recomputed, FLOPs of everything.
4. For a sharded program (arguments on a mesh, ``in_shardings``,
   ``shard_map``, ...): each residual's sharding and per-device shape, read
   from the forward pass as XLA's SPMD partitioner compiles it
   (``sharding.py``).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from remat_explorer.analysis import flops as flop_count
from remat_explorer.analysis import sharding
from remat_explorer.analysis.problem import Problem
from remat_explorer.analysis.program import (BlockSite, PolicyChoice, describe_policy,
                                             policy_label)
from remat_explorer.analysis.report import (
    BlockReport, EquationCost, RecomputedEquation, RematReport, Residual)
from remat_explorer.analysis.policy_info import policy_warnings
from remat_explorer.engine import _jax_internals as jx
from remat_explorer.engine.primitive import observe_splits
from remat_explorer.engine.residuals import ResidualOrigin, residual_origins

core = jx.core


def analyze(f, *args, policy: PolicyChoice = None, lowering: str | None = None,
            argnums: int | tuple[int, ...] = 0, **kwargs) -> RematReport:
  """What remat saves and recomputes when differentiating `f` at `args`.

  Args:
    f: the function; it may use our ``checkpoint``, ``jax.checkpoint``, or
      neither (then it is checkpointed as a whole).
    args, kwargs: example arguments (arrays or pytrees of arrays); only their
      shapes and dtypes matter, nothing is run.
    policy: replaces the policy of every remat block (a callable), or of the
      blocks named in a mapping ``{function name: policy}``; ``None`` keeps
      the program's own policies.
    lowering: replaces every block's lowering strategy, if given.
    argnums: which positional arguments are differentiated.

  Sharded programs (arguments placed with ``NamedSharding``, a function
  jitted with ``in_shardings``/``out_shardings``, ``with_sharding_constraint``
  under ``jax.set_mesh``, ``shard_map``) are analyzed as the SPMD partitioner
  runs them: each residual gets its ``sharding`` and per-device shape and
  bytes, and the report its device count and mesh. That costs one compile of
  the forward pass.

  Reports are cached by function, argument shapes and dtypes, policy,
  lowering and device: asking again is instant.
  """
  problem = Problem.make(f, args, kwargs, argnums)
  key = problem.cache_key(policy, lowering)
  if key is not None and key in _cache:
    return _cache[key]
  report = _analyze(problem, policy, lowering)
  if key is not None:
    _cache[key] = report
  return report


_cache: dict = {}


def _analyze(problem, policy, lowering) -> RematReport:
  program, blocks = problem.program_with_blocks(policy, lowering)
  run_program = core.jaxpr_as_fun(program)

  def forward(diff_leaves, other_leaves):
    primal = lambda *d: run_program(*problem.merge(d, other_leaves))
    return jax.vjp(primal, *diff_leaves)

  with observe_splits() as records:
    forward_jaxpr, (out_shapes, vjp_shapes) = jax.make_jaxpr(
        forward, return_shape=True)(problem.diff_leaves, problem.other_leaves)
  backward_jaxpr = _backward_jaxpr(vjp_shapes, out_shapes)

  num_outs = len(jax.tree_util.tree_leaves(out_shapes))
  fwd = forward_jaxpr.jaxpr
  residual_jaxpr = fwd.replace(outvars=fwd.outvars[num_outs:])
  arg_names = problem.diff_names + problem.other_names
  block_of_equation = _equation_to_block(records, blocks, fwd)
  origins = residual_origins(residual_jaxpr, arg_names)
  residuals = tuple(_residual(i, origin, block_of_equation, jaxpr=residual_jaxpr)
                    for i, origin in enumerate(origins))

  block_reports = _block_reports(blocks, records)
  placement = sharding.find_placement(problem.leaves, program)
  if placement is not None:
    residuals, block_reports, placement = _per_device(
        forward_jaxpr, num_outs, problem, residual_jaxpr, origins, residuals,
        block_reports, placement)
  recompute = sum(b.recompute_flops * (b.trip_count or 1)
                  for b in block_reports if b.differentiated)
  names = _names_in(program.jaxpr)
  return RematReport(
      function=problem.name,
      policy=policy_label(policy, blocks),
      lowering=lowering or ', '.join(sorted({b.lowering for b in blocks})),
      argnums=problem.argnums,
      residuals=residuals,
      blocks=block_reports,
      forward_flops=flop_count.jaxpr_flops(forward_jaxpr),
      backward_flops=flop_count.jaxpr_flops(backward_jaxpr),
      recompute_flops=recompute,
      forward_equations=_equation_costs(forward_jaxpr),
      backward_equations=_equation_costs(backward_jaxpr),
      unknown_trip_counts=(flop_count.has_unknown_trip_counts(forward_jaxpr)
                           or flop_count.has_unknown_trip_counts(backward_jaxpr)),
      warnings=tuple(policy_warnings([b.policy for b in blocks], names)),
      names_in_program=tuple(sorted(names)),
      forward_jaxpr=forward_jaxpr,
      backward_jaxpr=backward_jaxpr,
      num_devices=1 if placement is None else placement.num_devices,
      mesh_shape=None if placement is None else placement.mesh_shape,
  )


def _per_device(forward_jaxpr, num_outs, problem, residual_jaxpr, origins,
                residuals, block_reports, placement):
  """Residuals with their shardings, as the SPMD partitioner chose them for
  the forward pass compiled on the arguments as placed (``sharding.py``)."""
  outputs = sharding.compiled_output_shardings(
      forward_jaxpr, [*problem.diff_leaves, *problem.other_leaves])
  placement = sharding.Placement(
      max([placement.num_devices, *(len(s.device_set) for s in outputs)]),
      placement.mesh_shape)
  by_position = outputs[num_outs:]
  shardings = [None if k is None else by_position[k]
               for k in sharding.residual_positions(residual_jaxpr, origins)]
  residuals = tuple(map(sharding.with_sharding, residuals, shardings))
  block_reports = tuple(dataclasses.replace(
      b, residuals=sharding.block_residuals_with_shardings(
          b.residuals, b.path, residuals, shardings)) for b in block_reports)
  return residuals, block_reports, placement


# -- steps ---------------------------------------------------------------------

def _backward_jaxpr(vjp_shapes, out_shapes):
  vjp_tree = jax.tree_util.tree_structure(vjp_shapes)
  residual_shapes = jax.tree_util.tree_leaves(vjp_shapes)
  cotangents = jax.tree_util.tree_map(
      lambda s: jax.ShapeDtypeStruct(s.shape, _cotangent_dtype(s.dtype)), out_shapes)
  def backward(residuals, cts):
    return jax.tree_util.tree_unflatten(vjp_tree, residuals)(cts)
  return jax.make_jaxpr(backward)(residual_shapes, cotangents)


def _cotangent_dtype(dtype):
  return dtype if jax.numpy.issubdtype(dtype, jax.numpy.inexact) else jax.dtypes.float0


_LOOPS = ('scan', 'while')


def _residual(index, origin, block_of_equation=None, block=None, jaxpr=None) -> Residual:
  aval = origin.aval
  if block is None and block_of_equation and origin.equation_index is not None:
    block = block_of_equation(origin)
  producer_flops = None
  if jaxpr is not None and origin.equation_index is not None:
    producer = jaxpr.eqns[origin.equation_index]
    if producer.primitive.name not in _LOOPS:
      producer_flops = flop_count.eqn_flops(producer)
  space = getattr(aval, 'memory_space', None)
  return Residual(
      index=index, shape=tuple(aval.shape), dtype=str(aval.dtype),
      bytes=int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize,
      kind=origin.kind, description=origin.description, name=origin.name,
      primitive=origin.primitive, source=origin.source, argument=origin.argument,
      block=block, memory_space='host' if 'Host' in str(space) else 'device',
      producer_flops=producer_flops)


def _equation_to_block(records, blocks, forward_jaxpr):
  """Attribute forward-pass equations to blocks by their source traceback.

  The forward jaxpr's equations are the blocks' known halves replayed, and
  replaying keeps each equation's traceback object.
  """
  by_traceback = {}
  for site in blocks:
    for record in records:
      if record.block is site.body:
        for eqn in record.split.known.eqns:
          if eqn.source_info.traceback is not None:
            by_traceback.setdefault(id(eqn.source_info.traceback), site.name)

  def block_of(origin):
    eqn = forward_jaxpr.eqns[origin.equation_index]
    return by_traceback.get(id(eqn.source_info.traceback))
  return block_of


def _block_reports(blocks: list[BlockSite], records) -> tuple[BlockReport, ...]:
  last_record = {}
  for record in records:
    last_record[id(record.block)] = record
  names = {b.index: b.name for b in blocks}
  return tuple(_block_report(site, last_record.get(id(site.body)), names)
               for site in blocks)


def _block_report(site: BlockSite, record, names) -> BlockReport:
  common = dict(
      name=site.name, function=site.function, path=site.path,
      trip_count=site.trip_count, library=site.library,
      policy=describe_policy(site.policy), lowering=site.lowering,
      parent=names.get(site.parent), source=site.source)
  if record is None:
    return BlockReport(**common, differentiated=False, residuals=(),
                       residual_bytes=0, recomputed=(), recompute_flops=0)
  split = record.split
  known = split.known
  residual_part = known.replace(
      outvars=known.outvars[len(known.outvars) - split.num_residuals:])
  input_names = _block_input_names(record)
  known_names = [n for n, unknown in zip(input_names, record.in_unknowns) if not unknown]
  used_names = [n for n, used in zip(known_names, split.known_inputs_used) if used]
  origins = residual_origins(residual_part, used_names)
  # Known inputs the backward pass reads are saved too, as they are.
  origins += [
      ResidualOrigin(v.aval, 'argument', f'input {name or i} of the block',
                     var=v, argument=name or None, argument_index=i)
      for i, (v, name, unknown, used) in enumerate(zip(
          record.jaxpr.invars, input_names, record.in_unknowns,
          split.staged_inputs_used))
      if used and not unknown]
  residuals = tuple(_residual(i, o, block=site.name, jaxpr=residual_part)
                    for i, o in enumerate(origins))
  recomputed = tuple(_recomputed_equations(split, record.in_unknowns))
  return BlockReport(
      **common, differentiated=True, residuals=residuals,
      residual_bytes=sum(r.bytes for r in residuals), recomputed=recomputed,
      recompute_flops=sum(e.flops for e in recomputed),
      known_jaxpr=split.known, staged_jaxpr=split.staged,
      in_unknowns=tuple(record.in_unknowns), num_residuals=split.num_residuals,
      known_inputs_used=tuple(split.known_inputs_used),
      staged_inputs_used=tuple(split.staged_inputs_used))


def _block_input_names(record) -> list[str]:
  dbg = record.jaxpr.debug_info
  names = list(dbg.arg_names) if dbg and dbg.arg_names else []
  if len(names) != len(record.jaxpr.invars):
    names = [''] * len(record.jaxpr.invars)
  return names


def _recomputed_equations(split, in_unknowns):
  """Equations of the staged half that do not depend on (co)tangents."""
  staged = split.staged
  used_unknowns = [u for u, used in zip(in_unknowns, split.staged_inputs_used) if used]
  unknown_inputs = staged.invars[split.num_residuals:]
  depends_on_tangents = {v for v, u in zip(unknown_inputs, used_unknowns) if u}
  for index, eqn in enumerate(staged.eqns):
    if any(isinstance(v, core.Var) and v in depends_on_tangents for v in eqn.invars):
      depends_on_tangents.update(eqn.outvars)
      continue
    yield RecomputedEquation(
        primitive=eqn.primitive.name,
        outputs=', '.join(v.aval.str_short(short_dtypes=True) for v in eqn.outvars),
        flops=flop_count.eqn_flops(eqn),
        source=jx.source_info_util.summarize(eqn.source_info),
        name=jx.name_of_named_value(eqn), index=index)


def _equation_costs(closed) -> tuple[EquationCost, ...]:
  return tuple(EquationCost(e.index, e.primitive, e.flops, e.trip_count, e.note)
               for e in flop_count.flops_by_equation(closed))


def _names_in(jaxpr) -> set[str]:
  names = set()
  for eqn in jaxpr.eqns:
    name = jx.name_of_named_value(eqn)
    if name:
      names.add(name)
    for sub in core.jaxprs_in_params(eqn.params):
      names |= _names_in(sub)
  return names
