"""``search_policy``: the policy that fits a memory budget with fewest FLOPs.

JAX has no automatic policy. This search chooses what to save among handles
that hold at any batch or sequence length (``chosen_policy.py``): the
program's ``checkpoint_name``s, roles of equations (dots with and without
batch dims, convolutions) and equation patterns (primitive, input ranks
and dtypes, parameters), as a greedy knapsack: each handle is priced by the
analysis (the residual bytes it adds, the recompute FLOPs it removes), which
compiles nothing for a program on one device (for a sharded one it compiles
the forward pass to learn the residuals' shardings, and counts it), and
the result is verified by compiling it. The built-in policies, the program
as written and the program without remat are compiled too and are
candidates, so the answer is never beaten on both peak and FLOPs by any of
them: it is on the Pareto front of everything the search compiled.

``rank_by_estimate=True`` trades that guarantee for compiles: every
candidate is priced by ``estimate_costs`` (its jaxpr, nothing compiled) and
only the finalists are compiled, the answer among them. The others are
shown at their estimates calibrated on what was compiled, and a row that
would so beat the answer is compiled too: the table never contradicts it.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

import numpy as np

from remat_explorer.analysis.split.analyze import analyze
from remat_explorer.analysis.tradeoffs.budget import (NothingCompiled, checked_budget,
                                                      resolve_budget)
from remat_explorer.analysis.tradeoffs.calibration import (calibrated, flops_error, may_fit,
                                                           ranked_flops)
from remat_explorer.analysis.tradeoffs.save_units import greedy_units, policy_of, user_sites
from remat_explorer.analysis.tradeoffs.compare import COMPILES_AT_ONCE, builtin_policies
from remat_explorer.analysis.tradeoffs.rows import AS_WRITTEN, AS_WRITTEN_NO_REMAT, NO_REMAT_LABEL
from remat_explorer.analysis.tradeoffs.search_result import (OWN_LABELS, Candidate, SearchResult,
                                                             explanation, policy_to_keep)
from remat_explorer.analysis.xla.compiled import (PendingCosts, cached_compile_costs,
                                                  compile_costs, start_compile_costs)
from remat_explorer.analysis.xla.costs import CompiledCosts
from remat_explorer.analysis.split.estimate import CostEstimate, estimate_costs
from remat_explorer.analysis.context import compiles_run
from remat_explorer.analysis.full_collections import full_collections_held_off
from remat_explorer.analysis.progress import check_progress, progress_shown
from remat_explorer.analysis.program.keywords import check_keywords, entry_point
from remat_explorer.analysis.program.problem import donated_positions
from remat_explorer.analysis.policies.policy_info import NO_REMAT
from remat_explorer.analysis.split.report import RematReport

Progress = Callable[[int, 'int | None', str], None]
"""``progress(done, total, label)``; `total` is None while it is not known
(pricing, verifying)."""


@entry_point
def search_policy(f, *args, memory_budget: int | float | str, argnums=0,
                  has_aux: bool = False, lowering: str | None = None,
                  progress: Progress | bool | None = None, rank_by_estimate: bool = False,
                  donate_argnums=(), **kwargs) -> SearchResult:
  """Find a policy whose compiled peak fits `memory_budget`, fewest FLOPs.

  `memory_budget`: bytes (an int, or a size with its unit, ``"14 GiB"`` or
  ``"512 MiB"``, as budgets are printed; ``"GB"`` and ``"MB"`` are powers of
  1000); a fraction between 0.0 and 1.0 of the way from
  ``nothing_saveable``'s compiled peak to ``everything_saveable``'s;
  or a share of the device's memory as a percentage (``"90%"``), for a
  device whose memory is known (a GPU or TPU, live or a ``target_mesh``'s).
  For a sharded program the peak, the budget and the residual bytes that
  price each choice are per device. The policy holds at other batch and
  sequence sizes (it never looks at sizes); ``SearchResult.to_source()``
  writes it as Python for ``jax.checkpoint``.

  `rank_by_estimate`: rank every candidate by ``estimate_costs`` (nothing
  compiled) and compile only the finalists: the built-ins a fractional
  budget is measured between (and a sharded program's estimates, which
  are the whole program's, calibrated on), then the candidates that may
  fit (their estimated peak within the estimate's error of the budget),
  fewest estimated FLOPs first, until one fits; the answer is compiled and
  fits, but only the compiled candidates are sure not to beat it (no
  uncompiled one does at its calibrated estimate: one that would is
  compiled). Those
  include every candidate compiled before in the process (a ``compare``'s
  rows), taken from the cache at no compile. Its own choice saves nothing
  whose estimated saving lies within the estimate's FLOPs error (measured
  on the built-ins compiled).

  `progress(done, total, label)` is called as the search goes (`total`
  None while it prices and verifies its choices); without one, a line says
  it in a notebook or a terminal (``progress.py``); ``progress=False``,
  nowhere.

  `donate_argnums`: positional arguments donated to every candidate's
  step, as ``compile_costs`` and ``estimate_costs`` take them; the budget
  is measured against peaks with the donations.

  A candidate XLA does not compile is one that does not fit. Where XLA
  compiles none of them (or, for a fractional budget, not the two
  built-ins it is measured between) for a reason other than the device's
  memory, there is no answer, and a ``RuntimeError`` gives XLA's first
  line.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> def loss(w, x):
    ...   layer = rx.checkpoint(lambda h: jnp.tanh(h @ w))
    ...   return jnp.sum(layer(layer(x)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> result = rx.search_policy(loss, w, x, memory_budget=0.5)
    >>> result.fits, result.peak_bytes <= result.budget_bytes
    (True, True)
  """
  check_keywords(search_policy, f, kwargs, memory_budget=memory_budget, argnums=argnums,
                 has_aux=has_aux, lowering=lowering, progress=progress,
                 rank_by_estimate=rank_by_estimate, donate_argnums=donate_argnums)
  memory_budget = checked_budget(memory_budget)
  donate = donated_positions(donate_argnums, args)
  if not isinstance(rank_by_estimate, bool):
    raise TypeError(f'rank_by_estimate must be True or False, got {rank_by_estimate!r}.')
  check_progress(progress)
  with full_collections_held_off(), progress_shown('search_policy', progress) as progress, \
      concurrent.futures.ThreadPoolExecutor(max_workers=COMPILES_AT_ONCE) as pool:
    run = _Runner(f, args, kwargs, argnums, has_aux, lowering, progress, donate)
    run.pool = pool
    try:
      return _search(run, memory_budget, rank_by_estimate)
    except BaseException:
      run.cancel()
      raise


def _search(run, memory_budget, rank_by_estimate) -> SearchResult:
  names = run.report(builtin_policies()['nothing_saveable']).names_in_program
  policies = builtin_policies(names)
  if rank_by_estimate:
    return _search_by_estimate(run, names, policies, memory_budget)
  # Every one of these is compiled: XLA compiles them on worker threads
  # while this thread analyzes each and reads what lands.
  own_rows = _own_rows(run)
  run.start({**policies, **own_rows})
  builtins = {}
  for i, (label, policy) in enumerate(policies.items()):
    run.say(i, len(policies), f'compiling {label}')
    builtins[label] = run.evaluate(label, policy)
  budget = resolve_budget(memory_budget, builtins)
  # The program as written and without remat are answers too: a search
  # never returns a policy that either of them beats on both peak and FLOPs.
  own = {}
  for label, policy in own_rows.items():
    run.say(0, None, f'compiling {label}')
    own[label] = run.evaluate(label, policy)
  evaluated = {**builtins, **own}
  evaluated.update(_greedy_choice(run, names, budget, builtins))
  return run.best(budget, evaluated)


def _own_rows(run) -> dict[str, Any]:
  """The program as written and, if it has remat blocks, without them."""
  if run.report(None).blocks:
    return {AS_WRITTEN: None, NO_REMAT_LABEL: NO_REMAT}
  return {AS_WRITTEN_NO_REMAT: None}


class _Runner:
  """Evaluates policies (analysis + compile), each once, counting the
  compiles XLA really ran (not results found in ``compile_costs``' cache).
  Compiles and estimates take the donated arguments; the analyses, which
  the donations do not change, do not."""

  def __init__(self, f, args, kwargs, argnums, has_aux, lowering, progress, donate):
    self.f, self.args = f, args
    self.options = dict(kwargs, argnums=argnums, has_aux=has_aux, lowering=lowering)
    self.step_options = dict(self.options, donate_argnums=donate)
    self.progress = progress
    self.compiles_before = compiles_run()
    self.policies: dict[str, Any] = {}
    self._evaluated: dict[str, tuple[CompiledCosts, RematReport]] = {}
    self._started: dict[str, PendingCosts] = {}
    self.pool: concurrent.futures.Executor | None = None

  def say(self, done, total, label) -> None:
    if self.progress is not None:
      self.progress(done, total, label)

  def report(self, policy) -> RematReport:
    return analyze(self.f, *self.args, policy=policy, **self.options)

  def start(self, policies: dict[str, Any]) -> None:
    """Hand the compiles of `policies` to XLA on the worker threads at
    once, each read when ``evaluate`` asks for it."""
    for label, policy in policies.items():
      if label not in self._evaluated and label not in self._started:
        try:
          self._started[label] = start_compile_costs(
              self.pool, self.f, *self.args, policy=policy, **self.step_options)
        except Exception:  # ``evaluate`` compiles it, and says why it fails
          continue

  def cancel(self) -> None:
    """Drop the compiles started that have not begun."""
    for started in self._started.values():
      started.compiled.cancel()

  def evaluate(self, label, policy) -> tuple[CompiledCosts, RematReport]:
    if label not in self._evaluated:
      started = self._started.pop(label, None)
      self._keep(label, policy, started.result() if started is not None else
                 compile_costs(self.f, *self.args, policy=policy, **self.step_options))
    return self._evaluated[label]

  def compiled_before(self, label, policy) -> tuple[CompiledCosts, RematReport] | None:
    """``evaluate``'s answer where the compile is already in
    ``compile_costs``' cache (a ``compare`` or a search before compiled
    it), at no compile; None where it is not."""
    if label not in self._evaluated:
      costs = cached_compile_costs(self.f, *self.args, policy=policy,
                                   **self.step_options)
      if costs is None:
        return None
      self._keep(label, policy, costs)
    return self._evaluated[label]

  def _keep(self, label, policy, costs: CompiledCosts) -> None:
    self.policies[label] = policy
    self._evaluated[label] = costs, self.report(policy)

  def estimate(self, label, policy) -> CostEstimate:
    self.policies.setdefault(label, policy)
    return estimate_costs(self.f, *self.args, policy=policy, **self.step_options)

  def best(self, budget, evaluated, estimated=()) -> SearchResult:
    """The answer among the compiled candidates `evaluated`; `estimated`:
    the others, as Candidates of estimated figures."""
    candidates = tuple(
        Candidate(label, c.peak_bytes, ranked_flops(c, r),
                  fits=not c.failed and c.peak_bytes <= budget)
        for label, (c, r) in evaluated.items())
    fitting = [c for c in candidates if c.fits]
    failures = [(label, c) for label, (c, _) in evaluated.items() if c.failed]
    if len(failures) == len(evaluated) and not all(
        c.refused_for_memory for _, c in failures):
      label, costs = next(f for f in failures if not f[1].refused_for_memory)
      raise NothingCompiled(
          f'XLA compiled none of the {len(failures)} candidates for '
          f'{costs.device_kind}, so no policy can be chosen; on {label}: {costs.error_line}')
    compiled, candidates = candidates, candidates + tuple(estimated)
    # Fewest FLOPs, then the lowest peak: nothing that fits is better on
    # both, and nothing that does not fit has a lower peak. On a tie the
    # program as it is wins: nothing to change.
    pool = fitting or [min(compiled, key=lambda c: c.peak_bytes or float('inf'))]
    chosen = min(pool, key=lambda c: (c.flops, c.peak_bytes, c.label not in OWN_LABELS))
    costs, report = evaluated[chosen.label]
    policy = self.policies[chosen.label]
    kept = policy_to_keep(compiled) if policy is NO_REMAT else None
    return SearchResult(
        policy=policy, label=chosen.label[:80], budget_bytes=budget,
        peak_bytes=costs.peak_bytes, flops=chosen.flops, fits=bool(fitting),
        explanation=explanation(chosen, policy, budget, candidates, bool(fitting),
                             refusal=costs.error_line or ''),
        compiles_used=compiles_run() - self.compiles_before,
        candidates=candidates, costs=costs, report=report, kept_checkpoint=kept,
        kept_checkpoint_policy=None if kept is None else self.policies[kept.label])


def _search_by_estimate(run: _Runner, names, policies, memory_budget) -> SearchResult:
  """``search_policy`` ranking by ``estimate_costs``, compiling finalists."""
  own = _own_rows(run)
  estimates = {label: run.estimate(label, policy)
               for label, policy in {**policies, **own}.items()}
  compiled = {}
  nothing = estimates['nothing_saveable']
  # A fraction or a share is measured on the two built-ins compiled. So is
  # a sharded program's estimate, which is the whole program's where the
  # budget is per device: their compiled peaks over their estimates bring
  # the others to one device.
  if not isinstance(memory_budget, int) or nothing.num_devices > 1:
    for label in ('nothing_saveable', 'everything_saveable'):
      run.say(0, None, f'compiling {label}')
      compiled[label] = run.evaluate(label, policies[label])
  budget = resolve_budget(memory_budget, compiled, floor=None if compiled else
                           nothing.argument_bytes + nothing.output_bytes)
  predict = calibrated(estimates, compiled)
  base_report = run.report(policies['nothing_saveable'])
  units = greedy_units(run, base_report, names, lambda units: predict(
      run.estimate(repr(policy_of(units)), policy_of(units)).peak_bytes) <= budget,
      min_saved_flops=flops_error(estimates, compiled))
  if units:
    policy = policy_of(units, sites=user_sites(base_report, units))
    estimates[repr(policy)] = run.estimate(repr(policy), policy)
  # Fewest estimated FLOPs first among those that may fit, the estimate's
  # own error allowed for (a candidate just over the budget by estimate may
  # fit once compiled, and beat one well under it); compiled in turn until
  # the next could not beat the best that fits.
  within_reach = may_fit(estimates, compiled, budget)
  rank = lambda label: (estimates[label].flops, estimates[label].peak_bytes,
                        label not in OWN_LABELS)
  finalists = sorted((label for label, e in estimates.items()
                      if within_reach(e.peak_bytes)), key=rank)
  finalists = finalists or [min(estimates, key=lambda label: estimates[label].peak_bytes)]
  best = None
  for label in finalists:
    if best is not None and rank(label) >= rank(best):
      break
    run.say(0, None, f'verifying {label}')
    costs, _ = compiled[label] = run.evaluate(label, run.policies[label])
    if not costs.failed and costs.peak_bytes <= budget:
      best = label
  if best is None and 'nothing_saveable' not in compiled:  # the least memory
    compiled['nothing_saveable'] = run.evaluate('nothing_saveable',
                                                policies['nothing_saveable'])
  # The candidates compiled before (a ``compare``'s rows) cost nothing to
  # take in: no figure this process has compiled beats the answer.
  for label in [label for label in estimates if label not in compiled]:
    known = run.compiled_before(label, run.policies[label])
    if known is not None:
      compiled[label] = known
  # No row of the answer's own table beats it: a candidate not compiled
  # that the estimate, calibrated on all that were, places ahead of the
  # answer (fitting, with fewer FLOPs or as many and a lower peak) is
  # compiled too, and the answer chosen again.
  while True:
    estimated = _estimated_candidates(estimates, compiled, budget)
    answer = run.best(budget, compiled, estimated)
    ahead = [c for c in estimated if c.fits and (
        not answer.fits or (c.flops, c.peak_bytes) < (answer.flops, answer.peak_bytes))]
    if not ahead:
      return answer
    label = min(ahead, key=lambda c: (c.flops, c.peak_bytes)).label
    run.say(0, None, f'verifying {label}')
    compiled[label] = run.evaluate(label, run.policies[label])


def _estimated_candidates(estimates, compiled, budget) -> list[Candidate]:
  """The candidates not compiled, by the estimate calibrated on all that
  were: a sharded program's figures per device, as the compiled ones are."""
  predict = calibrated(estimates, compiled)
  predict_flops = calibrated(estimates, compiled, flops=True)
  return [Candidate(label, round(predict(e.peak_bytes)), predict_flops(e.flops),
                    fits=predict(e.peak_bytes) <= budget, estimated=True)
          for label, e in estimates.items() if label not in compiled]


def _greedy_choice(run: _Runner, names, budget, builtins):
  """Saveable units, best FLOPs saved per byte first, while the peak fits.
  Returns the verified choice, if any, as {label: (costs, report)}."""
  base_costs, base_report = builtins['nothing_saveable']
  if base_costs.failed:
    return {}
  # The prediction is calibrated on the compiled built-ins (XLA does not
  # turn residual bytes into peak bytes one for one); the final choice is
  # verified by compiling it, dropping the last unit added until it fits.
  predict = _peak_model(builtins)
  chosen = greedy_units(run, base_report, names, lambda units: predict(
      run.report(policy_of(units)).residual_bytes_per_device) <= budget)
  while chosen:
    policy = policy_of(chosen, sites=user_sites(base_report, chosen))
    label = repr(policy)
    run.say(0, None, f'verifying {label}')
    costs, report = run.evaluate(label, policy)
    if not costs.failed and costs.peak_bytes <= budget:
      return {label: (costs, report)}
    chosen.pop()
  return {}


def _peak_model(builtins) -> Callable[[int], float]:
  """Compiled peak as a function of residual bytes: a least-squares line
  through the built-in policies' points, slope between 0 and 1."""
  points = [(r.residual_bytes_per_device, c.peak_bytes) for c, r in builtins.values()
            if not c.failed]
  xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
  slope = 1.0
  if len(points) > 1 and xs.var() > 0:
    slope = float(np.clip(np.cov(xs, ys, bias=True)[0, 1] / xs.var(), 0.0, 1.0))
  intercept = float(np.mean(ys - slope * xs))
  return lambda residual_bytes: intercept + slope * residual_bytes
