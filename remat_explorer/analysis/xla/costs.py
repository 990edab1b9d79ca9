"""``CompiledCosts``: XLA's own figures for one compiled training step, as
plain data (``compiled.py`` makes them, the views and the comparison read
them). Every number comes from the compiled executable or from running it.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field

from remat_explorer.analysis.errors import first_line
from remat_explorer.analysis.xla.collectives import Collective
from remat_explorer.analysis.xla.collectives import count as count_collectives
from remat_explorer.analysis.xla.timeline import MemoryTimeline


_MEMORY_REFUSALS = ('RESOURCE_EXHAUSTED', 'Ran out of memory')
"""What XLA's message on a step refused for the device's memory holds."""


@dataclass(frozen=True)
class CompiledCosts:
  """XLA's own figures for one compiled training step (outputs and
  gradients). Sizes in bytes.

  For a program partitioned over several devices, every memory figure and
  ``xla_flops`` are per device: XLA's ``memory_analysis`` and
  ``cost_analysis`` describe the partitioned executable, which is what each
  device runs. ``num_devices`` and ``mesh_shape`` say over what.

  Example:
    For 8 H100s, compiled without them (``target_mesh``):

    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = rx.target_mesh('h100:8')
    >>> x = jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=NamedSharding(mesh, P('data')))
    >>> costs = rx.compile_costs(rx.checkpoint(lambda x: jnp.sum(jnp.tanh(jnp.tanh(x)))), x)
    >>> costs.device_kind, costs.num_devices, costs.fits
    ('NVIDIA H100 80GB HBM3', 8, True)
  """
  function: str
  policy: str
  lowering: str
  platform: str
  device_kind: str
  device_memory_bytes: int | None = None
  """The memory of one device: a live GPU's or TPU's allocator limit, a GPU
  target's ``device_memory_size``, a TPU chip's HBM (per device); None on
  the CPU. ``peak_bytes`` is measured against it (``memory_share``)."""
  failed: bool = False
  error: str | None = None
  """XLA's message when the compile failed."""
  argument_bytes: int | None = None
  output_bytes: int | None = None
  alias_bytes: int | None = None
  temp_bytes: int | None = None
  generated_code_bytes: int | None = None
  peak_memory_bytes: int | None = None
  """``memory_analysis().peak_memory_in_bytes``. On the CPU it counts only
  arguments and outputs; on GPUs temporaries too."""
  host_argument_bytes: int | None = None
  host_output_bytes: int | None = None
  host_alias_bytes: int | None = None
  host_temp_bytes: int | None = None
  host_generated_code_bytes: int | None = None
  memory_analysis: dict[str, int] = field(default_factory=dict, repr=False,
                                         compare=False)
  """Every number ``memory_analysis()`` returns, by its own name (the fields
  above among them, and any a later XLA adds)."""
  buffer_assignment_proto: bytes | None = field(default=None, repr=False,
                                                compare=False)
  """``memory_analysis().serialized_buffer_assignment_proto``: XLA's buffer
  assignment, serialized (base64 in ``to_dict``)."""
  xla_flops: float | None = None
  """``cost_analysis()['flops']`` of the partitioned module: one device's
  FLOPs. XLA counts a while-loop body once."""
  executed_flops: float | None = None
  """The FLOPs the compiled program executes on one device: XLA's count of
  each computation, each loop's body once per trip (``executed_flops.py``).
  Equal to ``xla_flops`` for a program without loops. A conditional counts
  at its costliest branch, as XLA counts it, unless the engine knows which
  branch runs (a recompute's guard; the binomial loop's turns). What the
  Pareto front, the recommendation and the search rank by."""
  executed_flops_low: float | None = None
  """The same with every conditional at its cheapest branch: the program
  executes between this and ``executed_flops`` (equal without conditionals
  whose branches differ)."""
  loops_of_unknown_trip_count: int = 0
  """Loops XLA could not count trips of: in ``executed_flops`` once each."""
  bytes_accessed: float | None = None
  transcendentals: float | None = None
  cost_analysis: dict[str, float] = field(default_factory=dict, repr=False,
                                          compare=False)
  """Everything ``cost_analysis()`` returns, by XLA's keys: besides the
  three above, e.g. ``'bytes accessed0{}'`` (bytes read from operand 0),
  ``'bytes accessedout{}'``, ``'utilization0{}'``, ``'optimal_seconds'``,
  as the backend reports them."""
  analysis_compile: bool = False
  """True when the figures come from an analysis compile (XLA's HLO passes,
  buffer assignment and schedule as usual; on the CPU, backend code
  generation at its lowest optimization level, see
  ``analysis_compiler_options``; on a compile-only GPU, the kernels compiled
  before reused, see ``kernel_cache.py``): every figure equals a full
  compile's, in less time. Run times always come from a full compile."""
  lower_seconds: float | None = None
  """Lowering the traced step to StableHLO (and tracing it, where the step
  was not traced already: ``compile_costs`` shares one trace of each step
  with ``estimate_costs``)."""
  compile_seconds: float | None = None
  run_seconds: float | None = None
  """Median over `repeats` runs after a warm-up; None when not run."""
  measured_peak_bytes: int | None = None
  """The device's ``memory_stats()['peak_bytes_in_use']`` after running,
  where the device reports it (GPUs; not the CPU) and these runs set it:
  JAX cannot reset a device's peak, so after a program that held more it
  is None (``notes`` says so)."""
  lowered_matmuls: int | None = None
  """dot/convolution ops in the lowered (StableHLO) program, loop bodies once."""
  compiled_matmuls: int | None = None
  """The same in the optimized HLO: fewer means XLA merged some away."""
  timeline: MemoryTimeline | None = field(default=None, repr=False)
  notes: tuple[str, ...] = ()
  num_devices: int = 1
  """Devices the executable is partitioned over."""
  mesh_shape: tuple[tuple[str, int], ...] | None = None
  """The mesh's axes and sizes, e.g. ``(('data', 2), ('model', 4))``."""
  collectives: tuple[Collective, ...] = ()
  """Collectives in the compiled step by kind and pass (``forward``,
  ``backward``, ``recompute``: re-run by remat), loop trip counts applied;
  see ``collectives.py`` for how they are attributed."""

  @property
  def collective_count(self) -> int:
    """Collective executions per step, all passes."""
    return count_collectives(self.collectives)

  @property
  def recompute_collective_count(self) -> int:
    """Collective executions the recompute adds to the backward pass."""
    return count_collectives(self.collectives, phase='recompute')

  @property
  def total_bytes(self) -> int | None:
    """Arguments + outputs + temporaries - aliased: the live footprint XLA
    accounts for on the device."""
    if self.failed:
      return None
    return (self.argument_bytes + self.output_bytes + self.temp_bytes
            - self.alias_bytes)

  @property
  def peak_bytes(self) -> int | None:
    """The best peak figure available: XLA's peak where it covers
    temporaries, otherwise the timeline's peak along the schedule, otherwise
    the total footprint."""
    if self.failed:
      return None
    if self.platform != 'cpu' and self.peak_memory_bytes:
      return self.peak_memory_bytes
    if self.timeline is not None:
      return self.timeline.peak_bytes
    return self.total_bytes

  @property
  def memory_share(self) -> float | None:
    """``peak_bytes`` as a share of ``device_memory_bytes`` (1.0 is full)."""
    if self.peak_bytes is None or not self.device_memory_bytes:
      return None
    return self.peak_bytes / self.device_memory_bytes

  @property
  def fits(self) -> bool | None:
    """Whether the step's peak fits the device's memory; None where either
    is unknown."""
    share = self.memory_share
    return None if share is None else share <= 1.0

  @property
  def error_line(self) -> str | None:
    """The first line of XLA's message on a failed compile (``…`` marks
    the rest); None where the compile did not fail."""
    if not self.failed:
      return None
    return first_line(self.error or '') or 'no message'

  @property
  def refused_for_memory(self) -> bool:
    """XLA refused the step for the device's memory (XLA:TPU's compile
    does; compile-only GPUs give their figures and refuse nothing)."""
    return self.failed and any(mark in (self.error or '') for mark in _MEMORY_REFUSALS)

  def to_dict(self) -> dict:
    from remat_explorer.analysis.split.report import plain_data
    out = plain_data(dataclasses.replace(self, buffer_assignment_proto=None))
    if self.buffer_assignment_proto is not None:
      out['buffer_assignment_proto'] = base64.b64encode(
          self.buffer_assignment_proto).decode('ascii')
    out['timeline'] = None if self.timeline is None else self.timeline.to_dict()
    out['total_bytes'] = self.total_bytes
    out['peak_bytes'] = self.peak_bytes
    out['memory_share'] = self.memory_share
    return out
