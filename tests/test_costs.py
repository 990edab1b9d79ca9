"""``compile_costs``, ``compare`` and ``search_policy``: XLA's own numbers."""

import base64
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer import examples
from remat_explorer.analysis import NO_REMAT, compare, compile_costs, describe_policy
from remat_explorer.analysis.search import search_policy

cp = rx.checkpoint_policies


def _mlp(num_layers=6, width=64, batch=32, seed=0, ck=rx.checkpoint, **ck_kwargs):
  keys = jax.random.split(jax.random.key(seed), num_layers + 1)
  ws = [jax.random.normal(k, (width, width)) / width ** 0.5 for k in keys[:-1]]
  x = jax.random.normal(keys[-1], (batch, width))
  layer = ck(lambda w, x: jnp.tanh(x @ w), **ck_kwargs)

  def mlp(ws, x):
    for w in ws:
      x = layer(w, x)
    return jnp.mean(x ** 2)
  return mlp, (ws, x)


@pytest.mark.parametrize('policy', [None, cp.dots_saveable, cp.everything_saveable], ids=describe_policy)
def test_compiled_memory_and_flops_equal_jax_checkpoint(policy):
  ours, args = _mlp(policy=policy)
  theirs, _ = _mlp(ck=jax.checkpoint, policy=policy)
  costs = compile_costs(ours, *args)
  compiled = jax.jit(jax.value_and_grad(theirs)).lower(*args).compile()
  memory = compiled.memory_analysis()
  assert costs.temp_bytes == memory.temp_size_in_bytes
  assert costs.argument_bytes == memory.argument_size_in_bytes
  assert costs.output_bytes == memory.output_size_in_bytes
  assert costs.xla_flops == pytest.approx(compiled.cost_analysis()['flops'], rel=0.01)
  assert costs.device_kind == jax.devices()[0].device_kind
  assert costs.compile_seconds > 0 and not costs.failed


def test_a_checkpointed_last_block_is_recomputed_in_the_compiled_step():
  """A training step computes the loss as well as its gradient, so the
  forward matmul of a checkpointed last block is live and its recompute is
  extra work; under ``grad`` alone XLA drops the forward copy as dead code
  and the step looks like no remat. ``lowering='cond'`` keeps XLA from
  merging the recompute with the forward copy (the CPU pipeline does merge
  it under the default barrier)."""
  rng = np.random.default_rng(7)
  n, d = (int(v) for v in rng.integers(8, 40, size=2))
  x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((d, d)), jnp.float32)
  f = lambda w: jnp.sum(rx.checkpoint(lambda w: jnp.tanh(x @ w))(w))
  remat = compile_costs(f, w, lowering='cond')
  plain = compile_costs(f, w, policy=NO_REMAT)
  assert remat.lowered_matmuls == plain.lowered_matmuls + 1
  assert remat.compiled_matmuls == plain.compiled_matmuls + 1
  assert remat.xla_flops - plain.xla_flops >= 2 * n * d * d
  # The loss is an output: a scalar beside the gradient.
  assert plain.output_bytes >= w.nbytes + 4


def test_every_figure_of_the_aot_api_is_recorded():
  """What ``measure`` records equals what ``memory_analysis()`` and
  ``cost_analysis()`` return for the same program, compiled again (XLA's
  compile is deterministic)."""
  from remat_explorer.analysis.compiled import measure
  program, (ws, x) = _mlp(num_layers=3, width=int(np.random.default_rng(3).integers(16, 64)),
                          seed=3, ck=jax.checkpoint)
  step = jax.value_and_grad(program)
  leaves = jax.tree_util.tree_leaves((ws, x))
  flat_step = lambda *leaves: step(*jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure((ws, x)), leaves))
  costs = measure(flat_step, leaves, function='mlp', policy='p', lowering='barrier')
  compiled = jax.jit(flat_step).lower(*leaves).compile()
  memory, cost = compiled.memory_analysis(), compiled.cost_analysis()
  numbers = {name: getattr(memory, name) for name in dir(memory)
             if not name.startswith('_') and isinstance(getattr(memory, name), int)}
  assert 'host_generated_code_size_in_bytes' in numbers
  assert costs.memory_analysis == numbers
  assert costs.host_generated_code_bytes == memory.host_generated_code_size_in_bytes
  assert costs.peak_memory_bytes == memory.peak_memory_in_bytes
  assert costs.buffer_assignment_proto == memory.serialized_buffer_assignment_proto
  assert costs.cost_analysis == cost and len(cost) > 3
  assert (costs.xla_flops, costs.bytes_accessed, costs.transcendentals) == (
      cost['flops'], cost['bytes accessed'], cost['transcendentals'])
  data = json.loads(json.dumps(costs.to_dict()))
  assert data['cost_analysis'] == cost and data['memory_analysis'] == numbers
  assert base64.b64decode(data['buffer_assignment_proto']) == costs.buffer_assignment_proto


def test_results_are_cached_and_run_when_asked():
  program, args = _mlp(seed=1)
  first = compile_costs(program, *args, repeats=2)
  assert compile_costs(program, *args, repeats=2) is first
  assert first.run_seconds > 0
  assert compile_costs(program, *args, policy=cp.dots_saveable, repeats=2) is not first
  assert json.loads(json.dumps(first.to_dict()))['temp_bytes'] == first.temp_bytes


def test_donated_arguments_show_as_aliased_memory():
  def step(params, x):
    return jnp.sum(jnp.tanh(x @ params['w']) ** 2)
  params = {'w': jax.random.normal(jax.random.key(2), (64, 64))}
  x = jax.random.normal(jax.random.key(3), (16, 64))
  plain = compile_costs(step, params, x)
  donated = compile_costs(step, params, x, donate_argnums=0, repeats=1)
  assert plain.alias_bytes == 0
  assert donated.alias_bytes == 64 * 64 * 4


def test_donate_argnums_are_checked_like_argnums():
  rng = np.random.default_rng(5)
  d = int(rng.integers(8, 48))
  step = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
  w = jnp.asarray(rng.standard_normal((d, d)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((4, d)), jnp.float32)
  with pytest.raises(ValueError, match=r'donate_argnums=\(5,\) is out of range for 2 positional'):
    compile_costs(step, w, x, donate_argnums=(5,))
  with pytest.raises(ValueError, match=r'donate_argnums=\(0, -3\) is out of range for 2'):
    compile_costs(step, w, x, donate_argnums=(0, -3))
  # A negative position counts from the end, as in jax.jit.
  assert compile_costs(step, w, x, donate_argnums=-2).alias_bytes == w.nbytes


def test_a_failed_compile_is_data_with_xla_message():
  program, args = _mlp(seed=4)
  costs = compile_costs(program, *args, compiler_options={'xla_no_such_option': True})
  assert costs.failed and 'xla_no_such_option' in costs.error
  assert costs.peak_bytes is None and costs.total_bytes is None


def test_timeline_peak_is_within_xla_accounting():
  loss_fn, args = examples.mlp(num_layers=4, width=128, batch=64)
  costs = compile_costs(loss_fn, *args)
  bound = costs.argument_bytes + costs.output_bytes + costs.temp_bytes
  assert costs.timeline is not None
  assert costs.timeline.peak_bytes <= bound
  assert costs.timeline.peak_bytes >= 0.95 * bound


def test_compare_covers_every_policy_with_a_pareto_front():
  loss_fn, args = examples.mlp(num_layers=3, width=32, batch=8)
  calls = []
  comparison = compare(loss_fn, *args, progress=lambda i, n, label: calls.append((i, n, label)))
  labels = [r.label for r in comparison.rows]
  assert labels[0] == 'no remat' and comparison.baseline.policy is NO_REMAT
  assert {'nothing_saveable', 'dots_saveable', 'everything_saveable'} <= set(labels)
  assert any(label.startswith('save_only_these_names(') for label in labels)
  assert [c[0] for c in calls] == list(range(len(labels) + 1))
  front = comparison.pareto_front
  assert front
  for r in comparison.rows:
    if r.report is None:
      continue
    dominated_by_front = any(
        f.peak_bytes <= r.peak_bytes and f.flops <= r.flops
        and (f.peak_bytes < r.peak_bytes or f.flops < r.flops)
        for f in front if f.flops is not None)
    assert r.on_pareto_front != dominated_by_front or r.on_pareto_front
  json.dumps(comparison.to_dict())


def test_recompute_merged_by_xla_is_flagged():
  """XLA may merge a barrier-protected recompute with the forward pass; the
  comparison says so whenever the optimized program lost matmuls that the
  policy asked to recompute (on the CPU: 23 dots lowered, 17 compiled)."""
  program, args = _mlp(num_layers=6)
  row = compare(program, *args, policies=['nothing_saveable', 'everything_saveable']).row(
      'nothing_saveable')
  merged = row.costs.lowered_matmuls - row.costs.compiled_matmuls
  recomputed = sum(1 for b in row.report.blocks for e in b.recomputed
                   if e.primitive == 'dot_general')
  assert recomputed == 6
  assert (row.recompute_eliminated is not None) == (merged > 0)
  if row.recompute_eliminated:
    assert 'recompute eliminated by the compiler' in row.recompute_eliminated


def test_compare_rejects_unknown_policy_names():
  program, args = _mlp(num_layers=2)
  with pytest.raises(ValueError, match="'dots_savable' is not a ready-made policy"):
    compare(program, *args, policies=['dots_savable'])


@pytest.fixture(scope='module')
def small_mlp():
  return examples.mlp(num_layers=4, width=48, batch=16)


@pytest.mark.parametrize('budget', [0.0, 0.3, 0.6, 1.0])
def test_search_never_loses_to_a_builtin_that_fits(small_mlp, budget):
  loss_fn, args = small_mlp
  result = search_policy(loss_fn, *args, memory_budget=budget)
  builtins = [c for c in result.candidates if not c.label.startswith('search')]
  assert len(builtins) >= 5
  assert result.fits and result.peak_bytes <= result.budget_bytes
  for c in builtins:
    if c.fits:
      assert result.flops <= c.flops, (c, result)
  assert result.compiles_used >= len(builtins)
  # The policy is a plain policy: JAX's checkpoint takes it too.
  grads = jax.grad(loss_fn)(*args)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  jax.tree_util.tree_map(close, grads, jax.grad(rx.checkpoint(loss_fn, policy=result.policy))(*args))
  jax.tree_util.tree_map(close, grads, jax.grad(jax.checkpoint(loss_fn, policy=result.policy))(*args))


def test_search_budget_errors():
  program, args = _mlp(num_layers=2)
  with pytest.raises(ValueError, match='between 0'):
    search_policy(program, *args, memory_budget=1.5)
  with pytest.raises(TypeError, match='memory_budget'):
    search_policy(program, *args, memory_budget='1GB')


def test_residual_buffers_at_the_peak_link_back_to_their_residuals():
  from remat_explorer.analysis import analyze, residuals_at_peak
  loss_fn, args = examples.mlp(num_layers=4, width=64, batch=16)
  found = residuals_at_peak(analyze(loss_fn, *args), compile_costs(loss_fn, *args))
  assert found and all(p.residual is not None for p in found)
  biggest = found[0]
  # The layer inputs saved by the scan, stacked: [layers, batch, width].
  assert biggest.bytes == 4 * 16 * 64 * 4 == biggest.residual.bytes
  assert biggest.residual.primitive == 'scan'
  assert biggest.policy == 'nothing_saveable (default)'
