"""The plain data ``analyze`` returns: what a policy saves and recomputes.

Every object here is frozen data; ``to_dict()`` gives JSON-serializable
output (jaxprs as text). The viz layer renders these and nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Residual:
  """One value the forward pass keeps for the backward pass.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> report = rx.analyze(f, w, x, policy=rx.checkpoint_policies.dots_saveable)
    >>> residual = report.residuals[-1]
    >>> residual.type_string, residual.kind, residual.primitive, residual.bytes
    ('float32[16,16]', 'equation', 'dot_general', 1024)
  """
  index: int
  shape: tuple[int, ...]
  dtype: str
  bytes: int
  kind: str
  """'argument', 'equation', 'literal' or 'constant'."""
  description: str
  """As ``saved_residuals`` words it."""
  name: str | None = None
  """Its ``checkpoint_name``, if it is a named value (also when a ``scan``,
  ``while`` or ``cond`` carries it out of its body)."""
  primitive: str | None = None
  """The primitive that computed it (inside the body that carried it out)."""
  source: str | None = None
  """``file:line (function)`` of the user's code that computed it: the
  innermost frame outside JAX, Flax, Equinox, optax and this package."""
  argument: str | None = None
  block: str | None = None
  """The remat block whose forward pass saved it, when known."""
  memory_space: str = 'device'
  producer_flops: int | None = None
  """FLOPs of the equation that produced it: what recomputing it instead
  would cost at least. For a value a ``scan`` stacks, its producer's
  FLOPs in every iteration. None for arguments and for values a ``while``
  loop carries out (its trip count is not known)."""
  sharding: str | None = None
  """In a sharded program, how the SPMD partitioner shards it, e.g.
  ``P('data', None, 'model')`` or ``replicated``; None otherwise."""
  per_device_shape: tuple[int, ...] | None = None
  """The shard each device keeps (``sharding.shard_shape(shape)``)."""
  per_device_bytes: int | None = None
  """Bytes of that shard: what saving it costs each device."""
  site: Any = None
  """``source`` as data: an ``origins.CodeSite`` (file, line, function)."""
  module_path: str = ''
  """Where in the model it was computed: the module path Flax Linen or
  ``jax.named_scope`` recorded, or the one read from the parameters it
  derives from (``blocks/attention/query``); '' when nothing says."""
  carried_out_of: tuple[str, ...] = ()
  """The constructs that carried it out of a body, e.g. ``('scan×4',)``
  for a value a scan stacks over its 4 steps."""
  position: int | None = None
  """For a block's residual: its input position in the block's staged
  jaxpr (residuals first, then the block inputs it reads)."""
  provenance: tuple = dataclasses.field(default=(), repr=False, compare=False)
  """The user's frames (outermost first) of the equations that computed it
  (its producer, and what a ``checkpoint_name`` names): the stacks the
  compiled program records for its instructions end with one of these,
  which is how a buffer is known to hold it (``peak.py``)."""

  @property
  def type_string(self) -> str:
    return f"{self.dtype}[{','.join(map(str, self.shape))}]"

  @property
  def device_bytes(self) -> int:
    """Bytes it holds on one device: its shard's, or all of it unsharded."""
    return self.bytes if self.per_device_bytes is None else self.per_device_bytes


@dataclass(frozen=True)
class RecomputedEquation:
  """An equation the backward pass runs again instead of reading a residual."""
  primitive: str
  outputs: str
  """Output types, e.g. ``f32[256,512]``."""
  flops: int
  """Per run of the block; one inside a ``scan`` of the block counts every
  iteration."""
  source: str | None
  name: str | None = None
  index: int | None = None
  """Its position among the block's staged (backward) equations; None for
  one inside a call there (see ``inside``)."""
  inside: int | None = None
  """For an equation inside a call of the staged half (a nested block, or a
  ``jit``) that also reads (co)tangents: that call's position among the
  staged equations."""
  site: Any = None
  """``source`` as data (``origins.CodeSite``)."""
  module_path: str = ''


@dataclass(frozen=True)
class BlockReport:
  """One remat block: what its split saves and recomputes, per run and in all."""
  name: str
  function: str
  path: tuple[str, ...]
  trip_count: int | None
  """Runs per call (enclosing scan lengths multiplied); None in a while loop."""
  library: str
  policy: str
  lowering: str
  parent: str | None
  source: str | None
  """Where the user's code applied the checkpoint (its innermost frame)."""
  differentiated: bool
  """Whether differentiation split this block with its own policy (False
  for a block that no differentiated input reaches). A block nested in
  another is split twice: first as part of its parent, by the parent's
  policy, which decides what the forward pass keeps of it (the parent's
  report shows that, and counts the nested block's work that the parent's
  recompute runs); then, by its own policy, when the backward pass runs
  the parent's recompute. Its report is that second split (``split_pass``
  is ``'backward'``): its residuals are held from the parent's recompute to
  its own backward step, not from the forward pass, and its recompute runs
  on top of the parent's."""
  residuals: tuple[Residual, ...]
  residual_bytes: int
  """Per run of the block."""
  recomputed: tuple[RecomputedEquation, ...]
  recompute_flops: int
  """Per run of the block."""
  known_jaxpr: Any = dataclasses.field(default=None, repr=False, compare=False)
  staged_jaxpr: Any = dataclasses.field(default=None, repr=False, compare=False)
  # The split's bookkeeping, which says how the two jaxprs connect: the known
  # jaxpr's last `num_residuals` outputs are the staged jaxpr's first inputs;
  # then come the block inputs each half reads, in block order.
  in_unknowns: tuple[bool, ...] = ()
  """For each block input, whether it is a (co)tangent-carrying input."""
  num_residuals: int = 0
  known_inputs_used: tuple[bool, ...] = ()
  """For each known block input, whether the known jaxpr reads it."""
  staged_inputs_used: tuple[bool, ...] = ()
  """For each block input, whether the staged jaxpr reads it."""
  module_path: str = ''
  """The module path the block's body runs in (see ``Residual``)."""
  wrapper: str = ''
  """The name of the function JAX was handed, when it differs from
  ``function`` (a framework's wrapper)."""
  split_pass: str | None = None
  """Which pass took the split this report describes: ``'forward'`` (a block
  not nested in another: its residuals live from the forward pass to the
  backward pass), ``'backward'`` (a nested block, see ``differentiated``),
  or None when it was not split."""

  @property
  def residual_bytes_per_device(self) -> int:
    """Per run, on one device (``residual_bytes`` when unsharded)."""
    return sum(r.device_bytes for r in self.residuals)

  @property
  def total_residual_bytes(self) -> int | None:
    return None if self.trip_count is None else self.residual_bytes * self.trip_count

  @property
  def total_recompute_flops(self) -> int | None:
    return None if self.trip_count is None else self.recompute_flops * self.trip_count


@dataclass(frozen=True)
class NestingLevel:
  """The blocks at one depth of nesting (``RematReport.levels``)."""
  level: int
  """0 for blocks inside no other block."""
  blocks: int
  runs: int
  """Runs of those blocks per call of the program (trip counts applied)."""
  recompute_flops: int
  """FLOPs the backward pass spends recomputing for them, all runs."""
  residual_bytes: int
  """What their splits save, all runs (a nested block's is held while the
  backward pass runs through its parent, not from the forward pass)."""
  unknown_runs: bool = False
  """Some of them sit in a while loop, whose trip count is not static."""


@dataclass(frozen=True)
class EquationCost:
  """FLOPs of one top-level equation of the forward or backward jaxpr."""
  index: int
  primitive: str
  flops: int
  trip_count: int | None
  note: str


@dataclass(frozen=True)
class RematReport:
  """What remat does to one function under one policy, from its jaxprs.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> report = rx.analyze(f, w, x)
    >>> report.policy, len(report.blocks), report.residual_bytes
    ('nothing_saveable (default)', 1, 2048)
  """
  function: str
  policy: str
  lowering: str
  argnums: tuple[int, ...]
  residuals: tuple[Residual, ...]
  blocks: tuple[BlockReport, ...]
  forward_flops: int
  """FLOPs of the forward pass (the known jaxpr), scan trip counts applied."""
  backward_flops: int
  """FLOPs of the backward pass, recompute included."""
  recompute_flops: int
  """FLOPs the backward pass spends recomputing forward values."""
  forward_equations: tuple[EquationCost, ...]
  backward_equations: tuple[EquationCost, ...]
  unknown_trip_counts: bool
  """True if a while loop makes some FLOP count a lower bound."""
  warnings: tuple[str, ...]
  names_in_program: tuple[str, ...]
  """Every ``checkpoint_name`` found in the program."""
  forward_jaxpr: Any = dataclasses.field(repr=False, compare=False, default=None)
  backward_jaxpr: Any = dataclasses.field(repr=False, compare=False, default=None)
  num_devices: int = 1
  """Devices the program is partitioned over (1 unless it is sharded)."""
  mesh_shape: tuple[tuple[str, int], ...] | None = None
  """The device mesh's axes and sizes, e.g. ``(('data', 2), ('model', 4))``."""
  device_kind: str = ''
  """The kind of device the program is placed on (a target's TPU or GPU, or
  the default device)."""
  platform: str = ''
  notes: tuple[str, ...] = ()
  """What was done to the program before analysing it, in words (e.g. a
  function without a remat block checkpointed as a whole because a policy
  was given)."""
  has_aux: bool = False
  """Whether only the first output (the loss) was differentiated."""
  transcendentals: int = 0
  """Transcendental operations (exp, tanh, ...) of both passes, trip counts
  applied, counted as XLA's cost analysis counts them: apart from FLOPs,
  in which they count 0."""
  module_paths: Any = dataclasses.field(default=None, repr=False, compare=False)
  """The program's ``module_paths.ModulePaths``, for ``graph``."""
  argument_names: tuple[str, ...] = ()
  """The pytree path of each array argument (``params['blocks']['w1']``),
  in the order the compiled step takes them."""
  gradient_names: tuple[str, ...] = ()
  """The paths of the differentiated ones, in the order the compiled step
  returns their gradients (after its outputs)."""

  def levels(self) -> tuple['NestingLevel', ...]:
    """The blocks by how deeply they nest (0: not inside another block), for
    layouts of nested checkpoints such as ``checkpointed_scan``'s."""
    depth: dict[str, int] = {}
    for b in self.blocks:  # a parent comes before the blocks inside it
      depth[b.name] = 0 if b.parent is None else depth.get(b.parent, 0) + 1
    found: dict[int, list] = {}
    for b in self.blocks:
      found.setdefault(depth[b.name], []).append(b)
    return tuple(NestingLevel(
        level, len(blocks), sum(b.trip_count or 1 for b in blocks),
        sum(b.recompute_flops * (b.trip_count or 1) for b in blocks if b.differentiated),
        sum(b.residual_bytes * (b.trip_count or 1) for b in blocks if b.differentiated),
        any(b.trip_count is None for b in blocks))
        for level, blocks in sorted(found.items()))

  @property
  def residual_bytes(self) -> int:
    """Global bytes: every shard of every residual."""
    return sum(r.bytes for r in self.residuals)

  @property
  def residual_bytes_per_device(self) -> int:
    """Residual bytes one device holds (the global bytes when unsharded)."""
    return sum(r.device_bytes for r in self.residuals)

  @property
  def total_flops(self) -> int:
    return self.forward_flops + self.backward_flops

  @property
  def jaxpr_flops_per_device(self) -> float:
    """``total_flops / num_devices``: each device's share if the work splits
    evenly. Work the partitioner replicates makes the real share larger;
    ``CompiledCosts.xla_flops`` is XLA's count of one device's program."""
    return self.total_flops / self.num_devices

  def to_dict(self) -> dict:
    """JSON-serializable: numbers, strings, lists; jaxprs as text."""
    out = plain_data(dataclasses.replace(self, module_paths=None))
    del out['module_paths']
    out['residual_bytes'] = self.residual_bytes
    out['residual_bytes_per_device'] = self.residual_bytes_per_device
    out['total_flops'] = self.total_flops
    out['jaxpr_flops_per_device'] = self.jaxpr_flops_per_device
    for block, block_dict in zip(self.blocks, out['blocks']):
      block_dict['total_residual_bytes'] = block.total_residual_bytes
      block_dict['total_recompute_flops'] = block.total_recompute_flops
    return out


def aval_text(aval) -> str:
  """``f32[8,128]``: an abstract value as jaxprs print it."""
  try:
    return aval.str_short(short_dtypes=True)
  except TypeError:  # abstract values other than arrays take no arguments
    return aval.str_short()


def plain_data(value):
  """Dataclasses to dicts, tuples to lists, jaxprs to text, recursively."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
  if isinstance(value, (list, tuple)):
    return [plain_data(v) for v in value]
  if isinstance(value, dict):
    return {str(k): plain_data(v) for k, v in value.items()}
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  return str(value)
