"""FLOP counts of jaxprs, by XLA's conventions, with loop trip counts applied.

Counts follow XLA's ``HloCostAnalysis`` (``compiled.cost_analysis()``) so the
two can be shown side by side: dots are 2 x output x contracting size; convs
count only kernel taps that read real input (not padding or dilation holes);
elementwise ops 1 per element, transcendentals 0 FLOPs and 1 in
``transcendentals``; ops XLA expands into polynomials (logistic, erf_inv, ...)
what its CPU float32 expansion costs; reductions input - output elements,
argmax/argmin 9 per reduced float (7 per integer); ``sort`` n ceil(log2 n);
``cond`` the max over branches; ``while`` its body and cond once; unused
results nothing. Data movement is free.

Where this count intentionally differs from XLA's:

* ``scan`` multiplies its body by ``length``; XLA runs it as a while loop and
  counts the body once (plus 2 for the loop counter).
* ``shard_map`` multiplies its per-device body by the number of shards, to
  count the whole program; XLA reports one device's share.
* We count the jaxpr as written, XLA the optimized HLO. Fusion leaves XLA's
  count alone, but simplification does not: ``x * 1``, constant folding (say,
  of index arithmetic on constant indices), CSE, dead code inside calls.
* Backend rewrites we skip: XLA's CPU backend splits a reduction along an
  axis longer than 32 into a padded tree when the input has at most 4096
  elements (up to 31 extra per row), and adds converts around bfloat16 dots.
  Cumulative ops are the exception: their blocked rewrite is modelled, since
  the quadratic reduce-window JAX emits would be far off.
* Not counted (0, with a note): random bits, linear algebra, FFT, callbacks,
  and other primitives we do not know.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import jax.numpy as jnp
from jax.extend.core import (ClosedJaxpr, Jaxpr, JaxprEqn, Var,
                             jaxprs_in_params)

from remat_explorer.analysis.source.origins import CALL_PRIMITIVES


@dataclass(frozen=True)
class EquationFlops:
  """The cost of one top-level equation of a jaxpr."""
  index: int
  primitive: str
  flops: int
  trip_count: int | None
  note: str
  transcendentals: int = 0


@dataclass(frozen=True, slots=True)
class _Cost:
  flops: int = 0
  transcendentals: int = 0

  def __add__(self, other: _Cost) -> _Cost:
    return _Cost(self.flops + other.flops,
                 self.transcendentals + other.transcendentals)

  def times(self, n: int) -> _Cost:
    return _Cost(self.flops * n, self.transcendentals * n)


# (flops, transcendentals) per output element.
_PER_ELEMENT: dict[str, tuple[int, int]] = {
    **dict.fromkeys('''
      add add_any sub mul div rem max min neg abs sign floor ceil round square
      is_finite clamp eq ne lt le gt ge eq_to le_to lt_to and or xor not
      shift_left shift_right_logical shift_right_arithmetic population_count
      clz reduce_precision psum psum_invariant pmax pmin'''.split(), (1, 0)),
    **dict.fromkeys('''
      exp log log1p expm1 pow sqrt rsqrt cbrt tanh sin cos tan atan atan2
      erf'''.split(), (0, 1)),
    **dict.fromkeys('''
      reshape broadcast_in_dim transpose slice dynamic_slice
      dynamic_update_slice concatenate gather scatter squeeze expand_dims pad
      iota copy copy_p rev optimization_barrier name stop_gradient real imag
      complex conj split bitcast_convert_type device_put sharding_constraint
      mesh_cast reshard pvary all_gather all_to_all ppermute axis_index
      random_wrap random_unwrap create_token after_all'''.split(), (0, 0)),
    # Expanded by XLA; measured on CPU for float32.
    'logistic': (3, 1), 'exp2': (1, 1), 'asin': (5, 2), 'acos': (3, 2),
    'sinh': (10, 3), 'cosh': (3, 2), 'asinh': (11, 3), 'acosh': (7, 4),
    'atanh': (6, 2), 'erf_inv': (37, 2), 'erfc': (60, 1), 'lgamma': (52, 4),
    'digamma': (73, 3), 'bessel_i0e': (83, 1), 'bessel_i1e': (83, 1),
    'nextafter': (23, 0),
    # JAX 0.11's 1 - x**2 (tanh's derivative), lowered as (1 + x) * (1 - x).
    'one_minus_square': (3, 0),
}
_FREE = _Cost()
_SCAN_BLOCK = 16  # the base length of XLA's ReduceWindowRewriter on CPU


def _size(atom) -> int:
  return math.prod(getattr(atom.aval, 'shape', ()))


def _out_size(eqn: JaxprEqn) -> int:
  return sum(_size(v) for v in eqn.outvars)


def _reduced_size(eqn: JaxprEqn) -> int:
  return _size(eqn.invars[0]) - _out_size(eqn)


def _dot_general(eqn: JaxprEqn) -> int:
  (lhs_contract, _), _ = eqn.params['dimension_numbers']
  lhs_shape = eqn.invars[0].aval.shape
  return 2 * _out_size(eqn) * math.prod(lhs_shape[d] for d in lhs_contract)


def _valid_positions(n_in: int, n_kernel: int, n_out: int, stride: int,
                     pad_low: int, lhs_dil: int, rhs_dil: int) -> int:
  """(output, kernel) index pairs of one spatial dim that read a real input."""
  count = 0
  for k in range(n_kernel):
    for o in range(n_out):
      dilated = o * stride - pad_low + k * rhs_dil
      count += dilated % lhs_dil == 0 and 0 <= dilated // lhs_dil < n_in
  return count


def _conv(eqn: JaxprEqn) -> int:
  p = eqn.params
  lhs_spec, rhs_spec, out_spec = p['dimension_numbers']
  lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
  out = eqn.outvars[0].aval.shape
  positions = math.prod(
      _valid_positions(lhs[li], rhs[ri], out[oi], stride, pad_low, ld, rd)
      for li, ri, oi, stride, (pad_low, _), ld, rd in zip(
          lhs_spec[2:], rhs_spec[2:], out_spec[2:], p['window_strides'],
          p['padding'], p['lhs_dilation'], p['rhs_dilation']))
  fmas = ((lhs[lhs_spec[1]] // p['feature_group_count']) * out[out_spec[1]]
          * (lhs[lhs_spec[0]] // p['batch_group_count']) * positions)
  return 2 * fmas


def _integer_pow(eqn: JaxprEqn) -> int:
  # JAX lowers x**y to square-and-multiply, then 1/acc for negative y.
  y = eqn.params['y']
  n = abs(y)
  muls = n.bit_length() + bin(n).count('1') - 2 if n > 1 else 0
  return (muls + (y < 0)) * _out_size(eqn)


def _select_n(eqn: JaxprEqn) -> int:
  # An integer `which` is lowered to a tree of compare-and-selects.
  which, *cases = eqn.invars
  per_element = 1 if which.aval.dtype == jnp.bool_ else 2 * (len(cases) - 1)
  return per_element * _out_size(eqn)


def _convert(eqn: JaxprEqn) -> int:
  same = eqn.invars[0].aval.dtype == eqn.outvars[0].aval.dtype
  return 0 if same else _out_size(eqn)


def _arg_reduce(eqn: JaxprEqn) -> int:
  # The comparator: the NaN check is what floats add over integers.
  is_float = jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.inexact)
  return _reduced_size(eqn) * (9 if is_float else 7)


def _prefix_scan(n: int, top: bool = True) -> int:
  """FLOPs of XLA's reduce-window prefix scan of one column of n elements."""
  if n <= _SCAN_BLOCK:
    return n * (n - 1) if top else n * n - 1
  blocks = -(-n // _SCAN_BLOCK)
  return blocks * _SCAN_BLOCK * _SCAN_BLOCK + _prefix_scan(blocks, False)


def _cumulative(eqn: JaxprEqn) -> int:
  n = eqn.invars[0].aval.shape[eqn.params['axis']]
  return _size(eqn.invars[0]) // max(n, 1) * _prefix_scan(n)


def _reduce_window(eqn: JaxprEqn) -> int:
  return _out_size(eqn) * (math.prod(eqn.params['window_dimensions']) - 1)


def _sort(eqn: JaxprEqn) -> int:
  n = _size(eqn.invars[0])
  return n * (n - 1).bit_length()


_RULES: dict[str, Callable[[JaxprEqn], int]] = {
    'dot_general': _dot_general, 'conv_general_dilated': _conv,
    'integer_pow': _integer_pow, 'select_n': _select_n,
    'convert_element_type': _convert, 'argmax': _arg_reduce,
    'argmin': _arg_reduce, 'sort': _sort,
    **dict.fromkeys(('reduce_sum reduce_max reduce_min reduce_prod reduce_and '
                     'reduce_or reduce_xor').split(), _reduced_size),
    **dict.fromkeys('cumsum cumprod cummax cummin cumlogsumexp'.split(),
                    _cumulative),
    **dict.fromkeys('reduce_window_sum reduce_window_max reduce_window_min'
                    .split(), _reduce_window),
    # Combining scatters cost one op per update; plain `scatter` is free.
    **dict.fromkeys('scatter-add scatter-mul scatter-min scatter-max'.split(),
                    lambda eqn: _size(eqn.invars[2])),
}


def _as_jaxpr(jaxpr: Jaxpr | ClosedJaxpr) -> Jaxpr:
  return jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr


def live_equations(jaxpr: Jaxpr) -> list[bool]:
  """Which equations feed an output or have effects; XLA drops the rest."""
  used = {v for v in jaxpr.outvars if isinstance(v, Var)}
  live = []
  for eqn in reversed(jaxpr.eqns):
    live.append(bool(eqn.effects) or not used.isdisjoint(eqn.outvars))
    if live[-1]:
      used.update(v for v in eqn.invars if isinstance(v, Var))
  return live[::-1]


def _costs(jaxpr: Jaxpr | ClosedJaxpr
           ) -> Iterator[tuple[JaxprEqn, _Cost, int | None, str]]:
  """(equation, cost, trip count, note) for each equation of `jaxpr`."""
  jaxpr = _as_jaxpr(jaxpr)
  for eqn, live in zip(jaxpr.eqns, live_equations(jaxpr)):
    if live:
      yield (eqn, *_eqn_cost(eqn))
    else:
      yield eqn, _Cost(), None, 'dead code: XLA removes it'


def _jaxpr_cost(jaxpr: Jaxpr | ClosedJaxpr) -> _Cost:
  # Summed as plain numbers, not `_Cost`s: an estimate sums every equation
  # of the step.
  jaxpr = _as_jaxpr(jaxpr)
  flops = transcendentals = 0
  for eqn, live in zip(jaxpr.eqns, live_equations(jaxpr)):
    if live:
      cost = _eqn_cost(eqn)[0]
      flops += cost.flops
      transcendentals += cost.transcendentals
  return _Cost(flops, transcendentals)


def _shard_count(eqn: JaxprEqn) -> int:
  mesh_shape = dict(eqn.params['mesh'].shape)
  manual = eqn.params.get('newly_manual_axes') or mesh_shape
  return math.prod(mesh_shape[axis] for axis in manual)


def _eqn_cost(eqn: JaxprEqn) -> tuple[_Cost, int | None, str]:
  """(cost, trip count, note) of one equation, sub-jaxprs included."""
  name, params = eqn.primitive.name, eqn.params
  if name in _RULES:
    return _Cost(_RULES[name](eqn)), None, ''
  if name in _PER_ELEMENT:
    flops, transcendentals = _PER_ELEMENT[name]
    if not (flops or transcendentals):
      return _FREE, None, ''
    n = _out_size(eqn)
    return _Cost(flops * n, transcendentals * n), None, ''
  if name == 'scan':
    length = params['length']
    return (_jaxpr_cost(params['jaxpr']).times(length), length,
            f'body x {length}')
  if name == 'while':
    cost = _jaxpr_cost(params['body_jaxpr']) + _jaxpr_cost(params['cond_jaxpr'])
    return cost, None, 'trip count unknown: body and cond counted once'
  if name == 'cond':
    costs = [_jaxpr_cost(b) for b in params['branches']]
    cost = _Cost(max(c.flops for c in costs),
                 max(c.transcendentals for c in costs))
    return cost, None, f'max over {len(costs)} branches'
  if name == 'shard_map':
    shards = _shard_count(eqn)
    return (_jaxpr_cost(params['jaxpr']).times(shards), None,
            f'per-shard body x {shards} shards')
  subjaxprs = list(jaxprs_in_params(params))
  cost = sum((_jaxpr_cost(j) for j in subjaxprs), _Cost())
  if name in CALL_PRIMITIVES:
    return cost, None, ''
  if subjaxprs:
    return cost, None, 'unknown primitive: its sub-jaxprs counted once'
  return cost, None, 'not counted'


def eqn_flops(eqn: JaxprEqn) -> int:
  """FLOPs of one equation, sub-jaxprs included (with trip counts)."""
  return _eqn_cost(eqn)[0].flops


def jaxpr_flops(jaxpr: Jaxpr | ClosedJaxpr) -> int:
  """Total FLOPs of a jaxpr (open or closed)."""
  return _jaxpr_cost(jaxpr).flops


def jaxpr_transcendentals(jaxpr: Jaxpr | ClosedJaxpr) -> int:
  """Total transcendental ops of a jaxpr (open or closed)."""
  return _jaxpr_cost(jaxpr).transcendentals


def flops_by_equation(jaxpr: Jaxpr | ClosedJaxpr) -> list[EquationFlops]:
  """The cost of each top-level equation, in order."""
  return [EquationFlops(index, eqn.primitive.name, cost.flops, trip_count,
                        note, cost.transcendentals)
          for index, (eqn, cost, trip_count, note) in enumerate(_costs(jaxpr))]


def has_unknown_trip_counts(jaxpr: Jaxpr | ClosedJaxpr) -> bool:
  """Whether a while loop, whose trip count is not static, occurs anywhere."""
  return any(
      eqn.primitive.name == 'while'
      or any(has_unknown_trip_counts(j) for j in jaxprs_in_params(eqn.params))
      for eqn in _as_jaxpr(jaxpr).eqns)
