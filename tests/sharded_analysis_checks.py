"""Sharded programs analyzed per device, on 8 forced host devices.

Run by ``tests/test_sharded_analysis.py`` with pytest in its own process:
the device count must be set before JAX is imported. Not collected by the
main run (its name does not start with ``test_``).
"""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=8')

import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.ad_checkpoint import checkpoint_name as jax_checkpoint_name  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import remat_explorer as rx  # noqa: E402
from remat_explorer import examples, viz  # noqa: E402
from remat_explorer.analysis.context import compiles_run  # noqa: E402
from remat_explorer.analysis import (analyze, compare,  # noqa: E402
                                     compile_costs, search_policy)
from remat_explorer.analysis.xla.collectives import KINDS  # noqa: E402
from remat_explorer.viz.charts import costs as charts  # noqa: E402

cp = rx.checkpoint_policies
MESHES = [(1, 1), (2, 1), (2, 2), (4, 2)]  # (data, model): 1, 2, 4, 8 devices


def test_there_are_8_devices():
  assert len(jax.devices()) == 8, jax.devices()


def _factor(mesh, spec) -> int:
  """How many shards `spec` cuts an array into on `mesh`."""
  axes = [a for entry in spec if entry is not None
          for a in (entry if isinstance(entry, tuple) else (entry,))]
  return math.prod(mesh.shape[a] for a in axes)


def _mlp_on(mesh, seed, ck=rx.checkpoint, policy=None, lowering=None):
  """Two checkpointed layers; weights column/row parallel over 'model', the
  batch over 'data', the hidden activation constrained and named."""
  k = jax.random.split(jax.random.key(seed), 3)
  specs = {'w1': P(None, 'model'), 'w2': P('model', None)}
  params = {'w1': jax.random.normal(k[0], (32, 64)) / 6,
            'w2': jax.random.normal(k[1], (64, 32)) / 8}
  params = {n: jax.device_put(v, NamedSharding(mesh, specs[n])) for n, v in params.items()}
  x = jax.device_put(jax.random.normal(k[2], (16, 8, 32)), NamedSharding(mesh, P('data')))
  hidden_spec = NamedSharding(mesh, P('data', None, 'model'))
  name = rx.checkpoint_name if ck is rx.checkpoint else jax_checkpoint_name

  def layer(p, x):
    h = name(jax.lax.with_sharding_constraint(jnp.tanh(x @ p['w1']), hidden_spec), 'hidden')
    return x + h @ p['w2']

  block = ck(layer, policy=policy, **({} if lowering is None else {'lowering': lowering}))

  def loss(p, x):
    for _ in range(2):
      x = block(p, x)
    return jnp.mean(x ** 2)
  return loss, (params, x), specs


# -- residuals per device --------------------------------------------------------------

@pytest.mark.parametrize('shape', MESHES, ids=str)
def test_residual_shards_are_global_bytes_over_the_sharding_factor(shape):
  mesh = examples.data_model_mesh(*shape)
  loss, args, specs = _mlp_on(mesh, seed=sum(shape))
  report = analyze(loss, *args, policy=cp.save_only_these_names('hidden'), argnums=(0, 1))
  assert report.num_devices == math.prod(shape)
  assert dict(report.mesh_shape) == {'data': shape[0], 'model': shape[1]}
  known = {"p['w1']": specs['w1'], "p['w2']": specs['w2'], 'x': P('data')}
  checked = set()
  for r in report.residuals:
    spec = P('data', None, 'model') if r.name == 'hidden' else known.get(r.argument)
    if spec is None:
      continue
    factor = _factor(mesh, spec)
    assert r.per_device_bytes * factor == r.bytes, (r, factor)
    assert r.per_device_shape == NamedSharding(mesh, spec).shard_shape(r.shape)
    checked.add(r.name or r.argument)
  assert checked == {'hidden', *known}, checked
  assert report.residual_bytes_per_device == sum(r.per_device_bytes for r in report.residuals)
  data = json.loads(json.dumps(report.to_dict()))
  assert data['residual_bytes_per_device'] == report.residual_bytes_per_device
  assert data['residuals'][0]['per_device_shape'] == list(report.residuals[0].per_device_shape)


@pytest.mark.parametrize('use_scan', [False, True], ids=['unrolled', 'scan'])
def test_example_named_residuals_follow_their_activation_specs(use_scan):
  mesh = examples.data_model_mesh(2, 4)
  loss_fn, args = examples.sharded_transformer(mesh, use_scan=use_scan, seed=3)
  names = ('query', 'attention_logits', 'mlp_hidden')
  report = analyze(loss_fn, *args, policy=cp.save_only_these_names(*names))
  (block, *_) = [b for b in report.blocks if b.differentiated]
  named = [r for r in block.residuals if r.name in names]
  assert {r.name for r in named} == set(names)
  for r in named:
    factor = _factor(mesh, examples.ACTIVATION_SPECS[r.name])
    assert factor > 1 and r.per_device_bytes * factor == r.bytes, r
  assert report.residual_bytes_per_device < report.residual_bytes


def test_an_unsharded_program_has_no_shardings():
  loss_fn, args = examples.transformer(num_layers=1, d_model=16, num_heads=2,
                                       seq_len=8, batch=2)
  report = analyze(loss_fn, *args)
  assert report.num_devices == 1 and report.mesh_shape is None
  assert all(r.sharding is None and r.per_device_bytes is None for r in report.residuals)
  assert report.residual_bytes_per_device == report.residual_bytes
  costs = compile_costs(loss_fn, *args)
  assert costs.num_devices == 1 and costs.collectives == ()


# -- compiled memory per device ----------------------------------------------------------

def test_compiled_memory_per_device_falls_as_the_mesh_grows():
  costs, reports = [], []
  for shape in MESHES:
    mesh = examples.data_model_mesh(*shape)
    loss_fn, args = examples.sharded_transformer(mesh, batch=16, seed=5)
    costs.append(compile_costs(loss_fn, *args))
    reports.append(analyze(loss_fn, *args))
  assert [c.num_devices for c in costs] == [1, 2, 4, 8]
  peaks = [c.peak_bytes for c in costs]
  assert all(a > b for a, b in zip(peaks, peaks[1:])), peaks
  flops = [c.xla_flops for c in costs]
  assert all(a > b for a, b in zip(flops, flops[1:])), flops
  # The program, so its global residual bytes, is the same on every mesh;
  # each device's share falls.
  assert len({r.residual_bytes for r in reports}) == 1
  shares = [r.residual_bytes_per_device for r in reports]
  assert shares[0] == reports[0].residual_bytes
  assert all(a > b for a, b in zip(shares, shares[1:])), shares
  assert reports[-1].jaxpr_flops_per_device == reports[-1].total_flops / 8
  # The same compiles, charted (plot_per_device_memory).
  _check_per_device_memory_chart(
      {f'{shape[0]}×{shape[1]}': c for shape, c in zip(MESHES, costs)})


def _check_per_device_memory_chart(costs):
  """The chart of per-device memory: a bar per mesh, each ending at XLA's
  per-device total; bars on one mesh say the mesh once, in the title."""
  fig = viz.plot_per_device_memory(costs)
  ax = fig.axes[0]
  ticks = [t.get_text() for t in ax.get_yticklabels()]
  assert len(ticks) == len(costs)
  for tick, (label, c) in zip(ticks, costs.items()):
    assert tick.startswith(f'{label} · {c.num_devices} device'), tick
  total = lambda c: c.argument_bytes + c.output_bytes + c.temp_bytes
  scale = charts.byte_unit(max(total(c) for c in costs.values()))
  n = len(costs)
  for i, c in enumerate(costs.values()):
    ends = [p.get_x() + p.get_width() for p in ax.patches[i::n]]
    assert max(ends) == pytest.approx(total(c) / scale)
  assert 'per device' in ax.get_xlabel()
  one_mesh = viz.plot_per_device_memory({'a': costs['4×2'], 'b': costs['4×2']}).axes[0]
  assert [t.get_text() for t in one_mesh.get_yticklabels()] == ['a', 'b']
  assert '8 devices (data=4 × model=2)' in one_mesh.get_title()


# -- collectives ---------------------------------------------------------------------

def _fsdp_mlp(mesh, seed, policy, lowering='cond'):
  """Weights sharded over 'data' (ZeRO-3 style): every use all-gathers them,
  so a recomputed matmul gathers its weight again."""
  k = jax.random.split(jax.random.key(seed), 3)
  w1 = jax.device_put(jax.random.normal(k[0], (32, 64)) / 6, NamedSharding(mesh, P('data')))
  w2 = jax.device_put(jax.random.normal(k[1], (64, 32)) / 8, NamedSharding(mesh, P('data')))
  x = jax.device_put(jax.random.normal(k[2], (16, 32)), NamedSharding(mesh, P('data')))

  def loss(ws, x):
    layer = rx.checkpoint(lambda w1, w2, x: jnp.tanh(jnp.tanh(x @ w1) @ w2),
                          policy=policy, lowering=lowering)
    for _ in range(2):
      x = layer(*ws, x)
    return jnp.mean(x ** 2)
  return loss, ((w1, w2), x)


def _hlo_collectives(loss, args):
  text = jax.jit(jax.value_and_grad(loss)).lower(*args).compile().as_text()
  return len(re.findall(rf'\s({"|".join(KINDS)})(-done)?\(', text))


def test_collectives_the_recompute_adds_are_found():
  mesh = examples.data_model_mesh(8, 1)
  loss, args = _fsdp_mlp(mesh, 7, cp.nothing_saveable)
  nothing = compile_costs(loss, *args)
  everything = compile_costs(*_fsdp_mlp(mesh, 7, cp.everything_saveable)[:1], *args)
  gathers = lambda c, phase: sum(x.count for x in c.collectives
                                 if x.kind == 'all-gather' and x.phase == phase)
  assert gathers(nothing, 'forward') >= 1
  assert gathers(nothing, 'recompute') >= 1
  assert everything.recompute_collective_count == 0
  assert nothing.recompute_collective_count == sum(
      x.count for x in nothing.collectives if x.phase == 'recompute')
  # Every collective instruction of the HLO is counted (no loops here; a
  # combined one counts once per operand).
  assert nothing.collective_count >= _hlo_collectives(loss, args) >= 1


def test_collectives_in_a_scan_count_every_trip():
  """The layers of a scan are one loop body: deeper stacks have the same
  collective instructions, run once more per extra layer."""
  mesh = examples.data_model_mesh(2, 4)
  runs = []
  for num_layers in (2, 3, 4):
    loss_fn, args = examples.sharded_transformer(mesh, use_scan=True, num_layers=num_layers)
    runs.append(compile_costs(loss_fn, *args))
  assert all({x.kind for x in c.collectives} >= {'all-reduce'} for c in runs)
  instructions = [sum(x.instructions for x in c.collectives) for c in runs]
  counts = [c.collective_count for c in runs]
  assert len(set(instructions)) == 1, instructions
  assert counts[2] - counts[1] == counts[1] - counts[0] > 0, counts
  assert not any('unknown trip count' in n for c in runs for n in c.notes)


# -- entry points, inputs and parity ------------------------------------------------------

def test_gradients_equal_jax_checkpoint_on_the_same_sharded_program():
  mesh = examples.data_model_mesh(2, 4)
  for policy in (None, cp.save_only_these_names('hidden')):
    ours, args, _ = _mlp_on(mesh, seed=11, policy=policy)
    theirs, _, _ = _mlp_on(mesh, seed=11, ck=jax.checkpoint, policy=policy)
    value, grads = jax.jit(jax.value_and_grad(ours, argnums=(0, 1)))(*args)
    value_jax, grads_jax = jax.jit(jax.value_and_grad(theirs, argnums=(0, 1)))(*args)
    np.testing.assert_array_equal(np.asarray(value), np.asarray(value_jax))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(
        np.asarray(a), np.asarray(b)), grads, grads_jax)
    # The analysis of JAX's program reports what JAX saves, per device too.
    report = analyze(theirs, *args, argnums=(0, 1))
    saved = rx.saved_residuals(theirs, *args)
    assert [r.shape for r in report.residuals] == [tuple(a.shape) for a, _ in saved]
    assert all(r.per_device_bytes is not None for r in report.residuals)


def test_the_example_computes_what_the_unsharded_transformer_does():
  sizes = dict(num_layers=2, d_model=32, num_heads=4, seq_len=8, batch=4, seed=2)
  loss_fn, args = examples.sharded_transformer(examples.data_model_mesh(2, 4), **sizes)
  plain_fn, plain_args = examples.transformer(**sizes)
  value, grads = jax.jit(jax.value_and_grad(loss_fn))(*args)
  value0, grads0 = jax.jit(jax.value_and_grad(plain_fn))(*plain_args)
  np.testing.assert_allclose(value, value0, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                         grads, grads0)
  wq = args[0]['blocks'][0]['wq']
  assert wq.sharding.spec == P(None, 'model') and len(wq.sharding.device_set) == 8


def test_the_example_refuses_a_mesh_it_does_not_fit():
  mesh = examples.data_model_mesh(2, 4)
  with pytest.raises(ValueError, match="batch=3 is not divisible by the 2 devices of mesh axis 'data'"):
    examples.sharded_transformer(mesh, batch=3)
  with pytest.raises(ValueError, match="num_heads=2 is not divisible by the 4 devices"):
    examples.sharded_transformer(mesh, num_heads=2, d_model=32)
  with pytest.raises(ValueError, match=r"axes \('data', 'model'\).*got axes \('x',\)"):
    examples.sharded_transformer(jax.make_mesh((8,), ('x',)))
  with pytest.raises(ValueError, match='a 4 x 4 mesh needs 16 devices; got 8'):
    examples.data_model_mesh(4, 4)


def test_a_function_jitted_with_in_shardings_and_a_shard_map():
  mesh = examples.data_model_mesh(2, 4)
  k = jax.random.split(jax.random.key(13), 2)
  w = jax.random.normal(k[0], (16, 16)) / 4
  x = jax.random.normal(k[1], (64, 16))  # on one device, uncommitted

  def layer(w, x):
    return jnp.tanh(rx.checkpoint_name(jnp.sin(x @ w), 'h') @ w)

  step = jax.jit(lambda w, x: jnp.sum(rx.checkpoint(layer)(w, x) ** 2),
                 in_shardings=(NamedSharding(mesh, P(None, 'model')),
                               NamedSharding(mesh, P('data'))))
  report = analyze(step, w, x)
  assert report.num_devices == 8
  (x_saved,) = [r for r in report.residuals if r.argument == 'x']
  assert x_saved.sharding == "P('data')" and x_saved.per_device_bytes * 2 == x_saved.bytes
  costs = compile_costs(step, w, x)
  assert costs.num_devices == 8 and costs.argument_bytes < (w.size + x.size) * 4

  data_mesh = examples.data_model_mesh(8, 1)
  inside = jax.shard_map(
      lambda w, x: jax.lax.psum(jnp.sum(rx.checkpoint(
          layer, policy=cp.save_only_these_names('h'))(w, x)), 'data'),
      mesh=data_mesh, in_specs=(P(), P('data')), out_specs=P())
  report = analyze(inside, w, x)
  assert report.num_devices == 8
  (block,) = report.blocks
  (h,) = [r for r in block.residuals if r.name == 'h']
  assert h.shape == (8, 16) and h.per_device_shape == h.shape  # a body's shapes are local
  stacked = [r for r in report.residuals if r.primitive == 'shard_map']
  assert stacked and all(r.per_device_bytes * 8 == r.bytes for r in stacked)
  assert compile_costs(inside, w, x).collective_count >= 1


def _explicit_mesh_layer(seed):
  """A layer on a 2 x 4 mesh with Explicit axes, its weights sharded by
  columns and its batch by rows: (mesh, loss, w, x)."""
  explicit = jax.sharding.AxisType.Explicit
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(explicit,) * 2)
  k = jax.random.split(jax.random.key(seed), 2)
  w = jax.device_put(jax.random.normal(k[0], (16, 16)) / 4, NamedSharding(mesh, P(None, 'model')))
  x = jax.device_put(jax.random.normal(k[1], (64, 16)), NamedSharding(mesh, P('data')))

  def layer(w, x):
    h = rx.checkpoint_name(jnp.sin(x @ w), 'h')
    return jnp.tanh(jnp.matmul(h, w, out_sharding=P('data')))

  loss = lambda w, x: jnp.sum(rx.checkpoint(layer, policy=cp.save_only_these_names('h'))(w, x) ** 2)
  return mesh, loss, w, x


def test_a_program_under_set_mesh_with_explicit_axes():
  """Inside ``jax.set_mesh``, with Explicit axes: shardings are in the types,
  and bare PartitionSpecs name the context's mesh."""
  mesh, loss, w, x = _explicit_mesh_layer(29)
  with jax.set_mesh(mesh):
    report = analyze(loss, w, x)
    costs = compile_costs(loss, w, x)
    # compare analyzes on a second thread: the mesh goes with it.
    comparison = compare(loss, w, x, policies=['nothing_saveable'])
  (h,) = [r for r in report.residuals if r.name == 'h']
  assert h.per_device_shape == (32, 4) and h.per_device_bytes * 8 == h.bytes
  assert report.num_devices == costs.num_devices == 8 and costs.collective_count >= 1
  assert comparison.num_devices == 8 and not any(r.failed for r in comparison.rows)


def test_the_explorer_keeps_the_mesh_it_was_opened_under():
  """Widget callbacks and compiles run outside the ``jax.set_mesh`` block
  that opened the Explorer; they must still trace under its mesh."""
  mesh, loss, w, x = _explicit_mesh_layer(31)
  with jax.set_mesh(mesh):
    explorer = rx.explore(loss, w, x)
  explorer.wait(300)
  explorer.policy.value = 'dots_saveable'  # outside the block now
  explorer.wait(300)
  assert 'error' not in explorer.error.value, explorer.error.value
  assert 'compiled under dots_saveable' in explorer.costs_view.value


def test_arguments_on_different_meshes_are_refused():
  loss, args, _ = _mlp_on(examples.data_model_mesh(2, 2), seed=17)
  other = examples.data_model_mesh(2, 2, devices=jax.devices()[4:])
  moved = jax.device_put(args[1], NamedSharding(other, P('data')))
  for entry in (analyze, compile_costs):
    with pytest.raises(ValueError, match=r"args\[0\]\['w1'\] on mesh data=2 × model=2.*"
                                         r"args\[1\] on mesh"):
      entry(loss, args[0], moved)


def test_compare_and_search_report_per_device():
  mesh = examples.data_model_mesh(2, 4)
  loss_fn, args = examples.sharded_transformer(mesh, batch=8, seed=19)
  comparison = compare(loss_fn, *args, policies=['nothing_saveable'],
                       include_as_written=False)
  assert comparison.num_devices == 8 and dict(comparison.mesh_shape) == {'data': 2, 'model': 4}
  for row in comparison.rows:
    assert row.residual_bytes_per_device < row.residual_bytes
    assert row.collectives == row.costs.collective_count > 0
  assert comparison.baseline.recompute_collectives == 0
  # The per-device figures survive JSON, row for row.
  data = json.loads(json.dumps(comparison.to_dict()))
  assert (data['num_devices'], dict(data['mesh_shape'])) == (8, {'data': 2, 'model': 4})
  assert [(r['residual_bytes_per_device'], r['collectives']) for r in data['rows']] == [
      (r.residual_bytes_per_device, r.collectives) for r in comparison.rows]


def test_search_prices_per_device_and_counts_every_compile():
  loss_fn, args, _ = _mlp_on(examples.data_model_mesh(2, 4), seed=23)
  before = compiles_run()
  result = search_policy(loss_fn, *args, memory_budget=0.5)
  assert result.fits and result.peak_bytes <= result.budget_bytes
  assert result.costs.num_devices == 8
  # Every compile the search ran is in the count, and pricing a choice asks
  # the partitioner's propagation where its residuals lie, not a compile of
  # its forward pass: no more compiles than candidates.
  assert result.compiles_used == compiles_run() - before
  assert result.compiles_used <= len(result.candidates)


@pytest.mark.parametrize('program', ['mlp 2x4', 'mlp 4x2', 'transformer', 'scanned transformer',
                                     'fsdp transformer'])
def test_residuals_lie_where_the_compiled_forward_pass_puts_them(program, monkeypatch):
  """Where each residual lies comes from Shardy's propagation, run on the
  forward pass without compiling it: every output is sharded as the same
  forward pass compiled puts it, and ``analyze`` compiles nothing."""
  from remat_explorer.analysis import clear_caches
  from remat_explorer.analysis.split import sharding
  mesh = examples.data_model_mesh(*{'mlp 4x2': (4, 2)}.get(program, (2, 4)))
  if program.startswith('mlp'):
    loss, args, _ = _mlp_on(mesh, seed=31)
  else:
    loss, args = examples.sharded_transformer(mesh, use_scan=program.startswith('scanned'),
                                              fsdp=program.startswith('fsdp'), seed=31)
  asked = []
  propagated_shardings = sharding.propagated_shardings

  def checked(lowered, leaves, outputs):
    answer = propagated_shardings(lowered, leaves, outputs)
    compiled = lowered.compile().output_shardings
    shapes = [o.shape for o in jax.tree.leaves(
        lowered.out_info, is_leaf=lambda o: hasattr(o, 'shape'))]
    assert answer is not None and len(answer) == len(compiled) == len(shapes) == outputs
    for mine, xla, shape in zip(answer, compiled, shapes):
      assert mine.is_equivalent_to(xla, len(shape)), (mine, xla, shape)
    asked.append(sum(not s.is_fully_replicated for s in answer))
    return answer

  clear_caches()
  monkeypatch.setattr(sharding, 'propagated_shardings', checked)
  before = compiles_run()
  report = analyze(loss, *args)
  assert compiles_run() == before
  assert asked and asked[0] > 0, asked  # some residual is split
  assert report.residual_bytes_per_device < report.residual_bytes


# -- viz ---------------------------------------------------------------------------------

def test_residual_table_and_diagram_show_the_shards():
  mesh = examples.data_model_mesh(2, 4)
  loss, args, _ = _mlp_on(mesh, seed=23, policy=cp.save_only_these_names('hidden'))
  report = analyze(loss, *args)
  html = viz.residual_table_html(report)
  assert '<th>per device</th>' in html and '<th>sharding</th>' in html
  hidden = next(r for r in report.residuals if r.name == 'hidden')
  assert f'{hidden.per_device_shape}' in html
  assert 'data=2 × model=4' in html
  dot = viz.split_graph(report).source
  local = ','.join(map(str, hidden.per_device_shape))
  assert re.search(rf'· f32\[{local}\] [\d.]+ KiB/device', dot), dot[:2000]
