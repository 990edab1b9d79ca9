"""The FLOPs a compiled program executes, each loop's body once per trip:
XLA's own count where there is no loop, the unrolled program's count where
a scan is rolled, and loops XLA cannot count named, not ranked."""

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_explorer import examples
from remat_explorer.analysis import compare, compile_costs


def _ode(n, rng_seed=0, width=64, batch=32):
  rng = np.random.default_rng(rng_seed)
  w = jnp.asarray(rng.standard_normal((width, width)) / width ** 0.5, jnp.float32)
  h0 = jnp.asarray(rng.standard_normal((batch, width)), jnp.float32)
  step = lambda h: h + 0.05 * jnp.tanh(h @ w)
  return w, h0, step


def _scan_loss(n, *, unroll=1, checkpoint=False):
  def loss(w, h0):
    def body(h, _):
      return h + 0.05 * jnp.tanh(h @ w), None
    body = jax.checkpoint(body) if checkpoint else body
    h, _ = jax.lax.scan(body, h0, None, length=n, unroll=unroll)
    return jnp.sum(h ** 2)
  return loss


def _checkpointed_stack(seed, layers, width, batch):
  """`layers` checkpointed tanh(x @ w) layers, unrolled."""
  rng = np.random.default_rng(seed)
  ws = [jnp.asarray(rng.standard_normal((width, width)) / width ** 0.5, jnp.float32)
        for _ in range(layers)]
  x = jnp.asarray(rng.standard_normal((batch, width)), jnp.float32)

  def loss(ws, x):
    for w in ws:
      x = jax.checkpoint(lambda x, w: jnp.tanh(x @ w))(x, w)
    return jnp.sum(x ** 2)
  return loss, (ws, x)


@pytest.mark.parametrize('policy', [None, 'nothing_saveable', 'dots_saveable'])
def test_a_program_without_loops_executes_what_xla_counts(policy):
  loss_fn, args = examples.transformer(num_layers=2, d_model=32, seq_len=16, batch=2,
                                       use_scan=False)
  costs = compile_costs(loss_fn, *args, policy=policy)
  assert costs.executed_flops == costs.xla_flops > 0
  assert costs.loops_of_unknown_trip_count == 0


def test_a_rolled_scan_executes_what_its_unrolled_program_does():
  n = 48
  w, h0, _ = _ode(n)
  rolled = compile_costs(_scan_loss(n), w, h0)
  unrolled = compile_costs(_scan_loss(n, unroll=n), w, h0)
  # XLA's cost_analysis counts the rolled program's loop bodies once...
  assert rolled.xla_flops < unrolled.xla_flops / 10
  # ...the executed count runs them n times: the unrolled program's count.
  assert rolled.executed_flops == pytest.approx(unrolled.executed_flops, rel=0.02)
  assert unrolled.executed_flops == unrolled.xla_flops


@pytest.mark.parametrize('policy', ['nothing_saveable', 'dots_saveable'])
def test_a_scanned_transformer_executes_what_its_unrolled_twin_does(policy):
  """The same numbers stacked under a scan or unrolled by a Python loop;
  under the cond lowering XLA keeps the recompute of both."""
  executed = []
  for use_scan in (True, False):
    loss_fn, args = examples.transformer(num_layers=4, d_model=32, seq_len=16, batch=2,
                                         use_scan=use_scan)
    executed.append(compile_costs(loss_fn, *args, policy=policy, lowering='cond'
                                  ).executed_flops)
  assert executed[0] == pytest.approx(executed[1], rel=0.02)


def test_a_checkpointed_scan_executes_its_recompute():
  """scan(checkpoint(step)) runs each step's forward once more than
  lax.scan: the difference is n steps' worth of FLOPs, as XLA counts a step."""
  n = 40
  w, h0, step = _ode(n)
  plain = compile_costs(_scan_loss(n), w, h0)
  remat = compile_costs(_scan_loss(n, checkpoint=True), w, h0)
  one_step = jax.jit(step).lower(h0).compile().cost_analysis()['flops']
  assert remat.executed_flops - plain.executed_flops == pytest.approx(n * one_step, rel=0.02)


def test_a_loop_of_unknown_trip_count_is_named_and_left_off_the_front():
  n = 32
  w, h0, _ = _ode(n)

  def equinox_loss(w, h0):
    body = lambda c: (c[0] + 1, c[1] + 0.05 * jnp.tanh(c[1] @ w))
    _, h = eqxi.while_loop(lambda c: c[0] < n, body, (0, h0), max_steps=n,
                           kind='checkpointed', checkpoints=4)
    return jnp.sum(h ** 2)

  comparison = compare({'lax.scan': _scan_loss(n), 'equinox': equinox_loss}, w, h0)
  loop = comparison.row('equinox')
  assert loop.costs.loops_of_unknown_trip_count > 0 and loop.flops_unknown
  assert loop.ranked_flops is None and not loop.on_pareto_front
  assert any(w.startswith('FLOPs unknown') for w in loop.warnings)
  assert any(w.startswith('equinox: FLOPs unknown') for w in comparison.warnings)
  scan_row = comparison.row('lax.scan')
  assert scan_row.on_pareto_front and not scan_row.flops_unknown
  assert scan_row.ranked_flops == scan_row.compiled_flops > scan_row.xla_flops


def test_the_front_ranks_by_what_the_compiled_program_executes():
  """JAX 0.10's XLA:CPU merges a straight-line recompute with the forward
  pass: the jaxpr asks nothing_saveable for more FLOPs than no remat, the
  compiled programs execute the same (0.11's keeps the recompute, and
  executes what the jaxpr asks). The front follows the compiled count."""
  loss, (ws, x) = _checkpointed_stack(seed=3, layers=6, width=128, batch=64)
  comparison = compare(loss, ws, x, policies=['nothing_saveable'])
  nothing, baseline = comparison.row('nothing_saveable'), comparison.baseline
  assert nothing.flops > baseline.flops  # what the jaxpr asks for
  if nothing.recompute_eliminated is not None:  # what runs
    assert nothing.compiled_flops == baseline.compiled_flops
  else:
    assert nothing.compiled_flops == pytest.approx(
        baseline.compiled_flops + nothing.recompute_flops, rel=0.01)
  usable = [r for r in comparison.rows if not r.failed]
  for r in usable:
    dominated = any(o.peak_bytes <= r.peak_bytes and o.compiled_flops <= r.compiled_flops
                    and (o.peak_bytes, o.compiled_flops) != (r.peak_bytes, r.compiled_flops)
                    for o in usable)
    assert r.on_pareto_front == (not dominated), r.label


def test_a_conditional_in_a_loop_is_a_range_and_says_so():
  """XLA counts a conditional at its costliest branch; which branch runs is
  decided as the program runs, so the count is a range, each end XLA's."""
  rng = np.random.default_rng(5)
  w = jnp.asarray(rng.standard_normal((128, 128)) / 12, jnp.float32)
  x = jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)
  trips = 10

  def loss(w, x):
    def body(c, i):
      heavy = lambda c: jnp.tanh(c @ w)
      return jax.lax.cond(i % 5 == 0, heavy, lambda c: c * 1.5, c), None
    return jnp.sum(jax.lax.scan(body, x, jnp.arange(trips))[0] ** 2)

  comparison = compare({'cond in a loop': loss}, w, x)
  row = comparison.row('cond in a loop')
  low, high = row.costs.executed_flops_low, row.compiled_flops
  matmul = 2 * 64 * 128 * 128
  # Forward and backward, every trip: the matmul branch (and its transpose)
  # counts in the high end only.
  assert high - low >= 2 * trips * matmul
  assert low < 2 * matmul and high > 2 * trips * matmul
  assert any(w.startswith('FLOPs between') for w in row.warnings)


@pytest.mark.parametrize('lowering', ['cond', 'while'])
def test_a_recompute_guard_is_counted_as_the_recompute_it_always_runs(lowering):
  """The cond and while lowerings hide the recompute behind a predicate
  that is always true and a trip count that is always one, opaque to XLA
  by design. They are counted as exactly that: one run of the recompute, no
  range, no loop of unknown trip count. Without loops of the user's own,
  that is XLA's own count of the program."""
  loss, (ws, x) = _checkpointed_stack(1729,
                                       layers=3, width=96, batch=32)
  comparison = compare(loss, ws, x, lowering=lowering, policies=['nothing_saveable'])
  row = comparison.row('nothing_saveable')
  assert row.costs.executed_flops == row.costs.executed_flops_low == row.costs.xla_flops
  assert row.costs.loops_of_unknown_trip_count == 0 and not row.flops_unknown
  assert not any(w.startswith('FLOPs') for w in row.warnings)
  if lowering == 'cond':
    # XLA keeps the guarded recompute: each layer's matmul runs once more.
    matmul = 2 * 32 * 96 * 96
    assert row.compiled_flops - comparison.baseline.compiled_flops >= 3 * matmul


def test_the_binomial_loop_counts_each_turn_once():
  """The binomial loop's backward pass reverses a step on n - 1 of its
  turns and only advances on the others; the engine says so, so its FLOPs
  are exact, not a range: beyond lax.scan's, one step's forward per turn,
  whatever n and s (counting every turn at its costliest branch would add
  a VJP for each of the turns that only advance)."""
  from remat_explorer import checkpointed_scan
  from remat_explorer.engine import revolve
  w, h0, step = _ode(0, rng_seed=4093)

  def binomial_loss(n, s):
    def loss(w, h0):
      body = lambda h, _: (h + 0.05 * jnp.tanh(h @ w), None)
      h, _ = checkpointed_scan(body, h0, None, length=n, schedule=('binomial', s))
      return jnp.sum(h ** 2)
    return loss

  per_turn = []
  for n, s in [(20, 3), (20, 5), (57, 3)]:
    plain = compile_costs(_scan_loss(n), w, h0)
    binomial = compile_costs(binomial_loss(n, s), w, h0)
    assert binomial.executed_flops == binomial.executed_flops_low
    per_turn.append((binomial.executed_flops - plain.executed_flops)
                    / revolve.backward_turns(n, s))
  # The same per turn whatever n and s, to within the turn's bookkeeping...
  assert max(per_turn) - min(per_turn) < 2 * h0.size
  # ...one step's forward, and the turn's bookkeeping: elementwise on the
  # carry (selecting it, masking a snapshot's store), a few carries' worth.
  one_step = jax.jit(step).lower(h0).compile().cost_analysis()['flops']
  assert one_step < per_turn[0] < one_step + 8 * h0.size
