"""``search_policy``: the policy that fits a memory budget with fewest FLOPs.

JAX has no automatic policy. This search chooses which values to save, by
``checkpoint_name``, by primitive kind (matmuls, convolutions) and by
equation signature (``EquationSignature``: one recomputed computation, such
as one particular matmul), as a greedy knapsack: each choice is priced by
the analysis (the residual bytes it adds, the recompute FLOPs it removes),
which compiles nothing for a program on one device (for a sharded one it
compiles the forward pass to learn the residuals' shardings, and counts it),
and the result is verified by compiling it. The built-in
policies are compiled too and are candidates, so the answer never uses more
FLOPs than a built-in policy that fits the same budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from remat_explorer.analysis.analyze import analyze
from remat_explorer.analysis.compare import builtin_policies
from remat_explorer.analysis.compiled import CompiledCosts, compile_costs
from remat_explorer.analysis.context import compiles_run
from remat_explorer.analysis.report import RematReport, _plain, aval_text

# Primitive kinds whose outputs the search may choose to save: the costly
# ones to recompute. (XLA counts transcendentals as 0 FLOPs.)
_SAVEABLE_KINDS = ('dot_general', 'conv_general_dilated')

# At most this many equation signatures are priced, the ones whose
# recompute costs most first: each costs one analysis.
MAX_EQUATION_UNITS = 16


@dataclass(frozen=True, order=True)
class EquationSignature:
  """What a remat policy can know of one equation: its primitive, the types
  of its inputs and its parameters.

  JAX asks a policy about each first-order equation of a block as
  ``policy(primitive, *input_avals, **params)`` (``partial_eval_jaxpr_custom``,
  for ``jax.checkpoint`` and ours alike). The equation itself is not passed:
  not its output variables, not its source line, not its position. Nor does
  the order of the calls tell it: a split is cached and shared by every call
  of the same block body, so one call of the policy can stand for many
  equations. An equation can therefore not be singled out from inside a
  policy; the finest sound unit is its signature, and equations with the
  same signature (the same matmul in every layer of a stack of equal widths,
  say) are saved or recomputed together. The signature is built from values
  only (type strings, parameter reprs), so it is the same on every trace.
  """
  primitive: str
  inputs: tuple[str, ...]
  params: str

  @classmethod
  def of(cls, prim, avals, params) -> 'EquationSignature':
    return cls(prim.name, tuple(aval_text(a) for a in avals), _params_text(params))

  @classmethod
  def of_equation(cls, eqn) -> 'EquationSignature':
    return cls.of(eqn.primitive, [v.aval for v in eqn.invars], eqn.params)

  def __str__(self):
    return f"{self.primitive}({', '.join(self.inputs)})"


def _params_text(params) -> str:
  return ', '.join(f'{k}={_param_text(params[k])}' for k in sorted(params))


def _param_text(value) -> str:
  if isinstance(value, (tuple, list)):
    return '(' + ', '.join(map(_param_text, value)) + ')'
  if value is None or isinstance(value, (bool, int, float, str)):
    return repr(value)
  if callable(value) or hasattr(value, 'eqns') or hasattr(value, 'jaxpr'):
    return type(value).__name__  # sub-programs and functions: by kind only
  return repr(value)


@dataclass(frozen=True)
class SaveChosen:
  """Save the values named with these names, the outputs of these
  primitives and of equations with these signatures; recompute everything
  else. A plain policy: works with our ``checkpoint`` and with
  ``jax.checkpoint`` alike. See ``EquationSignature`` for why equations are
  chosen by signature."""
  names: frozenset[str] = frozenset()
  primitives: frozenset[str] = frozenset()
  equations: frozenset[EquationSignature] = frozenset()

  @property
  def checkpoint_names(self) -> frozenset[str]:
    """The names it refers to (its other strings are primitive names), for
    ``describe_policy`` and the unmatched-name warnings."""
    return self.names

  def __call__(self, prim, *avals, **params) -> bool:
    if prim.name == 'name':
      return params['name'] in self.names
    if prim.name in self.primitives:
      return True
    return bool(self.equations) and (
        EquationSignature.of(prim, avals, params) in self.equations)

  def __repr__(self):
    parts = [f"names={sorted(self.names)}"] if self.names else []
    parts += [f"primitives={sorted(self.primitives)}"] if self.primitives else []
    parts += ([f"equations=[{', '.join(map(str, sorted(self.equations)))}]"]
              if self.equations else [])
    return f"SaveChosen({', '.join(parts)})"


@dataclass(frozen=True)
class Candidate:
  label: str
  peak_bytes: int | None
  flops: int
  fits: bool
  compiled: bool


@dataclass(frozen=True)
class SearchResult:
  policy: Callable[..., Any] = field(repr=False)
  label: str
  budget_bytes: int
  peak_bytes: int
  """Compiled peak of the chosen policy (verified, not predicted); per
  device for a sharded program."""
  flops: int
  """Forward + backward FLOPs from the jaxpr of the chosen policy."""
  fits: bool
  """False only if nothing fits, not even ``nothing_saveable``."""
  compiles_used: int
  """XLA compiles this search ran, pricing included (which compiles the
  forward pass of a sharded program to learn its shardings); a result cached
  by an earlier call (of ``analyze``, ``compile_costs``, ``compare`` or the
  search itself) costs none."""
  candidates: tuple[Candidate, ...]
  costs: CompiledCosts = field(repr=False)
  report: RematReport = field(repr=False)

  def to_dict(self) -> dict:
    out = _plain(self)
    out['policy'] = repr(self.policy)
    out['costs'] = self.costs.to_dict()
    out['report'] = self.report.to_dict()
    return out


def search_policy(f, *args, memory_budget: int | float, argnums=0,
                  lowering: str | None = None,
                  progress: Callable[[int, int, str], None] | None = None,
                  **kwargs) -> SearchResult:
  """Find a policy whose compiled peak fits `memory_budget`, fewest FLOPs.

  `memory_budget`: bytes (an int), or a fraction between 0 and 1 of the way
  from ``nothing_saveable``'s compiled peak to ``everything_saveable``'s.
  For a sharded program the peak, the budget and the residual bytes that
  price each choice are per device.
  """
  run = _Runner(f, args, kwargs, argnums, lowering, progress)
  names = run.report(builtin_policies()['nothing_saveable']).names_in_program
  builtins = {label: run.evaluate(label, p)
              for label, p in builtin_policies(names).items()}
  budget = _resolve_budget(memory_budget, builtins)
  evaluated = dict(builtins)
  evaluated.update(_greedy_choice(run, names, budget, builtins))
  return run.best(budget, evaluated)


def _resolve_budget(memory_budget, builtins) -> int:
  if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float)):
    raise TypeError(f'memory_budget must be bytes (int) or a fraction (float), '
                    f'got {memory_budget!r}')
  if isinstance(memory_budget, int):
    if memory_budget <= 0:
      raise ValueError(f'memory_budget={memory_budget} bytes must be positive.')
    return memory_budget
  if not 0.0 <= memory_budget <= 1.0:
    raise ValueError(
        f'memory_budget={memory_budget} as a fraction must lie between 0 (the '
        'peak of nothing_saveable) and 1 (that of everything_saveable); pass '
        'an int for a budget in bytes.')
  low = builtins['nothing_saveable'][0].peak_bytes
  high = builtins['everything_saveable'][0].peak_bytes
  return int(low + memory_budget * (high - low))


class _Runner:
  """Evaluates policies (analysis + compile), each once, counting the
  compiles XLA really ran (not results found in ``compile_costs``' cache)."""

  def __init__(self, f, args, kwargs, argnums, lowering, progress):
    self.f, self.args, self.kwargs = f, args, kwargs
    self.argnums, self.lowering, self.progress = argnums, lowering, progress
    self.compiles_before = compiles_run()
    self.policies: dict[str, Any] = {}
    self._evaluated: dict[str, tuple[CompiledCosts, RematReport]] = {}

  def report(self, policy) -> RematReport:
    return analyze(self.f, *self.args, policy=policy, argnums=self.argnums,
                   lowering=self.lowering, **self.kwargs)

  def evaluate(self, label, policy) -> tuple[CompiledCosts, RematReport]:
    if label in self._evaluated:
      return self._evaluated[label]
    if self.progress is not None:
      self.progress(len(self._evaluated), len(self._evaluated) + 1, label)
    self.policies[label] = policy
    costs = compile_costs(self.f, *self.args, policy=policy, argnums=self.argnums,
                          lowering=self.lowering, **self.kwargs)
    self._evaluated[label] = costs, self.report(policy)
    return self._evaluated[label]

  def best(self, budget, evaluated) -> SearchResult:
    candidates = tuple(
        Candidate(label, c.peak_bytes, r.total_flops,
                  fits=not c.failed and c.peak_bytes <= budget, compiled=True)
        for label, (c, r) in evaluated.items())
    fitting = [c for c in candidates if c.fits]
    pool = fitting or [min(candidates, key=lambda c: c.peak_bytes or float('inf'))]
    chosen = min(pool, key=lambda c: (c.flops, c.peak_bytes))
    costs, report = evaluated[chosen.label]
    return SearchResult(
        policy=self.policies[chosen.label], label=chosen.label, budget_bytes=budget,
        peak_bytes=costs.peak_bytes, flops=report.total_flops, fits=bool(fitting),
        compiles_used=compiles_run() - self.compiles_before,
        candidates=candidates, costs=costs,
        report=report)


def _greedy_choice(run: _Runner, names, budget, builtins):
  """Saveable units, best FLOPs saved per byte first, while the peak fits.
  Returns the verified choice, if any, as {label: (costs, report)}."""
  base_costs, base_report = builtins['nothing_saveable']
  if base_costs.failed:
    return {}
  units = ([('name', n) for n in names] + [('primitive', p) for p in _SAVEABLE_KINDS]
           + [('equation', s) for s in _costliest_recomputed(base_report)])
  priced = []
  for unit in units:
    report = run.report(_policy_of([unit]))
    saved_flops = base_report.total_flops - report.total_flops
    added_bytes = report.residual_bytes_per_device - base_report.residual_bytes_per_device
    if saved_flops > 0:
      priced.append((saved_flops / max(added_bytes, 1), unit))
  priced.sort(key=lambda p: -p[0])

  # Add units best-first while the predicted peak fits. The prediction is
  # calibrated on the compiled built-ins (XLA does not turn residual bytes
  # into peak bytes one for one); the final choice is verified by compiling
  # it, dropping the last unit added until it fits.
  predict = _peak_model(builtins)
  chosen = []
  for _, unit in priced:
    trial = _policy_of([*chosen, unit])
    if predict(run.report(trial).residual_bytes_per_device) <= budget:
      chosen.append(unit)
  tried = {}
  while chosen:
    policy = _policy_of(chosen)
    label = f'search: {policy!r}'
    tried[label] = run.evaluate(label, policy)
    costs = tried[label][0]
    if not costs.failed and costs.peak_bytes <= budget:
      return {label: tried[label]}
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


def _costliest_recomputed(report: RematReport) -> list[EquationSignature]:
  """Signatures of the equations the blocks recompute, by the FLOPs their
  recompute costs in all (trip counts applied), costliest first, at most
  ``MAX_EQUATION_UNITS``. Equations recomputed inside a call of the staged
  half (``RecomputedEquation.inside``) are reached through their kind or
  name only."""
  flops: dict[EquationSignature, int] = {}
  for block in report.blocks:
    if not block.differentiated or block.staged_jaxpr is None:
      continue
    for e in block.recomputed:
      if e.index is None or e.flops <= 0:
        continue
      signature = EquationSignature.of_equation(block.staged_jaxpr.eqns[e.index])
      flops[signature] = flops.get(signature, 0) + e.flops * (block.trip_count or 1)
  ranked = sorted(flops, key=lambda s: (-flops[s], s))
  return ranked[:MAX_EQUATION_UNITS]


def _policy_of(units) -> SaveChosen:
  return SaveChosen(
      names=frozenset(v for kind, v in units if kind == 'name'),
      primitives=frozenset(v for kind, v in units if kind == 'primitive'),
      equations=frozenset(v for kind, v in units if kind == 'equation'))
