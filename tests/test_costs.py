"""``compile_costs``, ``compare`` and ``search_policy``: XLA's own numbers."""

import base64
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer import examples
from remat_explorer.analysis import (NO_REMAT, analyze, builtin_policies, compare, compile_costs,
                                     describe_policy, residuals_at_peak)
from remat_explorer.analysis.tradeoffs.search import search_policy
from remat_explorer.viz.charts.timeline_view import forward_backward_boundary
from remat_explorer.viz.text import format_bytes
from tests.by_hand import allocated_bytes

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
  """What a compile records equals what ``memory_analysis()`` and
  ``cost_analysis()`` return for the same program, compiled again (XLA's
  compile is deterministic)."""
  from remat_explorer.analysis.xla.compiled import start_step_compile
  program, (ws, x) = _mlp(num_layers=3, width=int(np.random.default_rng(3).integers(16, 64)),
                          seed=3, ck=jax.checkpoint)
  step = jax.value_and_grad(program)
  leaves = jax.tree_util.tree_leaves((ws, x))
  flat_step = lambda *leaves: step(*jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure((ws, x)), leaves))
  costs, _ = start_step_compile(flat_step, leaves, function='mlp', policy='p',
                                lowering='barrier').finish()
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
  assert costs.timeline is not None
  if costs.platform == 'gpu':
    # On GPUs peak_memory_in_bytes is XLA's peak of the buffers live at
    # once along the schedule, temporaries included: the quantity the
    # timeline models (on the CPU it leaves temporaries out).
    assert costs.timeline.peak_bytes == pytest.approx(costs.peak_memory_bytes, rel=0.02)
    assert costs.peak_bytes == costs.peak_memory_bytes
    return
  bound = costs.argument_bytes + costs.output_bytes + costs.temp_bytes
  assert costs.timeline.peak_bytes <= bound
  assert costs.timeline.peak_bytes >= 0.95 * bound


def test_compare_covers_every_policy_with_a_pareto_front():
  loss_fn, args = examples.mlp(num_layers=3, width=32, batch=8)
  calls = []
  comparison = compare(loss_fn, *args, progress=lambda i, n, label: calls.append((i, n, label)))
  labels = [r.label for r in comparison.rows]
  assert labels[:2] == ['as written', 'no remat'] and comparison.baseline.policy is NO_REMAT
  assert comparison.row('as written').policy is None
  assert {'nothing_saveable', 'dots_saveable', 'everything_saveable'} <= set(labels)
  assert any(label.startswith('save_only_these_names(') for label in labels)
  # Progress counts the policies done, whichever finishes first.
  assert sorted(c[0] for c in calls) == list(range(1, len(labels) + 1))
  assert {c[1] for c in calls} == {len(labels)} and {c[2] for c in calls} == set(labels)
  assert comparison.pareto_front
  # The whole comparison is plain data that survives JSON, row for row.
  data = json.loads(json.dumps(comparison.to_dict()))
  assert [(r['label'], r['on_pareto_front'], r['peak_bytes']) for r in data['rows']] == [
      (r.label, r.on_pareto_front, r.peak_bytes) for r in comparison.rows]


def test_the_pareto_front_leaves_out_a_program_known_to_be_dominated():
  """Three programs whose order is known before compiling: `plain`; the
  same checkpointed (its wide hidden layers recomputed: less memory, more
  FLOPs; ``lowering='cond'`` keeps XLA from merging the recompute away);
  and `plain` plus a term on a wider copy of its input (more memory and
  more FLOPs). The last is dominated by `plain`, the other two are not.
  XLA's own figures for each program, compiled here by hand, confirm the
  premises."""
  rng = np.random.default_rng(1004)
  d, batch = (int(v) for v in rng.integers(12, 20, size=2))
  ws = [jnp.asarray(rng.standard_normal((d, 4 * d)) / d ** 0.5, jnp.float32) for _ in range(4)]
  x = jnp.asarray(rng.standard_normal((4 * batch, d)), jnp.float32)
  block = lambda w, x: jnp.tanh(jnp.tanh(x @ w) @ w.T)

  def network(layer):
    def loss(ws, x):
      for w in ws:
        x = layer(w, x)
      return jnp.mean(x ** 2)
    return loss
  plain = network(block)

  def wasteful(ws, x):
    wide = jnp.tile(x, (1, 8)) @ jnp.tile(ws[0], (8, 8))
    return plain(ws, x) + 1e-3 * jnp.mean(jnp.tanh(wide))
  programs = {'plain': plain, 'checkpointed': network(rx.checkpoint(block, lowering='cond')),
              'wasteful': wasteful}
  by_hand = {}
  for label, program in programs.items():
    compiled = jax.jit(jax.value_and_grad(program)).lower(ws, x).compile()
    memory = compiled.memory_analysis()
    by_hand[label] = (allocated_bytes(memory), compiled.cost_analysis()['flops'])
  (plain_bytes, plain_flops), (ck_bytes, ck_flops), (waste_bytes, waste_flops) = (
      by_hand[k] for k in programs)
  assert ck_bytes < plain_bytes < waste_bytes and plain_flops < min(ck_flops, waste_flops)
  comparison = compare(programs, ws, x)
  assert {r.label: r.on_pareto_front for r in comparison.rows} == {
      'plain': True, 'checkpointed': True, 'wasteful': False}
  assert [r.label for r in comparison.pareto_front] == ['plain', 'checkpointed']


def test_recompute_merged_by_xla_is_flagged():
  """XLA may merge a barrier-protected recompute with the forward pass; the
  comparison says so whenever the optimized program lost matmuls that the
  policy asked to recompute. Whether XLA merged it is read here from JAX's
  own ``jax.checkpoint`` of the same program, compiled by hand: merged when
  its step compiles to no more matmuls than the step without remat. On the
  CPU it does for an unrolled 6-layer MLP under nothing_saveable."""
  layers, seed = 6, int(np.random.default_rng(1001).integers(1 << 16))
  program, args = _mlp(num_layers=layers, seed=seed)
  calls = []
  comparison = compare(program, *args, policies=['nothing_saveable', 'everything_saveable'],
                       progress=lambda i, n, label: calls.append((i, n, label)))
  row = comparison.row('nothing_saveable')
  theirs, _ = _mlp(num_layers=layers, seed=seed, ck=jax.checkpoint, policy=cp.nothing_saveable)
  plain, _ = _mlp(num_layers=layers, seed=seed, ck=lambda f: f)
  lowered = jax.jit(jax.value_and_grad(theirs)).lower(*args)
  dots_lowered = lowered.as_text().count('stablehlo.dot_general')
  dots = lambda text: sum(1 for line in text.splitlines() if ' dot(' in line)
  dots_compiled = dots(lowered.compile().as_text())
  dots_plain = dots(jax.jit(jax.value_and_grad(plain)).lower(*args).compile().as_text())
  merged = dots_compiled <= dots_plain < dots_lowered
  if jax.default_backend() == 'cpu' and jax.__version_info__ < (0, 11):
    assert merged  # JAX 0.11's XLA:CPU keeps it: the flag's other side
  # Each layer's matmul is recomputed; the counts are JAX's program's.
  recomputed = sum(1 for b in row.report.blocks for e in b.recomputed
                   if e.primitive == 'dot_general')
  assert recomputed == layers
  assert (row.costs.lowered_matmuls, row.costs.compiled_matmuls) == (dots_lowered,
                                                                     dots_compiled)
  assert (row.recompute_eliminated is not None) == merged
  if merged:  # the flag gives the counts it was decided on
    assert f'recompute {layers} matmul(s)' in row.recompute_eliminated
    assert (f'has {dots_lowered}, the optimized one {dots_compiled}'
            in row.recompute_eliminated)
  # Saving everything recomputes nothing: nothing to flag.
  assert comparison.row('everything_saveable').recompute_eliminated is None
  # Beside it, the lowering that keeps the recompute, measured: XLA cannot
  # merge across a conditional, so its peak is what the policy promised,
  # lower than this row's.
  if merged:
    kept = row.kept_recompute
    assert kept is not None and kept.lowering == 'cond'
    under_cond = compile_costs(program, *args, policy=cp.nothing_saveable, lowering='cond')
    assert kept.peak_bytes == under_cond.peak_bytes < row.peak_bytes
    assert any("lowering='cond' keeps the recompute" in w
               and format_bytes(kept.peak_bytes) in w for w in row.warnings)
  # Progress counts the rows up to all of them, its total fixed from the
  # start; the lowering compiled besides a row is told as it lands.
  rows = [c for c in calls if ' · lowering ' not in c[2]]
  assert [c[0] for c in rows] == list(range(1, len(comparison.rows) + 1))
  assert {c[1] for c in calls} == {len(comparison.rows)}
  assert (("nothing_saveable · lowering cond" in {c[2] for c in calls}) == merged)


def test_memory_that_did_not_drop_is_a_warning_naming_the_largest_residuals():
  """A policy whose compiled peak is not below no remat's is named in
  ``Comparison.warnings``, with its largest residuals besides arguments.
  Under ``lowering='cond'`` (a recompute XLA cannot merge away) saving
  nothing drops memory here and saving everything does not; both are
  checked as premises."""
  program, args = _wide_then_narrow(int(np.random.default_rng(1002).integers(1 << 16)))
  comparison = compare(program, *args, lowering='cond',
                       policies=['nothing_saveable', 'everything_saveable'])
  baseline = comparison.baseline
  nothing, everything = comparison.row('nothing_saveable'), comparison.row('everything_saveable')
  assert nothing.peak_bytes < baseline.peak_bytes <= everything.peak_bytes
  (warning,) = comparison.warnings
  assert warning.startswith(
      f"everything_saveable: compiled peak {everything.peak_bytes:,} bytes is not "
      f"below no remat's {baseline.peak_bytes:,} bytes.")
  largest = sorted((r for r in everything.report.residuals if r.kind != 'argument'),
                   key=lambda r: -r.bytes)[:3]
  assert len(largest) == 3
  for r in largest:
    assert f'{r.type_string} {r.description}' in warning
  # Arguments are alive anyway: not named, even the large ones.
  arguments = [r for r in everything.report.residuals if r.kind == 'argument']
  assert arguments and not any(r.description in warning for r in arguments)


def test_recompute_flops_to_drop_is_the_producing_equations_flops():
  """A residual buffer at the peak says what dropping it would cost: the
  FLOPs of the equation that produced it, counted as XLA counts them (a
  matmul 2 x output elements x contracted size; tanh, a transcendental, 0)."""
  width = int(np.random.default_rng(1003).integers(24, 80))
  program, args = _mlp(num_layers=4, width=width, batch=32, seed=width)
  report = analyze(program, *args, policy=cp.dots_saveable)
  found = [p for p in residuals_at_peak(report, compile_costs(program, *args,
                                                              policy=cp.dots_saveable))
           if p.residual is not None]
  kinds = {p.residual.primitive for p in found}
  assert {'dot_general', 'tanh'} <= kinds
  for p in found:
    r = p.residual
    if r.primitive == 'dot_general':
      assert p.recompute_flops_to_drop == 2 * 32 * width * width
    elif r.primitive == 'tanh':
      assert p.recompute_flops_to_drop == 0
    assert p.recompute_flops_to_drop == r.producer_flops


def test_compare_rejects_unknown_policy_names():
  program, args = _mlp(num_layers=2)
  with pytest.raises(ValueError, match="'dots_savable' is not a policy of checkpoint_policies"):
    compare(program, *args, policies=['dots_savable'])
  with pytest.raises(ValueError, match='builds a policy from arguments; call it'):
    compare(program, *args, policies=['save_only_these_names'])
  # A policy written as text is read as jax.checkpoint_policies builds it.
  rows = compare(program, *args, policies=["save_only_these_names('pre_activation')"],
                 include_no_remat=False).rows
  assert [r.label for r in rows] == ['as written', "save_only_these_names('pre_activation')"]


@pytest.fixture(scope='module')
def small_mlp():
  return examples.mlp(num_layers=4, width=48, batch=16)


@pytest.mark.parametrize('budget', [0.0, 0.3, 0.6, 1.0])
def test_search_never_loses_to_a_builtin_that_fits(small_mlp, budget):
  loss_fn, args = small_mlp
  result = search_policy(loss_fn, *args, memory_budget=budget)
  builtins = [c for c in result.candidates if not c.label.startswith('search')]
  assert len(builtins) >= 7  # the built-ins, as written and no remat
  assert result.fits and result.peak_bytes <= result.budget_bytes
  for c in builtins:
    if c.fits:
      assert result.flops <= c.flops, (c, result)
  assert 0 <= result.compiles_used <= len(result.candidates)
  if result.policy is None or result.policy is NO_REMAT:
    return  # the program itself, as written or without remat: no policy
  # The policy is a plain policy: JAX's checkpoint takes it too.
  grads = jax.grad(loss_fn)(*args)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  jax.tree_util.tree_map(close, grads, jax.grad(rx.checkpoint(loss_fn, policy=result.policy))(*args))
  jax.tree_util.tree_map(close, grads, jax.grad(jax.checkpoint(loss_fn, policy=result.policy))(*args))


def _wide_then_narrow(seed, batch=32):
  """Unrolled layers (no scan) with two matmuls each: ``x @ wa`` contracts
  the wide dimension into a narrow output (costly to recompute, cheap to
  keep), ``a @ wb.T`` expands it again (as many FLOPs, a wide output, costly
  to keep). No name tells them apart; a policy that may not look at sizes
  tells them by how they contract (``wb`` is stored wide-by-narrow)."""
  rng = np.random.default_rng(seed)
  layers = 3
  wide, narrow = int(rng.integers(512, 1024)), int(rng.integers(4, 12))
  wa = [jnp.asarray(rng.standard_normal((wide, narrow)) / wide ** 0.5, jnp.float32)
        for _ in range(layers)]
  wb = [jnp.asarray(rng.standard_normal((wide, narrow)) / narrow ** 0.5, jnp.float32)
        for _ in range(layers)]
  x = jnp.asarray(rng.standard_normal((batch, wide)), jnp.float32)

  def layer(wa, wb, x):
    return jnp.tanh(jnp.einsum('bn,wn->bw', x @ wa, wb)) + x

  def model(ws, x, ck=rx.checkpoint):
    for wa, wb in zip(*ws):
      x = ck(layer)(wa, wb, x)
    return jnp.mean(x ** 2)
  return model, ((wa, wb), x)


def test_search_beats_every_builtin_that_fits_by_choosing_one_pattern():
  """The budget lies strictly between nothing_saveable's compiled peak and
  that of the next built-in point (the dot policies save the wide outputs
  too), and saving only the narrow matmul fits it with fewer FLOPs than
  nothing_saveable, so the search must find a policy of its own.

  What it relies on: with ``lowering='cond'`` XLA really recomputes on the
  CPU (under the default barrier the CPU pipeline merges the recompute with
  the forward pass, and every policy compiles to the same peak), so saving
  the wide outputs raises the compiled peak; the narrow outputs are small
  next to the gap. Both are checked before the search is asked."""
  from remat_explorer.analysis.context import compiles_run
  from remat_explorer.analysis import SaveChosen
  program, args = _wide_then_narrow(int(np.random.default_rng(1004).integers(1 << 16)))
  nothing = compile_costs(program, *args, policy=cp.nothing_saveable, lowering='cond')
  dots = compile_costs(program, *args, policy=cp.dots_with_no_batch_dims_saveable,
                       lowering='cond')
  no_remat = compile_costs(program, *args, policy=NO_REMAT, lowering='cond')
  gap = dots.peak_bytes - nothing.peak_bytes
  assert gap >= 3 * 32 * args[1].shape[1] * 4 // 2  # the wide outputs, more or less
  # Below no remat's peak too, which fits with the fewest FLOPs wherever
  # its peak does.
  budget = min(nothing.peak_bytes + gap // 2, no_remat.peak_bytes - 1)
  assert budget > nothing.peak_bytes

  before = compiles_run()
  result = search_policy(program, *args, memory_budget=budget, lowering='cond')
  assert result.compiles_used == compiles_run() - before
  # Compiled before the search: nothing_saveable, the no-batch-dims dots
  # and no remat. The program as written is nothing_saveable's program, and
  # dots_saveable the no-batch-dims dots' (no matmul here has a batch
  # dimension): only everything_saveable and the search's own policy compile.
  assert len(result.candidates) == 7 and result.compiles_used == 2

  assert result.label.startswith('search:') and result.fits and len(result.label) <= 80
  assert isinstance(result.policy, SaveChosen) and result.policy.patterns
  assert result.costs.peak_bytes == result.peak_bytes <= budget  # compiled, not predicted
  fitting = [c for c in result.candidates if c.fits and not c.label.startswith('search')]
  # The program as written checkpoints each layer with the default policy.
  assert sorted(c.label for c in fitting) == ['as written', 'nothing_saveable']
  assert all(result.flops < c.flops for c in fitting)
  assert all(not c.fits for c in result.candidates
             if c.label in ('dots_saveable', 'everything_saveable'))
  # The matmul chosen is the narrow one (contracting x's dim 1 with wa's
  # dim 0), found at its line of this file.
  (chosen,) = result.policy.patterns
  assert chosen.primitive == 'dot_general'
  assert dict(chosen.params)['dimension_numbers'] == '(((1,), (0,)), ((), ()))'
  assert any('tests/test_costs.py' in site for site in result.policy.sites)
  assert 'Saves' in result.explanation and 'budget' in result.explanation
  # A plain policy: jax.checkpoint takes it and saves the same.
  theirs = lambda ws, x: program(ws, x, ck=functools.partial(jax.checkpoint, policy=result.policy))
  saved = [a.shape for a, _ in rx.saved_residuals(theirs, *args)]
  assert saved.count((32, args[0][0][0].shape[1])) == 3  # one per layer
  # Asked again, everything is cached: no compile.
  again = search_policy(program, *args, memory_budget=budget, lowering='cond')
  assert again.compiles_used == 0 and again.label == result.label


def test_the_policy_found_holds_at_twice_the_batch_and_as_source():
  from remat_explorer.analysis import analyze
  seed = int(np.random.default_rng(1006).integers(1 << 16))
  program, args = _wide_then_narrow(seed)
  # Below no remat's peak, which otherwise fits with the fewest FLOPs.
  nothing, no_remat = (compile_costs(program, *args, policy=p, lowering='cond').peak_bytes
                       for p in (cp.nothing_saveable, NO_REMAT))
  result = search_policy(program, *args, memory_budget=(nothing + no_remat) // 2,
                         lowering='cond')
  assert result.label.startswith('search:')  # premise: a policy of its own
  big, big_args = _wide_then_narrow(seed, batch=64)
  narrow = args[0][0][0].shape[1]

  def saved(policy, args, f):
    return sorted((r.shape, r.primitive) for r in
                  analyze(f, *args, policy=policy, argnums=(0, 1)).residuals
                  if r.kind == 'equation')
  at_32, at_64 = saved(result.policy, args, program), saved(result.policy, big_args, big)
  # The same values are saved, each twice as large along the batch.
  assert [(s[0] * 2, *s[1:], p) for s, p in at_32] == [(s[0], *s[1:], p) for s, p in at_64]
  assert at_64 != saved(cp.nothing_saveable, big_args, big)
  assert ((64, narrow), 'dot_general') in at_64 or result.policy.names
  # to_source() is Python that needs only JAX and builds the same policy.
  namespace = {}
  exec(result.to_source(), namespace)
  assert saved(namespace['policy'], args, program) == at_32
  assert saved(namespace['policy'], big_args, big) == at_64


def test_no_remat_as_source_keeps_the_checkpoint_with_a_policy_that_fits():
  """Where the search answers no remat, its source says how to keep the
  checkpoints anyway: with the compiled policy that fits the budget with
  the fewest FLOPs, not with everything_saveable, which saves every value
  and here compiles far above the budget (under ``lowering='cond'`` XLA
  cannot merge what it saves away)."""
  seed = int(np.random.default_rng(1013).integers(1 << 16))
  program, args = _wide_then_narrow(seed)
  result = search_policy(program, *args, memory_budget=0.5, lowering='cond')
  comparison = compare(program, *args, lowering='cond')
  # Premises: no remat is the answer, and saving everything does not fit.
  assert result.policy is NO_REMAT
  assert comparison.row('everything_saveable').peak_bytes > result.budget_bytes
  source = result.to_source()
  assert source.startswith('# No remat')
  namespace = {}
  exec(source, namespace)
  policy = namespace['policy']
  kept = result.kept_checkpoint
  comment = ' '.join(line[2:] for line in source.splitlines() if line.startswith('# '))
  assert policy is getattr(jax.checkpoint_policies, kept.label)
  assert f'{kept.label} fits the budget' in comment
  # The program with the policy pasted in compiles to the kept figures,
  # within the budget (XLA's footprint, compiled by hand, as the tool's),
  # and no policy of the comparison that fits has fewer FLOPs.
  pasted = functools.partial(
      program, ck=functools.partial(rx.checkpoint, policy=policy, lowering='cond'))
  costs = compile_costs(pasted, *args)
  assert costs.peak_bytes == kept.peak_bytes <= result.budget_bytes
  memory = jax.jit(jax.value_and_grad(pasted)).lower(*args).compile().memory_analysis()
  assert costs.total_bytes == allocated_bytes(memory)
  fitting = [r for r in comparison.rows if r.label in builtin_policies()
             and r.peak_bytes <= result.budget_bytes]
  assert kept.flops == min(r.ranked_flops for r in fitting)
  assert result.to_dict()['kept_checkpoint_policy'] == kept.label


def test_no_remat_as_source_names_the_lowest_peak_where_no_policy_fits():
  """Under the while-loop lowering every policy compiles the example
  convnet above no remat's peak: at that budget only the program without
  its checkpoints fits, and the source, keeping them, says that no policy
  fits and gives the one with the lowest compiled peak."""
  loss_fn, args = examples.convnet(seed=int(np.random.default_rng(1014).integers(1 << 16)))
  comparison = compare(loss_fn, *args, lowering='while')
  no_remat = comparison.row('no remat').peak_bytes
  policies = [r for r in comparison.rows if r.label in builtin_policies(('conv_output',))]
  assert all(r.peak_bytes > no_remat for r in policies)  # premise
  result = search_policy(loss_fn, *args, memory_budget=no_remat, lowering='while')
  assert result.policy is NO_REMAT and result.fits
  lowest = min(policies, key=lambda r: r.peak_bytes)
  assert result.kept_checkpoint.label == lowest.label and not result.kept_checkpoint.fits
  source = result.to_source()
  comment = ' '.join(line[2:] for line in source.splitlines() if line.startswith('# '))
  assert 'no policy compiled fits the budget' in comment and lowest.label in comment
  namespace = {}
  exec(source, namespace)
  assert namespace['policy'] is getattr(jax.checkpoint_policies, lowest.label)


def test_equation_patterns_are_what_a_policy_sees_without_sizes():
  """SaveChosen answers from (primitive, input dtypes and ranks,
  parameters) alone, as JAX asks a policy; equations alike in those are
  saved together, at any size."""
  from remat_explorer.analysis.policies.chosen_policy import EquationPattern, SaveChosen
  program, args = _wide_then_narrow(int(np.random.default_rng(1005).integers(1 << 16)))
  wa, wb, x = args[0][0][0], args[0][1][0], args[1]
  jaxpr = jax.make_jaxpr(lambda x: jnp.einsum('bn,wn->bw', x @ wa, wb))(x)
  narrow_dot, wide_dot = [e for e in jaxpr.eqns if e.primitive.name == 'dot_general']
  pattern = EquationPattern.of_equation(narrow_dot)
  assert pattern != EquationPattern.of_equation(wide_dot)
  policy = SaveChosen(patterns=frozenset({pattern}))
  ask = lambda e: policy(e.primitive, *[v.aval for v in e.invars], **e.params)
  assert ask(narrow_dot) and not ask(wide_dot)
  # At another batch size and width, the same pattern.
  other = jax.make_jaxpr(lambda x, w: x @ w)(jnp.ones((7, 5)), jnp.ones((5, 3))).eqns[0]
  assert EquationPattern.of_equation(other) == pattern and ask(other)
  assert str(pattern) == 'dot_general(float32[·], float32[·])'.replace('[·]', '[·,·]')
  # Primitives whose parameters carry sizes have no pattern.
  reshape = jax.make_jaxpr(lambda x: x.reshape(-1))(x).eqns[0]
  assert EquationPattern.of_equation(reshape) is None


def test_a_budget_printed_as_a_size_is_taken_back_as_those_bytes(small_mlp):
  """A budget as the explanations and the Explorer print it ("1.5 KiB":
  powers of 1024) is the bytes it stands for; "GB" and "MB" are powers of
  1000, as device makers write memory."""
  loss_fn, args = small_mlp
  halfway = search_policy(loss_fn, *args, memory_budget=0.5)
  kib = halfway.budget_bytes // 1024
  printed = format_bytes(kib * 1024)
  assert printed.endswith(' KiB')
  by_size = search_policy(loss_fn, *args, memory_budget=printed)
  by_bytes = search_policy(loss_fn, *args, memory_budget=kib * 1024)
  assert by_size.budget_bytes == by_bytes.budget_bytes == kib * 1024
  assert (by_size.label, by_size.peak_bytes) == (by_bytes.label, by_bytes.peak_bytes)
  assert search_policy(loss_fn, *args, memory_budget='0.002 GB').budget_bytes == 2_000_000
  assert search_policy(loss_fn, *args, memory_budget='2MiB').budget_bytes == 2 << 20


def test_search_budget_errors():
  program, args = _mlp(num_layers=2)
  with pytest.raises(ValueError, match='between 0'):
    search_policy(program, *args, memory_budget=1.5)
  with pytest.raises(TypeError, match='memory_budget'):
    search_policy(program, *args, memory_budget=[1 << 30])
  # A string is a size with its unit or a share of the device's memory.
  with pytest.raises(ValueError, match=r"memory_budget='1 GX' is neither a size with its "
                                       r'unit.* nor a share .* "90%"'):
    search_policy(program, *args, memory_budget='1 GX')
  with pytest.raises(ValueError, match='percentage above 0 and at most 100'):
    search_policy(program, *args, memory_budget='120%')
  # An int is bytes: 1 byte cannot hold even the step's arguments.
  with pytest.raises(ValueError, match=r'memory_budget=1 is bytes.*pass a float'):
    search_policy(program, *args, memory_budget=1)


def test_residual_buffers_at_the_peak_link_back_to_their_residuals():
  from remat_explorer.analysis import analyze, residuals_at_peak
  loss_fn, args = examples.mlp(num_layers=4, width=64, batch=16)
  found = residuals_at_peak(analyze(loss_fn, *args), compile_costs(loss_fn, *args))
  assert found and all(p.residual is not None for p in found)
  biggest = found[0]
  # The layer inputs saved by the scan, stacked: [layers, batch, width],
  # named where the layer computed them.
  assert biggest.bytes == 4 * 16 * 64 * 4 == biggest.residual.bytes
  assert biggest.residual.carried_out_of == ('scan×4',)
  assert biggest.residual.name in examples.MLP_NAMES
  assert biggest.policy == 'nothing_saveable (default)'


def test_every_buffer_live_at_the_peak_is_described():
  from remat_explorer.analysis import analyze, live_at_peak, residuals_at_peak
  loss_fn, args = examples.transformer(num_layers=2, d_model=32, seq_len=16, batch=2,
                                       use_scan=True)
  report, costs = analyze(loss_fn, *args), compile_costs(loss_fn, *args)
  table = live_at_peak(report, costs)
  timeline = costs.timeline
  # Every device buffer live at the peak, and only those, largest first.
  assert sum(b.bytes for b in table) == timeline.live_bytes[timeline.peak_step]
  assert [b.bytes for b in table] == sorted((b.bytes for b in table), reverse=True)
  assert {b.kind for b in table} >= {'parameter', 'residual'}
  assert all(b.made_by == '' for b in table if b.kind == 'parameter')
  residuals = [b for b in table if b.kind == 'residual']
  assert residuals == residuals_at_peak(report, costs)
  assert all(b.made_by == 'forward' for b in residuals)
  assert any(b.source.startswith('remat_explorer/examples.py:') for b in residuals)
  # The passes along the schedule: the backward pass starts after a forward one.
  passes = timeline.passes()
  boundary = forward_backward_boundary(timeline.step_passes)
  assert passes[0][2] == 'forward' and 0 < boundary < len(timeline.steps)
  assert {p for _, _, p in passes} >= {'forward', 'backward'}


def test_report_and_costs_given_the_other_way_round_is_a_clear_error():
  from remat_explorer.analysis import analyze, residuals_at_peak
  loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
  with pytest.raises(TypeError, match=r'expected \(report, costs\).*got \(CompiledCosts, RematReport\)'):
    residuals_at_peak(compile_costs(loss_fn, *args), analyze(loss_fn, *args))


def test_compare_counts_rows_done_while_it_still_analyzes(monkeypatch):
  """Rows whose compile has landed are read and counted between the
  analyses of the later policies, not after all of them: a long analysis
  of the last policy does not hold back the progress of the first rows.
  The second to last analysis waits until the first compile started before
  it has landed (polling its future, not sleeping on a guess)."""
  import concurrent.futures
  from remat_explorer.analysis.tradeoffs import compare as compare_module
  loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
  log, own, started = [], compare_module.analyze, []
  own_start = compare_module.start_compile_costs
  policies = ['nothing_saveable', 'dots_saveable', 'everything_saveable']

  def start_compile_costs(*a, **kw):
    started.append(own_start(*a, **kw))
    return started[-1]

  def analyze(fn, *a, policy=None, **kw):
    label = describe_policy(policy) if policy not in (None, NO_REMAT) else str(policy)
    if label == 'dots_saveable':
      done, _ = concurrent.futures.wait([started[0].compiled], timeout=300)
      assert done, 'the first compile did not land'
    log.append(('analyze', label))
    return own(fn, *a, policy=policy, **kw)
  monkeypatch.setattr(compare_module, 'analyze', analyze)
  monkeypatch.setattr(compare_module, 'start_compile_costs', start_compile_costs)
  compare(loss_fn, *args, policies=policies, suggest_lowering=False,
          progress=lambda i, n, label: log.append(('done', label)))
  last_analysis = max(i for i, (kind, _) in enumerate(log) if kind == 'analyze')
  assert log[last_analysis][1] == 'everything_saveable'
  assert any(kind == 'done' for kind, _ in log[:last_analysis])


def _compiles_in_flight(monkeypatch) -> dict:
  """Wraps XLA's compile to record how many run at once, at most."""
  import threading
  seen, lock = {'now': 0, 'most': 0, 'calls': 0}, threading.Lock()
  compile_ = jax.stages.Lowered.compile

  def counted(self, *args, **kwargs):
    with lock:
      seen['now'] += 1
      seen['calls'] += 1
      seen['most'] = max(seen['most'], seen['now'])
    try:
      return compile_(self, *args, **kwargs)
    finally:
      with lock:
        seen['now'] -= 1
  monkeypatch.setattr(jax.stages.Lowered, 'compile', counted)
  return seen


def test_compare_and_search_compile_one_program_at_a_time(monkeypatch):
  """Each compile in flight holds working memory of its own (with a
  compile per core, compare reached 4x the RSS of a compile by hand):
  compare and the search compile one program at a time, by default."""
  loss_fn, args = examples.mlp(num_layers=3, width=48, batch=8, seed=31)
  seen = _compiles_in_flight(monkeypatch)
  rx.clear_caches()
  compare(loss_fn, *args, suggest_lowering=False)
  search_policy(loss_fn, *args, memory_budget=0.5)
  assert seen['calls'] >= 5 and seen['most'] == 1, seen


def test_two_threads_asking_for_one_program_at_once_share_one_compile():
  """The Explorer's views and its search ask for the program as written
  together, each on a thread of its own: XLA compiles it once, and both
  get its figures, with no note that they shared it (it is one step)."""
  import threading
  from remat_explorer.analysis.context import compiles_run
  ours, args = _mlp(num_layers=4, width=96, batch=32, seed=43)
  rx.clear_caches()
  start, results, compiles = threading.Barrier(2), {}, {}

  def ask(name):
    start.wait()
    before = compiles_run()
    results[name] = compile_costs(ours, *args)
    compiles[name] = compiles_run() - before
  threads = [threading.Thread(target=ask, args=(name,)) for name in ('views', 'search')]
  for t in threads:
    t.start()
  for t in threads:
    t.join(300)
  assert sum(compiles.values()) == 1, compiles
  views, search = results['views'], results['search']
  by_hand = jax.jit(jax.value_and_grad(ours)).lower(*args).compile()
  assert views.temp_bytes == search.temp_bytes == by_hand.memory_analysis().temp_size_in_bytes
  assert views.executed_flops == search.executed_flops
  assert not any('same program' in n for n in views.notes + search.notes)


def test_a_compile_cancelled_before_it_ran_leaves_its_program_to_compile_later():
  """A search cancels the compiles it no longer needs; one cancelled while
  it waited for a worker gives its program back: asked for later, the
  program compiles, rather than answering with the cancellation."""
  import concurrent.futures
  import threading
  from remat_explorer.analysis.xla.compiled import start_compile_costs
  ours, args = _mlp(num_layers=3, width=64, batch=16, seed=45)
  rx.clear_caches()
  release = threading.Event()
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    pool.submit(release.wait, 300)  # the only worker, busy
    waiting = start_compile_costs(pool, ours, *args, policy=cp.dots_saveable)
    assert waiting.compiled.cancel()
    release.set()
  costs = compile_costs(ours, *args, policy=cp.dots_saveable)
  theirs, _ = _mlp(num_layers=3, width=64, batch=16, seed=45, ck=jax.checkpoint,
                   policy=cp.dots_saveable)
  by_hand = jax.jit(jax.value_and_grad(theirs)).lower(*args).compile()
  assert not costs.failed
  assert costs.temp_bytes == by_hand.memory_analysis().temp_size_in_bytes


def test_policies_that_compile_to_one_program_share_one_compile():
  """The program as written (a default ``checkpoint``), ``nothing_saveable``
  and a name the program does not have lower to one program: XLA compiles
  it once, and each row holds that compile's figures, which are
  ``jax.checkpoint``'s for each of the three, and says whose they are.
  A policy that saves more is a program, and a compile, of its own."""
  from remat_explorer.analysis.context import compiles_run
  ours, args = _mlp(num_layers=3, width=48, batch=16, seed=41)
  same = {'nothing_saveable': cp.nothing_saveable,
          "save_only_these_names('absent')": cp.save_only_these_names('absent')}
  rx.clear_caches()
  before = compiles_run()
  table = compare(ours, *args, policies=[*same, 'dots_saveable'], suggest_lowering=False)
  # as written (shared by both of `same`), no remat, dots_saveable
  assert compiles_run() - before == 3
  written = table.row('as written').costs
  for label, policy in same.items():
    theirs, _ = _mlp(ck=jax.checkpoint, policy=policy)
    by_hand = jax.jit(jax.value_and_grad(theirs)).lower(*args).compile()
    costs = table.row(label).costs
    assert costs.policy == label and not costs.failed
    assert costs.temp_bytes == by_hand.memory_analysis().temp_size_in_bytes
    assert costs.xla_flops == pytest.approx(by_hand.cost_analysis()['flops'], rel=0.01)
    assert (costs.peak_bytes, costs.executed_flops) == (written.peak_bytes,
                                                        written.executed_flops)
    assert any(n.startswith(f'compiles to the same program as {written.policy}')
               for n in costs.notes), costs.notes
  dots = table.row('dots_saveable').costs
  assert not any('same program' in n for n in dots.notes + written.notes)
  # Its matmuls' outputs are saved, not recomputed: fewer in its program.
  assert dots.lowered_matmuls < written.lowered_matmuls


def test_a_loss_that_closes_over_a_ref_compiles_as_by_hand():
  """A loss that closes over a mutable ref takes the ref as an input and
  gives its new value as an output that its argument and result trees do
  not hold (JAX's ``Compiled`` cannot lay out their shardings): its costs
  are XLA's all the same, as compiled by hand, and the ref is untouched."""
  x_ref = jax.new_ref(jax.random.normal(jax.random.key(11), (64,)))
  before = np.asarray(x_ref[...])

  def block(y, x_ref):
    out = jnp.sin(y * x_ref[...])
    x_ref[...] += 1
    return jnp.sum(jnp.sin(out))

  def loss(y):
    return rx.checkpoint(block)(y, x_ref)
  y = jax.random.normal(jax.random.key(12), (64,))
  costs = compile_costs(loss, y)
  by_hand = jax.jit(jax.value_and_grad(loss)).lower(y).compile()
  assert not costs.failed, costs.error
  memory = by_hand.memory_analysis()
  assert costs.memory_analysis == {name: getattr(memory, name) for name in dir(memory)
                                   if not name.startswith('_')
                                   and isinstance(getattr(memory, name), int)}
  assert costs.xla_flops == by_hand.cost_analysis()['flops']
  assert costs.num_devices == 1
  np.testing.assert_array_equal(np.asarray(x_ref[...]), before)


def _recorded_compiles(monkeypatch) -> list:
  """(lowered, compiled), as weak references, for every ``Lowered.compile``
  from here on."""
  import weakref
  made = []
  compile_lowered = jax.stages.Lowered.compile

  def recorded(self, *args, **kwargs):
    compiled = compile_lowered(self, *args, **kwargs)
    made.append((weakref.ref(self), weakref.ref(compiled)))
    return compiled
  monkeypatch.setattr(jax.stages.Lowered, 'compile', recorded)
  return made


def test_compiles_for_figures_keep_no_program_once_read(monkeypatch):
  """``compare``, the search and ``compile_costs`` without runs keep XLA's
  figures of each compile, not the compiled or the lowered program (for
  recurrentgemma's Griffin, 1.3 GiB a policy, held in the caches)."""
  import gc
  made = _recorded_compiles(monkeypatch)
  loss_fn, args = examples.mlp(num_layers=3, width=32, batch=8, seed=13)
  rx.clear_caches()
  table = compare(loss_fn, *args, policies=['nothing_saveable', 'dots_saveable'])
  costs = compile_costs(loss_fn, *args, policy=rx.checkpoint_policies.everything_saveable)
  gc.collect()
  assert len(made) >= 3 and not any(row.failed for row in table.rows) and not costs.failed
  kept = [(lowered() is not None, compiled() is not None) for lowered, compiled in made]
  assert kept == [(False, False)] * len(made), kept


def test_freed_memory_is_given_back_once_the_process_has_grown(monkeypatch):
  """After a compile is read, the heaps' free pages go back to the system
  when the process grew by `WORTH_GIVING_BACK` since they last did (a large
  program's compile), and are left alone otherwise (a small one's, whose
  pages the next compile would fault in again)."""
  from remat_explorer.analysis import freed_memory
  worth = freed_memory.WORTH_GIVING_BACK

  def grow_and_free(total: int):
    """`total` bytes in blocks under glibc's mmap threshold (its heaps, as a
    compile's many small buffers are), written so that they are resident,
    then every other one freed: free pages amid used ones, which glibc
    keeps for reuse unless trimmed. Returns the blocks still used."""
    blocks = [b'\1' * 100_000 for _ in range(total // 100_000)]
    return blocks[1::2]

  with monkeypatch.context() as m:  # what earlier tests left, given back
    m.setattr(freed_memory, 'WORTH_GIVING_BACK', 0)
    freed_memory.give_back_freed_memory()
  assert not freed_memory.give_back_freed_memory()  # nothing grew since
  small = grow_and_free(worth // 2)  # half of it kept, half free
  assert not freed_memory.give_back_freed_memory()
  large = grow_and_free(2 * worth)
  grown = freed_memory.resident_bytes()
  assert freed_memory.give_back_freed_memory()
  assert grown - freed_memory.resident_bytes() >= worth // 2
  assert not freed_memory.give_back_freed_memory()
  del small, large


def test_a_comparison_with_runs_compiles_each_row_once(monkeypatch):
  """``compare(repeats=...)`` times each row's runs on the executable its
  figures came from: as many compiles as the comparison without runs, and
  the same figures; no executable is kept once timed."""
  import gc
  from remat_explorer.analysis.context import compiles_run
  made = _recorded_compiles(monkeypatch)
  program, args = _mlp(seed=4)
  policies = ['nothing_saveable', 'dots_saveable']
  rx.clear_caches()
  before = compiles_run()
  timed = compare(program, *args, policies=policies, repeats=2)
  compiles_timed = compiles_run() - before
  gc.collect()
  assert len(made) == compiles_timed and not any(compiled() is not None for _, compiled in made)
  rx.clear_caches()
  before = compiles_run()
  untimed = compare(program, *args, policies=policies)
  assert compiles_timed == compiles_run() - before >= 3
  assert all(r.run_seconds > 0 for r in timed.rows), [r.run_seconds for r in timed.rows]
  assert all(r.run_seconds is None for r in untimed.rows)
  assert ([(r.label, r.peak_bytes, r.compiled_flops) for r in timed.rows]
          == [(r.label, r.peak_bytes, r.compiled_flops) for r in untimed.rows])
  # compile_costs with runs, alone: one compile, not kept once timed.
  made.clear()
  before = compiles_run()
  assert compile_costs(program, *args, policy=cp.everything_saveable, repeats=2).run_seconds > 0
  gc.collect()
  assert compiles_run() - before == len(made) == 1 and made[0][1]() is None
