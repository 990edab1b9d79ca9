"""``analyze``: a function and a policy in, a ``RematReport`` out.

The steps, in order:

1. Trace the user's function to a jaxpr and find its remat blocks, ours or
   JAX's, setting the policy asked for (``program.find_blocks``). A function
   with no block is checkpointed as a whole.
2. Differentiate it symbolically (``jax.vjp`` under ``jax.make_jaxpr``) while
   recording every split the engine takes (``observe_splits``): the forward
   and backward jaxprs are the ones JAX would run, and each block's split is
   the very one differentiation used, not a second computation of it. A
   block nested in another takes its own split while the backward pass is
   traced (when its parent's recompute runs), so both passes are observed.
3. Describe: residuals and their origins (as ``saved_residuals`` words them),
   per block what is saved and recomputed, FLOPs of everything.
4. For a sharded program (arguments on a mesh, ``in_shardings``,
   ``shard_map``, ...): each residual's sharding and per-device shape, read
   from the forward pass as XLA's SPMD partitioner compiles it
   (``sharding.py``).
"""

from __future__ import annotations

import dataclasses
import os

import jax
from jax.extend import core

from remat_explorer.analysis.split import flops as flop_count
from remat_explorer.analysis.program import devices
from remat_explorer.analysis.split import sharding
from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.program.keywords import check_keywords, entry_point
from remat_explorer.analysis.source.module_paths import ModulePaths, module_of_parameter
from remat_explorer.analysis.source.origins import clean_scope, user_frames, user_frames_within
from remat_explorer.analysis.source.producers import step_trips, trace_producer
from remat_explorer.analysis.program.problem import Problem
from remat_explorer.analysis.program.blocks import (BlockSite, PolicyChoice, built_policy_choice,
                                             describe_policy,
                                             policy_label)
from remat_explorer.analysis.split.recompute import recomputed_equations
from remat_explorer.analysis.split.report import BlockReport, EquationCost, RematReport, Residual
from remat_explorer.analysis.units import aval_bytes
from remat_explorer.analysis.policies.policy_info import policy_warnings
from remat_explorer.engine import (ResidualOrigin, name_of_named_value, observe_splits,
                                   residual_origins, rounded_residuals)


@entry_point
def analyze(f, *args, policy: PolicyChoice = None, lowering: str | None = None,
            argnums: int | tuple[int, ...] = 0, has_aux: bool = False,
            whole_function: bool = False, **kwargs) -> RematReport:
  """What remat saves and recomputes when differentiating `f` at `args`.

  Args:
    f: the function; it may use our ``checkpoint``, ``jax.checkpoint`` (Flax's
      ``nn.remat``, Equinox's ``filter_checkpoint``), or neither. It is
      analysed as written: a function without a remat block gives the
      figures without remat, unless `policy` or `whole_function` asks for
      it to be checkpointed as a whole (the report's ``notes`` say so).
    *args: example arguments (and ``**kwargs``); only the shapes and dtypes of arrays
      matter, nothing is run. Leaves that are not arrays (Python numbers,
      flags, functions in an Equinox module) are held as they are, as
      ``eqx.filter_jit`` holds them.
    policy: replaces the policy of every remat block (a callable), or of the
      blocks named in a mapping ``{block name: policy}``; ``None`` keeps
      the program's own policies ("as written").
    lowering: replaces every block's lowering strategy, if given.
    argnums: which positional arguments are differentiated.
    has_aux: `f` returns ``(loss, aux)``; only the loss is differentiated,
      as with ``jax.value_and_grad(f, has_aux=True)``.
    whole_function: checkpoint `f` as one block when it has none.

  A function that differentiates itself (a training step calling
  ``jax.grad``) is refused, naming the loss to pass instead.

  Sharded programs (arguments placed with ``NamedSharding``, a function
  jitted with ``in_shardings``/``out_shardings``, ``with_sharding_constraint``
  under ``jax.set_mesh``, ``shard_map``) are analyzed as the SPMD partitioner
  runs them: each residual gets its ``sharding`` and per-device shape and
  bytes, and the report its device count and mesh. That costs one compile of
  the forward pass.

  Reports are cached (``clear_caches()`` forgets them), keyed on everything
  that changes them, the enclosing ``lowering_strategy`` included.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> def loss(w, x):
    ...   layer = rx.checkpoint(lambda h: jnp.tanh(h @ w))
    ...   return jnp.sum(layer(layer(x)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> report = rx.analyze(loss, w, x, policy=rx.checkpoint_policies.dots_saveable)
    >>> [r.argument or r.primitive for r in report.residuals]
    ['w', 'x', 'dot_general', 'tanh', 'dot_general']
  """
  check_keywords(analyze, f, kwargs, policy=policy, lowering=lowering, argnums=argnums,
                 has_aux=has_aux, whole_function=whole_function)
  policy = built_policy_choice(policy)
  problem = Problem.make(f, args, kwargs, argnums, has_aux=has_aux,
                         whole_function=whole_function)
  key = problem.cache_key(policy, lowering)
  report = _cache.get(key)
  if report is None:
    report = _analyze(problem, policy, lowering)
    _cache.put(key, report)
  return report


_cache = ResultCache(max_entries=64)


def _analyze(problem, policy, lowering) -> RematReport:
  program, blocks, notes = problem.program_with_blocks(policy, lowering)
  run_program = problem.program_function(program, blocks)
  num_outputs = problem.num_outputs

  def forward(diff_leaves, other_leaves):
    def primal(*d):
      outs = run_program(*problem.merge(d, other_leaves))
      return outs[:num_outputs], outs[num_outputs:]
    outs, vjp_fn, aux = jax.vjp(primal, *diff_leaves, has_aux=True)
    return (outs, aux), vjp_fn

  with observe_splits() as records:
    forward_jaxpr, ((out_shapes, _), vjp_shapes) = jax.make_jaxpr(
        forward, return_shape=True)(problem.diff_leaves, problem.other_leaves)
    num_forward_splits = len(records)
    # A block nested in another takes its own split only here, when the
    # backward pass runs its parent's recompute.
    backward_jaxpr = _backward_jaxpr(vjp_shapes, out_shapes)

  num_outs = len(program.jaxpr.outvars)  # the outputs, aux included
  fwd = forward_jaxpr.jaxpr
  residual_jaxpr = fwd.replace(outvars=fwd.outvars[num_outs:])
  arg_names = problem.diff_names + problem.other_names
  paths = ModulePaths(program.jaxpr, problem.arg_names)
  block_of_equation = _equation_to_block(records[:num_forward_splits], blocks)
  origins = residual_origins(residual_jaxpr, arg_names)
  residuals = tuple(_residual(i, origin, paths, block_of_equation, jaxpr=residual_jaxpr)
                    for i, origin in enumerate(origins))

  block_reports = _block_reports(blocks, records, num_forward_splits, paths)
  placement = devices.find_placement(problem.leaves, program)
  unsharded = None
  if placement is not None:
    try:
      residuals, block_reports, placement = _per_device(
          forward_jaxpr, num_outs, problem, residual_jaxpr, origins, residuals,
          block_reports, placement)
    except sharding.ShardingsUnknown as e:  # the step itself will fail alike
      unsharded = ('each residual\'s sharding is unknown: XLA refused to compile the '
                   f'forward pass that would tell it ({e})')
  recompute = sum(b.recompute_flops * (b.trip_count or 1)
                  for b in block_reports if b.differentiated)
  names = _names_in(program.jaxpr)
  warnings = policy_warnings([b.policy for b in blocks], names)
  if unsharded:
    warnings.append(unsharded)
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
      warnings=tuple(warnings),
      names_in_program=tuple(sorted(names)),
      forward_jaxpr=forward_jaxpr,
      backward_jaxpr=backward_jaxpr,
      num_devices=devices.device_count(placement),
      mesh_shape=None if placement is None else placement.mesh_shape,
      device_kind=devices.target_device(placement).device_kind,
      platform=devices.target_device(placement).platform,
      notes=tuple(notes),
      has_aux=problem.has_aux,
      transcendentals=(flop_count.jaxpr_transcendentals(forward_jaxpr)
                       + flop_count.jaxpr_transcendentals(backward_jaxpr)),
      module_paths=paths,
      argument_names=tuple(problem.arg_names),
      gradient_names=tuple(problem.diff_names),
  )


def _per_device(forward_jaxpr, num_outs, problem, residual_jaxpr, origins,
                residuals, block_reports, placement):
  """Residuals with their shardings, as the SPMD partitioner places them for
  the forward pass on the arguments as placed (``sharding.py``). On one
  device every value is whole there: nothing to ask."""
  if placement.num_devices == 1 and placement.device is not None:
    outputs = [jax.sharding.SingleDeviceSharding(placement.device)] * len(
        forward_jaxpr.jaxpr.outvars)
  else:
    outputs = sharding.partitioner_output_shardings(
        forward_jaxpr, [*problem.diff_leaves, *problem.other_leaves])
  placement = devices.Placement(
      max([placement.num_devices, *(len(s.device_set) for s in outputs)]),
      placement.mesh_shape, placement.device)
  by_position = outputs[num_outs:]
  shardings = [None if k is None else by_position[k]
               for k in sharding.residual_positions(residual_jaxpr, origins)]
  residuals = tuple(map(sharding.with_sharding, residuals, shardings))
  # A nested block's own residuals are kept within the backward pass, not
  # from the forward pass: none of the forward pass's outputs tells their
  # sharding, so they are left without one.
  block_reports = tuple(b if b.split_pass != 'forward' else dataclasses.replace(
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


def _residual(index, origin, paths, block_of_equation=None, block=None,
              jaxpr=None) -> Residual:
  """One residual, with where it comes from in the user's terms: for a
  value a scan (or while, cond, call) carries out of its body, the
  equation inside that computed it."""
  aval = origin.aval
  producer = None
  if jaxpr is not None and origin.kind == 'equation':
    producer = trace_producer(jaxpr, origin.var)
  if block is None and block_of_equation and producer is not None:
    # A value carried out of a body (a scan in the block) is the block's
    # when the equation holding that body is.
    for eqn in (producer.eqn, *reversed(producer.enclosing)):
      block = block_of_equation(eqn)
      if block is not None:
        break
  producer_flops = None
  if jaxpr is not None and origin.equation_index is not None:
    top = jaxpr.eqns[origin.equation_index]
    if top.primitive.name not in _LOOPS:
      producer_flops = flop_count.eqn_flops(top)
    elif producer is not None:
      producer_flops = _stacked_producer_flops(producer)
  site, module_path, name, primitive, carried = None, '', origin.name, origin.primitive, ()
  provenance = ()
  if producer is not None:
    site = producer.site()
    # The frames JAX recorded for each computing equation, which XLA keeps
    # on its instruction; and, where a cached body recorded only a
    # library's, the call's frames down to it.
    provenance = tuple(dict.fromkeys(
        frames for e in producer.computing_eqns()
        for frames in (user_frames(e.source_info.traceback),
                       user_frames_within(e, producer.enclosing))))
    module_path = producer.module_path(paths)
    name = name or name_of_named_value(producer.eqn)
    # Inside a body, the primitive that computed it says more than `scan`;
    # at the top, the one that produced the saved copy (a device_put for an
    # offloaded value) is what was saved.
    primitive = producer.eqn.primitive.name if producer.enclosing else primitive
    carried = producer.carried_out_of
  elif origin.kind == 'argument':
    module_path = module_of_parameter(origin.argument or '')
  space = getattr(aval, 'memory_space', None)
  return Residual(
      index=index, shape=tuple(aval.shape), dtype=str(aval.dtype),
      bytes=aval_bytes(aval),
      kind=origin.kind, description=origin.description, name=name,
      primitive=primitive, source=None if site is None else str(site),
      argument=origin.argument,
      block=block, memory_space='host' if 'Host' in str(space) else 'device',
      producer_flops=producer_flops, site=site, module_path=module_path,
      carried_out_of=carried, provenance=provenance)


def _stacked_producer_flops(producer) -> int | None:
  """What dropping a value a loop stacks would cost at least: its
  producer's FLOPs at every trip (None where a trip count is unknown)."""
  trips = 1
  for step in producer.carried_out_of:
    if step_trips(step) is None:
      return None
    trips *= step_trips(step)
  return trips * sum(flop_count.eqn_flops(e) for e in producer.computing_eqns())


def _equation_to_block(records, blocks):
  """Attribute forward-pass equations to blocks by their source traceback.

  The forward jaxpr's equations are the blocks' known halves replayed, and
  replaying keeps each equation's traceback.
  """
  by_traceback = {}
  for site in blocks:
    for record in records:
      if record.block is site.body:
        for eqn in record.split.known.eqns:
          if eqn.source_info.traceback is not None:
            by_traceback.setdefault(eqn.source_info.traceback, site.name)

  def block_of(eqn):
    return by_traceback.get(eqn.source_info.traceback)
  return block_of


def _block_reports(blocks: list[BlockSite], records,
                   num_forward_splits, paths) -> tuple[BlockReport, ...]:
  last = {}
  for position, record in enumerate(records):
    last[id(record.block)] = (record, position < num_forward_splits)
  nested = _NestedSplits(records[num_forward_splits:])
  names = {b.index: b.name for b in blocks}
  return tuple(_block_report(site, *last.get(id(site.body), (None, None)), names,
                             nested, paths)
               for site in blocks)


class _NestedSplits:
  """The backward pass's splits of nested blocks, found from the call that
  their parent's split left in its staged half (the records' lineage holds
  that call's body)."""

  def __init__(self, backward_records):
    self._by_body = {}
    for record in backward_records:
      for jaxpr in record.lineage[:-1]:
        self._by_body.setdefault(id(jaxpr), record)
    self._records = backward_records  # keeps the ids above alive

  def of(self, body):
    record = self._by_body.get(id(body))
    return None if record is None else record.split


def _block_report(site: BlockSite, record, on_forward_pass, names,
                  nested: _NestedSplits, paths) -> BlockReport:
  common = dict(
      name=site.name, function=site.function, path=site.path,
      trip_count=site.trip_count, library=site.library,
      policy=describe_policy(site.policy), lowering=site.lowering,
      parent=names.get(site.parent), source=site.source,
      module_path=_common_module_path(site.body, paths),
      wrapper='' if site.wrapper == site.function else site.wrapper)
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
  positions = _residual_positions(residual_part, split, record)
  residuals = tuple(dataclasses.replace(
      _residual(i, o, paths, block=site.name, jaxpr=residual_part),
      position=positions.get(id(o.var)))
      for i, o in enumerate(origins))
  recomputed = tuple(recomputed_equations(split, record.in_unknowns, nested, paths))
  return BlockReport(
      **common, differentiated=True, residuals=residuals,
      residual_bytes=sum(r.bytes for r in residuals), recomputed=recomputed,
      recompute_flops=sum(e.flops for e in recomputed),
      known_jaxpr=split.known, staged_jaxpr=split.staged,
      in_unknowns=tuple(record.in_unknowns), num_residuals=split.num_residuals,
      known_inputs_used=tuple(split.known_inputs_used),
      staged_inputs_used=tuple(split.staged_inputs_used),
      split_pass='forward' if on_forward_pass else 'backward')


def _residual_positions(residual_part, split, record) -> dict[int, int]:
  """id of each residual's origin variable -> its input position in the
  staged jaxpr: the residual outputs in order (a rounded one by the value
  it rounds), then the block inputs the staged jaxpr reads."""
  rounded_from = {id(rounded): value
                  for rounded, value in rounded_residuals(residual_part).items()}
  positions = {}
  for k, out in enumerate(residual_part.outvars):
    positions.setdefault(id(out), k)
    if id(out) in rounded_from:
      positions.setdefault(id(rounded_from[id(out)]), k)
  staged_reads = [v for v, used in zip(record.jaxpr.invars, split.staged_inputs_used) if used]
  for k, v in enumerate(staged_reads):
    positions.setdefault(id(v), split.num_residuals + k)
  return positions


def _block_input_names(record) -> list[str]:
  dbg = record.jaxpr.debug_info
  names = list(dbg.arg_names) if dbg and dbg.arg_names else []
  if len(names) != len(record.jaxpr.invars):
    names = [''] * len(record.jaxpr.invars)
  return names


def _common_module_path(body, paths) -> str:
  """The module path a block's equations share: from the parameters they
  read, else from their name stacks (Linen's modules, as a residual's
  ``module_path`` falls back to them)."""
  if own := paths.of_body(body):
    return own
  found = {p for eqn in body.eqns if (p := paths.of(eqn))}
  if not found:
    found = {p for eqn in body.eqns
             if (p := paths.of_scope(clean_scope(eqn.source_info.name_stack)))}
  if not found:  # a body that only runs a loop: the loop's body says
    return next((path for eqn in body.eqns for sub in core.jaxprs_in_params(eqn.params)
                 if (path := _common_module_path(sub, paths))), '')
  return '/'.join(os.path.commonprefix([p.split('/') for p in found]))


def _equation_costs(closed) -> tuple[EquationCost, ...]:
  return tuple(EquationCost(e.index, e.primitive, e.flops, e.trip_count, e.note)
               for e in flop_count.flops_by_equation(closed))


def _names_in(jaxpr) -> set[str]:
  names = set()
  for eqn in jaxpr.eqns:
    name = name_of_named_value(eqn)
    if name:
      names.add(name)
    for sub in core.jaxprs_in_params(eqn.params):
      names |= _names_in(sub)
  return names
