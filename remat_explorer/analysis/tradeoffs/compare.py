"""``compare``: every policy side by side, from the jaxpr and from XLA.

One row per policy (plus the no-remat baseline): what the analysis says it
saves and recomputes, and what XLA compiled. FLOPs come in three counts:
what the compiled program executes (XLA's count of each computation, loop
bodies once per trip: ``compiled_flops``, what the Pareto front, the charts,
the recommendation and the search rank by), what the jaxpr asks for (scan
trip counts applied: ``flops``; XLA may merge or drop some of it), and XLA's
``cost_analysis`` as it reports it (a loop's body once: ``xla_flops``).

For a sharded program, compiled bytes, XLA's FLOPs and the collectives are
per device (one device's partitioned executable); residual bytes come both
global and per device, and the jaxpr's FLOPs are the whole program's.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import jax

from remat_explorer.analysis.split.analyze import analyze
from remat_explorer.analysis.xla.compiled import compile_costs, start_compile_costs
from remat_explorer.analysis.xla.costs import CompiledCosts
from remat_explorer.analysis.errors import error_summary
from remat_explorer.analysis.full_collections import full_collections_held_off
from remat_explorer.analysis.program.keywords import check_keywords, entry_point
from remat_explorer.analysis.tradeoffs.layouts import scan_layouts
from remat_explorer.analysis.tradeoffs.row_warnings import with_warnings
from remat_explorer.analysis.policies.policy_info import NO_REMAT, describe_policy
from remat_explorer.analysis.policies.policy_text import parse_policy
from remat_explorer.analysis.program.problem import function_name
from remat_explorer.analysis.program.blocks import DEFAULT_LOWERING
from remat_explorer.analysis.split.report import RematReport, plain_data
from remat_explorer.analysis.tradeoffs.merged_recompute import recompute_eliminated
from remat_explorer.engine import checkpoint_policies

FLOPS_USED_BY_CHARTS = 'compiled (executed, loops counted)'
"""Charts plot the FLOPs the compiled program executes (``ranked_flops``)."""

Progress = Callable[[int, int, str], None]


def builtin_policies(names_in_program: Sequence[str] = ()) -> dict[str, Any]:
  """Every built-in policy that applies to a program with these names.

  Example:
    >>> from remat_explorer import analysis
    >>> list(analysis.builtin_policies(['hidden']))
    ['nothing_saveable', 'dots_with_no_batch_dims_saveable', 'dots_saveable',
     'everything_saveable', "save_only_these_names('hidden')"]
  """
  policies = {
      'nothing_saveable': checkpoint_policies.nothing_saveable,
      'dots_with_no_batch_dims_saveable':
          checkpoint_policies.dots_with_no_batch_dims_saveable,
      'dots_saveable': checkpoint_policies.dots_saveable,
      'everything_saveable': checkpoint_policies.everything_saveable,
  }
  if names_in_program:
    policy = checkpoint_policies.save_only_these_names(*names_in_program)
    policies[describe_policy(policy)] = policy
  return policies


@dataclass(frozen=True)
class KeptRecompute:
  """A row's policy compiled under the lowering that keeps its recompute
  (XLA cannot merge work across a conditional), where the row's own
  lowering let XLA merge it away."""
  lowering: str
  peak_bytes: int | None
  compiled_flops: float | None


KEEPS_RECOMPUTE = 'cond'
"""The lowering measured beside a row whose recompute XLA merged away."""


@dataclass(frozen=True)
class PolicyRow:
  """One policy: the analysis and XLA's compiled figures.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> row = rx.compare(f, w, x, policies=['dots_saveable']).row('dots_saveable')
    >>> row.failed, row.residual_bytes, row.peak_bytes > 0
    (False, 4096, True)
  """
  label: str
  policy: Any = dataclasses.field(repr=False, compare=False)
  report: RematReport | None = dataclasses.field(repr=False, compare=False)
  costs: CompiledCosts = dataclasses.field(repr=False, compare=False)
  residual_bytes: int | None
  flops: int | None
  """Forward + backward FLOPs from the jaxpr, trip counts applied."""
  recompute_flops: int | None
  xla_flops: float | None
  """XLA's ``cost_analysis()``: each loop's body once."""
  temp_bytes: int | None
  peak_bytes: int | None
  """Compiled, per device."""
  compile_seconds: float | None
  run_seconds: float | None
  failed: bool
  recompute_eliminated: str | None = None
  """Set when XLA merged recomputed matmuls away: the policy's memory saving
  then does not happen, whatever the jaxpr says."""
  on_pareto_front: bool = False
  residual_bytes_per_device: int | None = None
  """What one device keeps (``residual_bytes`` unless sharded)."""
  collectives: int | None = None
  """Collective executions per step in the compiled program."""
  recompute_collectives: int | None = None
  """Of those, the ones the recompute re-runs in the backward pass."""
  scan_layouts: tuple = ()
  """For each ``checkpointed_scan`` in the program, its schedule's
  predicted costs beside the measured ones (``layouts.ScanLayoutCheck``)."""
  warnings: tuple[str, ...] = ()
  """What is wrong with this row's figures, each once, without the label
  (``Comparison.warnings`` holds them with it)."""
  compiled_flops: float | None = None
  """FLOPs the compiled program executes (per device), loops counted."""
  kept_recompute: KeptRecompute | None = None
  """Where XLA merged the recompute away (``recompute_eliminated``), the
  same policy compiled under ``KEEPS_RECOMPUTE``: what keeping it saves."""

  @property
  def flops_unknown(self) -> bool:
    """The compiled program runs a loop whose trip count XLA cannot infer (a
    ``while_loop`` that ends on a value): no count of its FLOPs is whole."""
    return self.costs is not None and self.costs.loops_of_unknown_trip_count > 0

  @property
  def ranked_flops(self) -> float | None:
    """The FLOPs rows are ranked by: what the compiled program executes,
    else (no compiled count) what the jaxpr asks for; None where the
    program's loops make every count partial (``flops_unknown``)."""
    if self.flops_unknown:
      return None
    if self.compiled_flops is not None:
      return self.compiled_flops
    return self.flops if self.flops is not None else self.xla_flops


@dataclass(frozen=True)
class Comparison:
  """What ``compare`` measured: a row per policy (or per function), the
  program as written and without remat first, and the Pareto front.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> comparison = rx.compare(f, w, x, policies=['dots_saveable'])
    >>> [row.label for row in comparison.rows], comparison.baseline.label
    (['as written', 'no remat', 'dots_saveable'], 'no remat')
  """
  function: str
  device_kind: str
  platform: str
  rows: tuple[PolicyRow, ...]
  warnings: tuple[str, ...]
  """Every row's warnings, each starting with ``'<label>: '``; the rows'
  ``warnings`` hold the same without the label."""
  flops_used_by_charts: str = FLOPS_USED_BY_CHARTS
  num_devices: int = 1
  """Devices each compiled program is partitioned over."""
  mesh_shape: tuple[tuple[str, int], ...] | None = None
  device_memory_bytes: int | None = None
  """One device's memory (``CompiledCosts.device_memory_bytes``); None on the CPU."""

  @property
  def baseline(self) -> PolicyRow | None:
    return next((r for r in self.rows if r.policy is NO_REMAT), None)

  @property
  def pareto_front(self) -> tuple[PolicyRow, ...]:
    return tuple(r for r in self.rows if r.on_pareto_front)

  def row(self, label: str) -> PolicyRow:
    for r in self.rows:
      if r.label == label:
        return r
    raise KeyError(f'no policy {label!r} in this comparison; it has '
                   f'{[r.label for r in self.rows]}')

  def to_dict(self) -> dict:
    out = plain_data(dataclasses.replace(self, rows=()))
    out['rows'] = [dict(plain_data(r), costs=r.costs.to_dict(),
                        report=None if r.report is None else r.report.to_dict())
                   for r in self.rows]
    return out


AS_WRITTEN = 'as written'
"""The label of the program's own policies, unchanged."""
AS_WRITTEN_NO_REMAT = 'as written (no remat)'
"""The label of a program without a remat block, as it is."""
NO_REMAT_LABEL = 'no remat'
"""The label of the program with its remat blocks removed."""


@entry_point
def compare(f, *args, policies: Mapping[str, Any] | Sequence | None = None,
            lowering: str | None = None, argnums=0, has_aux: bool = False,
            repeats: int = 0, include_no_remat: bool = True,
            include_as_written: bool = True, progress: Progress | None = None,
            parallel: int | None = None, suggest_lowering: bool = True,
            **kwargs) -> Comparison:
  """Analyze and compile `f`'s training step (``compile_costs``) under each
  policy, or each of several functions.

  The first row is the program as written (each block's own policy; for a
  program without a remat block, the figures without remat), then no
  remat, then `policies`: a mapping label -> policy, a sequence of
  policies, of names of ``checkpoint_policies`` entries (``'dots_saveable'``)
  or of policy expressions (``"save_only_these_names('qkv')"``), or
  ``None`` for every built-in policy that applies (named-value ones with
  the program's own names). A program without a remat block is
  checkpointed as a whole for each policy row (the rows' notes say so).

  `f` may instead be a mapping from labels to functions of the same
  arguments, such as layouts of one computation (``{'scan': f0, 'sqrt':
  f1, 'binomial s=4': f2}``): one row each, every function as written.
  Rows whose program runs a ``checkpointed_scan`` carry its predicted
  costs beside the measured ones (``PolicyRow.scan_layouts``).

  XLA's compiles run on `parallel` worker threads (by default
  ``COMPILES_AT_ONCE``, one: each compile in flight holds working memory
  of its own) without holding Python's lock, while the calling
  thread traces the next steps, analyzes the policies and reads each
  compiled program as it lands; Python's full garbage collections are held
  off meanwhile (``full_collections.py``). `progress(done, total, label)`
  is called as each row is done (`total`: the rows, fixed from the start),
  and with `done` unchanged as a lowering compiled besides a row lands
  (`label` then ends ``· lowering cond``). Run times (`repeats`) are measured once
  every compile has finished, one row at a time, so that nothing else
  shares the machine while they run.

  Where XLA merged a row's recompute away (``PolicyRow.recompute_eliminated``)
  and `suggest_lowering`, that row's policy is also compiled under
  ``lowering='cond'``, which keeps the recompute, and the row says what it
  would save (``PolicyRow.kept_recompute``): one more compile per such row.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> def loss(w, x):
    ...   layer = rx.checkpoint(lambda h: jnp.tanh(h @ w))
    ...   return jnp.sum(layer(layer(x)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> comparison = rx.compare(loss, w, x, policies=['nothing_saveable', 'dots_saveable'])
    >>> [row.label for row in comparison.rows]
    ['as written', 'no remat', 'nothing_saveable', 'dots_saveable']
  """
  check_keywords(compare, f, kwargs, policies=policies, lowering=lowering, argnums=argnums,
                 has_aux=has_aux, repeats=repeats, include_no_remat=include_no_remat,
                 include_as_written=include_as_written, progress=progress,
                 parallel=parallel, suggest_lowering=suggest_lowering)
  common = dict(lowering=lowering, argnums=argnums, has_aux=has_aux, **kwargs)
  with full_collections_held_off():
    rows = _rows(f, args, common, policies, include_as_written, include_no_remat,
                 parallel, progress, repeats, suggest_lowering)
  device = rows[0].costs
  functions = ' / '.join(dict.fromkeys(r.costs.function for r in rows))
  return Comparison(function=functions, device_kind=device.device_kind,
                    platform=device.platform, rows=tuple(rows),
                    warnings=tuple(f'{r.label}: {w}' for r in rows for w in r.warnings),
                    num_devices=device.num_devices, mesh_shape=device.mesh_shape,
                    device_memory_bytes=device.device_memory_bytes)


def _rows(f, args, common, policies, include_as_written, include_no_remat, parallel,
          progress, repeats, suggest_lowering) -> list[PolicyRow]:
  """The rows of `compare`, in its order, front and warnings marked."""
  if isinstance(f, Mapping):
    jobs = _layout_jobs(f, policies)
  else:
    first = analyze(f, *args, **common)
    jobs = {}
    if include_as_written:
      jobs[AS_WRITTEN if first.blocks else AS_WRITTEN_NO_REMAT] = (f, None)
    if include_no_remat and (first.blocks or not include_as_written):
      jobs[NO_REMAT_LABEL] = (f, NO_REMAT)
    for label, policy in _resolve_policies(policies, first.names_in_program).items():
      jobs.setdefault(label, (f, policy))
  rows = _run(jobs, args, common, parallel, progress, repeats, suggest_lowering)
  return with_warnings(_mark_pareto_front(rows))


def _layout_jobs(functions: Mapping, policies) -> dict[str, tuple]:
  if policies is not None:
    raise TypeError('compare takes policies= for one function; for a mapping of '
                    'functions, each is compared as written. Checkpoint inside '
                    'each function as you mean it.')
  if not functions:
    raise ValueError('compare got an empty mapping of functions to compare.')
  for label, fn in functions.items():
    if not isinstance(label, str) or not callable(fn):
      raise TypeError('compare takes a mapping from labels (str) to functions, '
                      f'but it maps {label!r} to {fn!r}.')
  return {label: (fn, None) for label, fn in functions.items()}


def _run(jobs: dict[str, tuple], args, common, parallel, progress, repeats,
         suggest_lowering) -> list[PolicyRow]:
  """One row per job (label -> (function, policy)), run times after.

  XLA compiles without Python's lock and this thread's work (tracing,
  lowering, analyzing, reading compiled programs) needs it, so the two are
  pipelined (``_Pipeline``): each step is traced and lowered here and its
  compile handed to `parallel` worker threads at once, the policies are
  analyzed while XLA compiles, and each compiled program is read as it
  lands."""
  workers = max(1, min(parallel or COMPILES_AT_ONCE, len(jobs)))
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    pipeline = _Pipeline(pool, jobs, args, common, progress, suggest_lowering)
    try:
      pipeline.start_compiles()
      pipeline.analyze_while_compiling()
      pipeline.read_landed(block=True)
    except BaseException:
      pipeline.cancel()
      raise
  return pipeline.rows(repeats)


class _Pipeline:
  """The compiles and analyses of one comparison, and what has landed.
  Where XLA merged a row's recompute away and `suggest_lowering`, the same
  policy under ``KEEPS_RECOMPUTE`` is handed to the workers as soon as the
  row lands (``PolicyRow.kept_recompute``)."""

  def __init__(self, pool, jobs, args, common, progress, suggest_lowering):
    self.pool, self.jobs, self.args, self.common = pool, jobs, args, common
    self.progress = progress
    lowering = common.get('lowering') or DEFAULT_LOWERING
    self.suggest = suggest_lowering and lowering not in (KEEPS_RECOMPUTE, 'while')
    self.pending, self.reports, self.costs, self.failed, self.kept = {}, {}, {}, {}, {}
    self.waiting: dict = {}  # compile future -> (label, whether it is a suggestion)

  # -- the steps ---------------------------------------------------------------------

  def start_compiles(self) -> None:
    """Trace and lower every row's step here; XLA compiles on the workers."""
    for label, (fn, policy) in self.jobs.items():
      try:
        self.pending[label] = start_compile_costs(self.pool, fn, *self.args, policy=policy,
                                                  **self.common)
      except Exception as e:
        self._fail(label, fn, e)
        continue
      self.waiting[self.pending[label].compiled] = label, False

  def analyze_while_compiling(self) -> None:
    """Analyze each row's policy, reading the compiles that landed meanwhile."""
    for label, (fn, policy) in self.jobs.items():
      if label not in self.pending:
        continue
      try:
        self.reports[label] = analyze(fn, *self.args, policy=policy, **self.common)
      except Exception as e:
        self.waiting.pop(self.pending[label].compiled, None)
        self._fail(label, fn, e)
      self.read_landed(block=False)

  def read_landed(self, block: bool) -> None:
    """Read the compiles that landed whose policy is analyzed (waiting for
    one if `block`, until none is left), so that progress moves while the
    analyses go on."""
    while True:
      ready = [f for f, (label, suggested) in self.waiting.items()
               if suggested or label in self.reports]
      if not ready:
        return
      landed, _ = concurrent.futures.wait(
          ready, timeout=None if block else 0,
          return_when=concurrent.futures.FIRST_COMPLETED)
      if not landed:
        return
      for future in landed:
        self._land(future)

  def cancel(self) -> None:
    for p in self.pending.values():
      p.compiled.cancel()

  def rows(self, repeats) -> list[PolicyRow]:
    """The rows in the jobs' order; with `repeats`, each compiled row's runs
    timed (its executable cached: nothing compiles again)."""
    rows = []
    for label, (fn, policy) in self.jobs.items():
      if label in self.failed:
        rows.append(_row(label, policy, None, self.failed[label]))
        continue
      row_costs = self.costs[label]
      if repeats and not row_costs.failed:
        row_costs = compile_costs(fn, *self.args, policy=policy, repeats=repeats,
                                  **self.common)
      row = _row(label, policy, self.reports[label], row_costs)
      if (found := self.kept.get(label)) is not None and not found.failed:
        row = dataclasses.replace(row, kept_recompute=KeptRecompute(
            KEEPS_RECOMPUTE, found.peak_bytes, found.executed_flops))
      rows.append(row)
    return rows

  # -- what each landing does --------------------------------------------------------

  def _land(self, future) -> None:
    label, suggested = self.waiting.pop(future)
    if suggested:
      try:
        self.kept[label] = self.pending[label, KEEPS_RECOMPUTE].result()
      except Exception:
        self.kept[label] = None
      self._done(f'{label} · lowering {KEEPS_RECOMPUTE}')
      return
    try:
      self.costs[label] = self.pending[label].result()
    except Exception as e:
      self._fail(label, self.jobs[label][0], e)
      return
    if self.suggest and recompute_eliminated(self.reports[label], self.costs[label]):
      self._suggest(label)
    self._done(label)

  def _suggest(self, label) -> None:
    fn, policy = self.jobs[label]
    try:
      started = start_compile_costs(self.pool, fn, *self.args, policy=policy,
                                    **{**self.common, 'lowering': KEEPS_RECOMPUTE})
    except Exception:  # the row stands as it is; the suggestion is what fails
      return
    self.pending[label, KEEPS_RECOMPUTE] = started
    self.waiting[started.compiled] = label, True

  def _fail(self, label, fn, e) -> None:
    # A row that cannot be traced, analyzed or compiled fails; the others go on.
    self.failed[label] = _failed_costs(fn, label, self.common.get('lowering'), e)
    self._done(label)

  def _done(self, label) -> None:
    # Rows done of the rows asked for: a total that never moves. A lowering
    # compiled besides a row (``label · lowering cond``) is told as it lands,
    # the count unchanged: whether it is needed is known only then.
    if self.progress is not None:
      self.progress(len(self.costs) + len(self.failed), len(self.jobs), label)


COMPILES_AT_ONCE = 1
"""XLA compiles ``compare`` and ``search_policy`` run at once by default.
Each compile in flight holds its own working memory, which grows with the
program: with a compile per core, a comparison of a step whose compile
by hand peaks at 2.2 GB reached 9.5 GB, and a search after it ``bad_alloc``.
One at a time keeps the process near the same compiles by hand, and not
slower than them: the calling thread traces and analyzes the next policies
beside it. ``compare(parallel=N)`` runs N at once."""


def _resolve_policies(policies, names_in_program) -> dict[str, Any]:
  if policies is None:
    return builtin_policies(names_in_program)
  if isinstance(policies, Mapping):
    return dict(policies)
  if isinstance(policies, str) or callable(policies):
    raise TypeError('policies must be a mapping or a sequence of policies (or of '
                    f'their names); for one policy pass [{policies!r}].')
  resolved = {}
  for p in policies:
    if isinstance(p, str):
      policy = _named_policy(p)
      resolved[describe_policy(policy)] = policy
    elif callable(p):
      resolved[describe_policy(p)] = p
    else:
      raise TypeError(f'policies must hold policies or their names; got {p!r}')
  return resolved


def _named_policy(text: str):
  try:
    return parse_policy(text)
  except ValueError as e:
    raise ValueError(
        f'{text!r} is not a policy of checkpoint_policies: name one of '
        f'{sorted(builtin_policies())} or write one, e.g. '
        f"\"save_only_these_names('query')\" ({e})") from None


def _failed_costs(fn, label, lowering, e: Exception) -> CompiledCosts:
  device = jax.devices()[0]
  return CompiledCosts(function=function_name(fn), policy=label,
                       lowering=lowering or DEFAULT_LOWERING, platform=device.platform,
                       device_kind=device.device_kind, failed=True,
                       error=error_summary(e, one_line=True))


def _row(label, policy, report, costs) -> PolicyRow:
  if report is None:  # it failed before XLA had a program
    return PolicyRow(label=label, policy=policy, report=None, costs=costs,
                     residual_bytes=None, flops=None, recompute_flops=None,
                     xla_flops=None, temp_bytes=None, peak_bytes=None,
                     compile_seconds=None, run_seconds=None, failed=True)
  flops, recompute, residual = report.total_flops, report.recompute_flops, report.residual_bytes
  layouts = scan_layouts(report, costs)
  # The binomial schedule recomputes in a loop of its own, not in blocks:
  # its recompute is measured in the backward pass (``layouts.py``).
  recompute += sum(round(c.recomputed_steps * c.step_flops) for c in layouts
                   if c.schedule.startswith('binomial') and c.recomputed_steps)
  return PolicyRow(
      label=label, policy=policy, report=report, costs=costs,
      residual_bytes=residual, flops=flops, recompute_flops=recompute,
      xla_flops=costs.xla_flops, temp_bytes=costs.temp_bytes,
      peak_bytes=costs.peak_bytes, compile_seconds=costs.compile_seconds,
      run_seconds=costs.run_seconds, failed=costs.failed,
      recompute_eliminated=recompute_eliminated(report, costs),
      residual_bytes_per_device=report.residual_bytes_per_device,
      collectives=None if costs.failed else costs.collective_count,
      recompute_collectives=None if costs.failed else costs.recompute_collective_count,
      scan_layouts=layouts, compiled_flops=costs.executed_flops)


def _mark_pareto_front(rows: list[PolicyRow]) -> list[PolicyRow]:
  """A row is on the front if no other row is at least as good on both peak
  memory and FLOPs and better on one."""
  usable = [r for r in rows if not r.failed and r.peak_bytes is not None
            and r.ranked_flops is not None]

  def dominated(r):
    return any(o.peak_bytes <= r.peak_bytes and o.ranked_flops <= r.ranked_flops
               and (o.peak_bytes < r.peak_bytes or o.ranked_flops < r.ranked_flops)
               for o in usable)
  front = {id(r) for r in usable if not dominated(r)}
  return [dataclasses.replace(r, on_pareto_front=id(r) in front) for r in rows]
