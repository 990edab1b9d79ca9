"""``compare``: every policy side by side, from the jaxpr and from XLA.

One row per policy (plus the program as written and the no-remat
baseline): each row's step is traced and analyzed here while XLA compiles
the others (``_Pipeline``), and a policy whose recompute XLA merged away is
compiled again under the lowering that keeps it. What a row holds, and the
Pareto front over the rows, is ``rows.py``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, Mapping, Sequence

from remat_explorer.analysis.split.analyze import analyze
from remat_explorer.analysis.xla.compiled import start_compile_costs
from remat_explorer.analysis.xla.run_times import timed_costs
from remat_explorer.analysis.full_collections import full_collections_held_off
from remat_explorer.analysis.progress import check_progress, progress_shown
from remat_explorer.analysis.program.keywords import check_keywords, entry_point
from remat_explorer.analysis.tradeoffs.row_warnings import with_warnings
from remat_explorer.analysis.tradeoffs.rows import (AS_WRITTEN, AS_WRITTEN_NO_REMAT,
                                                    KEEPS_RECOMPUTE, NO_REMAT_LABEL, Comparison,
                                                    KeptRecompute, PolicyRow, failed_costs,
                                                    mark_pareto_front, policy_row)
from remat_explorer.analysis.policies.policy_info import NO_REMAT, describe_policy
from remat_explorer.analysis.policies.policy_text import parse_policy
from remat_explorer.analysis.program.blocks import DEFAULT_LOWERING
from remat_explorer.analysis.program.problem import donated_positions
from remat_explorer.analysis.tradeoffs.merged_recompute import recompute_eliminated
from remat_explorer.engine import checkpoint_policies

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


@entry_point
def compare(f, *args, policies: Mapping[str, Any] | Sequence | None = None,
            lowering: str | None = None, argnums=0, has_aux: bool = False,
            repeats: int = 0, include_no_remat: bool = True,
            include_as_written: bool = True, progress: Progress | bool | None = None,
            parallel: int | None = None, suggest_lowering: bool = True,
            donate_argnums=(), **kwargs) -> Comparison:
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
  is called as each row is done (`total`: the rows, fixed from the start;
  without one, a line says it in a notebook or a terminal, ``progress.py``;
  ``progress=False``, nowhere),
  and with `done` unchanged as a lowering compiled besides a row lands
  (`label` then ends ``· lowering cond``). Run times (`repeats`) are measured once
  every compile has finished, one row at a time, so that nothing else
  shares the machine while they run.

  `donate_argnums`: positional arguments donated to every row's step, as
  ``compile_costs`` takes them (a training step jitted with
  ``donate_argnums`` writes its gradients over them), checked before
  anything is traced.

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
                 parallel=parallel, suggest_lowering=suggest_lowering,
                 donate_argnums=donate_argnums)
  donate = donated_positions(donate_argnums, args)
  check_progress(progress)
  common = dict(lowering=lowering, argnums=argnums, has_aux=has_aux, **kwargs)
  with full_collections_held_off(), progress_shown('compare', progress) as progress:
    rows = _rows(f, args, common, policies, include_as_written, include_no_remat,
                 parallel, progress, repeats, suggest_lowering, donate)
  device = rows[0].costs
  functions = ' / '.join(dict.fromkeys(r.costs.function for r in rows))
  return Comparison(function=functions, device_kind=device.device_kind,
                    platform=device.platform, rows=tuple(rows),
                    warnings=tuple(f'{r.label}: {w}' for r in rows for w in r.warnings),
                    num_devices=device.num_devices, mesh_shape=device.mesh_shape,
                    device_memory_bytes=device.device_memory_bytes)


def _rows(f, args, common, policies, include_as_written, include_no_remat, parallel,
          progress, repeats, suggest_lowering, donate) -> list[PolicyRow]:
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
  rows = _run(jobs, args, common, parallel, progress, repeats, suggest_lowering, donate)
  return with_warnings(mark_pareto_front(rows))


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
         suggest_lowering, donate) -> list[PolicyRow]:
  """One row per job (label -> (function, policy)), run times after.

  XLA compiles without Python's lock and this thread's work (tracing,
  lowering, analyzing, reading compiled programs) needs it, so the two are
  pipelined (``_Pipeline``): each step is traced and lowered here and its
  compile handed to `parallel` worker threads at once, the policies are
  analyzed while XLA compiles, and each compiled program is read as it
  lands."""
  workers = max(1, min(parallel or COMPILES_AT_ONCE, len(jobs)))
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    pipeline = _Pipeline(pool, jobs, args, common, progress, suggest_lowering, repeats,
                         donate)
    try:
      pipeline.start_compiles()
      pipeline.analyze_while_compiling()
      pipeline.read_landed(block=True)
    except BaseException:
      pipeline.cancel()
      raise
  return pipeline.rows()


class _Pipeline:
  """The compiles and analyses of one comparison, and what has landed.
  Where XLA merged a row's recompute away and `suggest_lowering`, the same
  policy under ``KEEPS_RECOMPUTE`` is handed to the workers as soon as the
  row lands (``PolicyRow.kept_recompute``). Rows to be run (`repeats`) are
  compiled in full, once: their runs are timed on those compiles. The
  compiles take the donated arguments; the analyses, which the donations do
  not change, do not."""

  def __init__(self, pool, jobs, args, common, progress, suggest_lowering, repeats,
               donate):
    self.pool, self.jobs, self.args, self.common = pool, jobs, args, common
    self.step_options = dict(common, donate_argnums=donate)
    self.repeats = repeats
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
                                                  for_running=self.repeats > 0,
                                                  **self.step_options)
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

  def rows(self) -> list[PolicyRow]:
    """The rows in the jobs' order; with `repeats`, each compiled row's runs
    timed on the executable compiled for it (nothing compiles again)."""
    rows, timed = [], []
    for label, (_, policy) in self.jobs.items():
      if label in self.failed:
        rows.append(policy_row(label, policy, None, self.failed[label]))
        continue
      row_costs = self.costs[label]
      if self.repeats and not row_costs.failed:
        # Rows that share a program share its executable: dropped once all
        # are timed.
        row_costs = timed_costs(self.pending[label], self.repeats, keep_executable=True)
        timed.append(self.pending[label])
      row = policy_row(label, policy, self.reports[label], row_costs)
      if (found := self.kept.get(label)) is not None and not found.failed:
        row = dataclasses.replace(row, kept_recompute=KeptRecompute(
            KEEPS_RECOMPUTE, found.peak_bytes, found.executed_flops))
      rows.append(row)
    for pending in timed:
      pending.entry()[1].drop()
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
                                    **{**self.step_options, 'lowering': KEEPS_RECOMPUTE})
    except Exception:  # the row stands as it is; the suggestion is what fails
      return
    self.pending[label, KEEPS_RECOMPUTE] = started
    self.waiting[started.compiled] = label, True

  def _fail(self, label, fn, e) -> None:
    # A row that cannot be traced, analyzed or compiled fails; the others go on.
    self.failed[label] = failed_costs(fn, label, self.common.get('lowering'), e)
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
