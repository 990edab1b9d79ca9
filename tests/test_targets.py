"""Compiling for accelerators this machine does not have: TPU topologies
(libtpu) and GPUs described by a target config (JAX's CUDA plugin).

Every figure is checked against XLA compiled by hand for the same target,
in the same test: the platform and device kind, XLA's peak and the
timeline's own peak, the memory figures, the executed FLOPs with every
loop's trips (against the unrolled program's XLA count), what is live at
the peak, and the device's memory.
"""

import html
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import remat_explorer as rx
from remat_explorer import examples
from remat_explorer.analysis.targets import device_memory, gpu_configs
from remat_explorer.analysis import recompute_eliminated
from tests.by_hand import step_by_hand

TARGETS = ('v5e:2x2', 'v4:2x2x1', 'h100:8')
GIB = 1 << 30


def _stack(mesh, *, layers=4, batch=None, seq=128, width=512, seed=0):
  """A residual tanh stack under ``scan``, its weights replicated and its
  batch split over 'data': abstract arguments, sizes drawn from `seed`."""
  rng = np.random.default_rng(seed)
  batch = batch or 4 * mesh.size
  width = width + 128 * int(rng.integers(0, 2))
  w = jax.ShapeDtypeStruct((layers, width, width), jnp.float32,
                           sharding=NamedSharding(mesh, P()))
  x = jax.ShapeDtypeStruct((batch, seq, width), jnp.float32,
                           sharding=NamedSharding(mesh, P('data')))
  return w, x


def _loss(policy=None, unroll=1):
  def body(x, w):
    return x + jnp.tanh(x @ w), None
  step = body if policy is None else rx.checkpoint(body, policy=policy)

  def loss(w, x):
    x, _ = jax.lax.scan(step, x, w, unroll=unroll)
    return jnp.mean(x ** 2)
  return loss


# -- targets ---------------------------------------------------------------------

def test_target_meshes_hold_the_devices_and_memory_of_each_target():
  v5e = rx.target_mesh('v5e:2x2', {'data': 2, 'model': 2})
  assert dict(v5e.shape) == {'data': 2, 'model': 2}
  assert {d.device_kind for d in v5e.devices.flat} == {'TPU v5 lite'}
  assert device_memory.device_memory_bytes(v5e.devices.flat[0]) == 16 * GIB
  # v4 runs each chip's two cores as one device (megacore), as JAX does on one.
  v4 = rx.target_mesh('v4:2x2x1')
  assert v4.size == 4 and device_memory.device_memory_bytes(v4.devices.flat[0]) == 32 * GIB
  h100 = rx.target_mesh('h100:2x4', {'data': 8})
  assert h100.size == 8
  assert {d.device_kind for d in h100.devices.flat} == {'NVIDIA H100 80GB HBM3'}
  assert {d.process_index for d in h100.devices.flat} == {0, 1}  # 2 hosts of 4
  assert device_memory.device_memory_bytes(h100.devices.flat[0]) == 84978434048
  # The same target twice gives the same devices, so shardings built on one
  # mesh fit arguments built on the other.
  assert rx.target_mesh('v5e:2x2').devices.flat[0] is v5e.devices.flat[0]


def test_a_config_captured_by_a_newer_jaxlib_loads_without_what_xla_does_not_know():
  """The H200's config was captured from a live H200 by JAX 0.11.2's jaxlib;
  XLA's parser refuses a field it does not know, so an older XLA would
  fail on it. The fields it refuses are left out, and a config the user
  registered says which; a field XLA knows is never dropped."""
  shipped = gpu_configs.gpu_target('h200')
  h200 = rx.target_mesh('h200:2')
  assert {d.device_kind for d in h200.devices.flat} == {'NVIDIA H200'}
  assert device_memory.device_memory_bytes(h200.devices.flat[0]) == shipped.memory_bytes
  # A registered copy with a field no XLA knows: dropped, and said.
  made_up = shipped.config.replace('  core_count: 132\n',
                                   '  core_count: 132\n  made_up_field: 7\n')
  rx.register_gpu_target('h200_copy', made_up)
  with pytest.warns(UserWarning, match='made_up_field'):
    copy = rx.target_mesh('h200_copy:2')
  assert {d.device_kind for d in copy.devices.flat} == {'NVIDIA H200'}
  # What is left is the config less that field: the same compiled figures.
  w, x = _stack(h200, layers=2, seed=9)
  w2, x2 = _stack(copy, layers=2, seed=9)
  a, b = rx.compile_costs(_loss(), w, x), rx.compile_costs(_loss(), w2, x2)
  assert (a.peak_bytes, a.executed_flops) == (b.peak_bytes, b.executed_flops)
  assert gpu_configs.without_field(made_up, 'made_up_field') == shipped.config
  assert 'cuda_compute_capability' not in gpu_configs.without_field(
      shipped.config, 'cuda_compute_capability')


def test_targets_refuse_what_they_cannot_make_in_one_line(monkeypatch):
  cases = [
      (('v5e:2x2', {'data': 3}), "'v5e:2x2' has 4 devices, but axes {'data': 3} make 3"),
      (('v5e:3x3',), "libtpu has no TPU topology 'v5e:3x3'"),
      (('b200:8',), 'rx.gpu_target_config()'),
      (('gtx9000',), 'known GPUs: a100'),
      (('v5e:2x2', {'data': 0}), 'axes must map axis names to sizes'),
  ]
  for args, words in cases:
    with pytest.raises(ValueError, match=None) as e:
      rx.target_mesh(*args)
    assert words in str(e.value) and '\n' not in str(e.value), str(e.value)
  from remat_explorer import engine
  monkeypatch.setattr(engine, 'tpu_support_installed', lambda: False)
  monkeypatch.setattr(engine, 'cuda_plugin_installed', lambda: False)
  with pytest.raises(ModuleNotFoundError, match=r"remat_explorer\[tpu\]"):
    rx.target_mesh('v6e:2x2')
  with pytest.raises(ModuleNotFoundError, match=r"remat_explorer\[cuda\]"):
    rx.target_mesh('a100:2')


def test_a_registered_gpu_config_is_the_one_compiled_for():
  config = gpu_configs.gpu_target('h100').config
  captured = (config.replace('NVIDIA H100 80GB HBM3', 'NVIDIA H100 (captured)')
              .replace('84978434048', str(60 * GIB)))
  rx.register_gpu_target('labgpu', captured)
  mesh = rx.target_mesh('labgpu:2')
  assert mesh.devices.flat[0].device_kind == 'NVIDIA H100 (captured)'
  w, x = _stack(mesh, layers=2, seq=64, width=256)
  costs = rx.compile_costs(_loss(rx.checkpoint_policies.nothing_saveable), w, x)
  assert costs.device_kind == 'NVIDIA H100 (captured)'
  assert costs.device_memory_bytes == 60 * GIB
  assert costs.memory_share == pytest.approx(costs.peak_bytes / (60 * GIB))
  with pytest.raises(ValueError, match='GpuTargetConfig'):
    rx.register_gpu_target('other', 'not a config')


# -- every figure, XLA's for the target ---------------------------------------------

@pytest.mark.parametrize('target', TARGETS)
def test_every_figure_is_xlas_for_the_target(target):
  mesh = rx.target_mesh(target)
  w, x = _stack(mesh, seed=len(target))
  loss = _loss(rx.checkpoint_policies.nothing_saveable)
  costs = rx.compile_costs(loss, w, x)
  hand = step_by_hand(loss, w, x)
  memory = hand.memory_analysis()
  device = mesh.devices.flat[0]
  assert costs.platform == device.platform and costs.platform in ('tpu', 'gpu')
  assert costs.device_kind == device.device_kind
  assert costs.num_devices == mesh.size
  assert costs.peak_bytes == memory.peak_memory_in_bytes
  assert (costs.argument_bytes, costs.output_bytes, costs.temp_bytes) == (
      memory.argument_size_in_bytes, memory.output_size_in_bytes,
      memory.temp_size_in_bytes)
  # The timeline's own peak: XLA's heap simulation, replayed along the schedule.
  assert costs.timeline.peak_bytes == pytest.approx(memory.peak_memory_in_bytes, rel=0.01)
  assert costs.device_memory_bytes == device_memory.device_memory_bytes(device) > 0
  assert costs.memory_share == pytest.approx(
      memory.peak_memory_in_bytes / costs.device_memory_bytes)
  assert costs.fits
  assert not any('unknown trip count' in n for n in costs.notes), costs.notes
  # Collectives per device, by pass: the weights' gradient summed over 'data'.
  reductions = hand.as_text().count('all-reduce-start(') + len(
      [l for l in hand.as_text().splitlines() if ' all-reduce(' in l])
  assert reductions >= 1
  assert costs.collective_count >= 1
  assert any(c.phase == 'backward' for c in costs.collectives), costs.collectives


@pytest.mark.parametrize('target', ('v5e:2x2', 'h100:8'))
def test_executed_flops_count_every_trip_of_every_loop(target):
  """A scan without remat executes what its unrolled form does: XLA's own
  count of the unrolled program where XLA gives one (TPU), the count of its
  optimized module otherwise (a compile-only GPU has no cost analysis).
  Gradients of both arguments, so the unrolled form drops no work the loop
  must do (the first layer's input gradient)."""
  mesh = rx.target_mesh(target)
  w, x = _stack(mesh, layers=3, seed=3)
  rolled = rx.compile_costs(_loss(), w, x, argnums=(0, 1))
  unrolled = rx.compile_costs(_loss(unroll=True), w, x, argnums=(0, 1))
  assert rolled.loops_of_unknown_trip_count == 0
  hand_unrolled = step_by_hand(_loss(unroll=True), w, x, argnums=(0, 1))
  xla = hand_unrolled.cost_analysis()
  if target.startswith('v'):
    reference = xla['flops']
    hand_rolled = step_by_hand(_loss(), w, x, argnums=(0, 1)).cost_analysis()['flops']
    assert rolled.xla_flops == hand_rolled  # each loop body once, as XLA counts
    assert rolled.executed_flops > 2 * hand_rolled  # three trips of the bodies
  else:
    assert not xla  # what makes counting from the module necessary
    reference = unrolled.executed_flops
  assert rolled.executed_flops == pytest.approx(reference, rel=0.02)
  # Per device: a quarter (an eighth) of the global matmul FLOPs.
  layers, width = w.shape[0], w.shape[1]
  matmuls = 3 * 2 * x.shape[0] * x.shape[1] * width * width * layers / mesh.size
  assert matmuls <= rolled.executed_flops <= 1.1 * matmuls


def test_a_gpus_matmuls_count_whether_triton_or_cublas_runs_them():
  """XLA:GPU runs a matmul in a Triton GEMM fusion or hands it to cuBLAS as
  a custom call (a live GPU's autotuner picks; ``xla_gpu_enable_triton_gemm``
  off forces cuBLAS here). XLA's cost analysis counts a custom call as
  nothing; the executed FLOPs count each as the dot it replaces, so either
  way they are the step's FLOPs as XLA:CPU counts the same step."""
  mesh = rx.target_mesh('h100')
  w, x = _stack(mesh, layers=3, seed=5)
  policy = jax.checkpoint_policies.nothing_saveable
  cublas_options = {'xla_gpu_enable_triton_gemm': False}
  assert '__cublas' in jax.jit(jax.grad(_loss(policy))).lower(w, x).compile(
      compiler_options=cublas_options).as_text()
  triton = rx.compile_costs(_loss(policy), w, x)
  cublas = rx.compile_costs(_loss(policy), w, x, compiler_options=cublas_options)
  on_cpu = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, x)]
  cpu = rx.compile_costs(_loss(policy), *on_cpu)
  assert cpu.platform == 'cpu' and cublas.platform == 'gpu'
  assert triton.executed_flops == pytest.approx(cpu.executed_flops, rel=0.01)
  assert cublas.executed_flops == pytest.approx(cpu.executed_flops, rel=0.01)


def test_a_gpu_merging_matmuls_is_not_taken_for_a_merged_recompute():
  """XLA:GPU merges matmuls that share an operand (a layer's query, key and
  value projections), so its optimized program has fewer matmuls whether or
  not it kept the recompute. The FLOPs it executes decide: under the
  barrier the recompute runs (no flag, though matmuls were merged); with no
  lowering XLA drops it, and says so."""
  mesh = rx.target_mesh('h100')
  loss, args = examples.transformer(use_scan=False, num_layers=1, d_model=128, seq_len=128,
                                    batch=2, seed=int(np.random.default_rng(7).integers(1000)))
  args = rx.on_target(args, mesh)
  policy = jax.checkpoint_policies.nothing_saveable
  flags = {}
  for lowering in ('barrier', 'none'):
    costs = rx.compile_costs(loss, *args, policy=policy, lowering=lowering)
    report = rx.analyze(loss, *args, policy=policy, lowering=lowering)
    assert costs.compiled_matmuls < costs.lowered_matmuls
    flags[lowering] = recompute_eliminated(report, costs)
    executed = costs.executed_flops - (report.forward_flops + report.backward_flops)
    if lowering == 'barrier':  # the recompute runs (its elementwise work fused alike)
      assert abs(executed) < 0.1 * report.recompute_flops
  assert flags['barrier'] is None
  assert flags['none'] is not None and 'fewer than' in flags['none']


def test_the_timeline_follows_the_tpus_on_chip_heap_where_xla_does():
  """A program small enough to live in a TPU's on-chip memory: XLA:TPU's
  figure is that heap's peak, and so is the timeline's."""
  mesh = rx.target_mesh('v5e:2x2')
  w, x = _stack(mesh, layers=4, batch=16, seq=64, width=256)
  loss = _loss(rx.checkpoint_policies.everything_saveable)
  costs = rx.compile_costs(loss, w, x)
  xla = step_by_hand(loss, w, x).memory_analysis().peak_memory_in_bytes
  assert costs.timeline.peak_memory == 'on-chip'
  assert costs.timeline.peak_bytes == pytest.approx(xla, rel=0.01)
  report = rx.analyze(loss, w, x)
  explained = rx.analysis.explain_peak(report, costs)
  assert 'on-chip memory' in explained.gap_reason
  assert explained.listed_bytes < explained.peak_bytes


# -- the other entry points, on abstract sharded arguments ----------------------------

@pytest.fixture(scope='module')
def tpu_transformer():
  mesh = rx.target_mesh('v5e:2x2', {'data': 2, 'model': 2})
  return examples.sharded_transformer(mesh, num_layers=2, d_model=128, num_heads=4,
                                      seq_len=64, batch=8, use_scan=True, fsdp=True)


def test_examples_are_abstract_and_sharded_on_a_target_mesh(tpu_transformer):
  _, (params, batch) = tpu_transformer
  leaves = jax.tree_util.tree_leaves((params, batch))
  assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)
  wq = params['blocks']['wq']
  assert wq.sharding.spec == P(None, 'data', 'model')  # FSDP over data, TP over model
  assert batch['tokens'].sharding.spec == P('data', None)


def test_what_is_live_at_the_peak_is_named_on_the_target(tpu_transformer):
  loss, args = tpu_transformer
  report = rx.analyze(loss, *args)
  costs = rx.compile_costs(loss, *args)
  live = rx.live_at_peak(report, costs)
  paths = {b.label for b in live if b.kind == 'parameter'}
  assert paths and all(p.startswith(("params['", "data['")) for p in paths), paths
  assert sum(b.bytes for b in live) <= costs.timeline.peak_bytes
  labels = ' '.join(b.label for b in live)
  copies = [b for b in costs.timeline.live_at(costs.timeline.peak_step)
            if b.opcode in ('copy-start', 'all-reduce-start', 'all-gather-start')]
  if copies:  # where XLA moves data in the background at the peak, it says so
    assert 'asynchronous' in labels or 'collective' in labels
  # A comparison's rows are the target's too (the program as written is
  # the one compiled above; one policy beside it).
  rows = rx.compare(loss, *args, policies=['dots_saveable'], include_no_remat=False)
  assert rows.platform == 'tpu' and rows.device_kind == 'TPU v5 lite'
  assert len(rows.rows) == 2
  for row in rows.rows:
    assert row.costs.platform == 'tpu' and row.costs.device_memory_bytes == 16 * GIB


@pytest.mark.parametrize('target', ['h100', 'v5e:2x2'])
def test_each_buffer_on_a_target_has_the_stack_jax_recorded(target):
  """The Python stack behind each buffer is the one JAX recorded for the
  equation that computed it, which no backend changes: on a target, each
  name stack has the innermost frames the CPU's compile of the same
  program gives it. The table of frames XLA dumps with an accelerator's
  module numbers them apart from the executable's own: read from it, the
  MLP's matmuls named the loss's line, not the layer's."""
  loss, args = examples.mlp(num_layers=3, width=64, batch=16,
                            seed=int(np.random.default_rng(1015).integers(1 << 16)))

  def innermost_frames(costs):
    frames = {}
    for buffer in costs.timeline.buffers:
      if buffer.frames and buffer.op_name:
        frames.setdefault(buffer.op_name, set()).add(buffer.frames[-1])
    return frames
  on_cpu = innermost_frames(rx.compile_costs(loss, *args))
  device = rx.target_mesh(target).devices.flat[0]
  one = jax.sharding.Mesh(np.array([device]), ('data',))
  on_target = innermost_frames(rx.compile_costs(loss, *rx.on_target(args, one)))
  both = on_cpu.keys() & on_target.keys()
  assert len(both) >= 5, (on_cpu.keys(), on_target.keys())
  assert {k: on_target[k] for k in both} == {k: on_cpu[k] for k in both}
  # Premise: the layer's own line is among them.
  assert any(function.endswith('layer') for k in both for _, _, function in on_target[k])


def test_buffers_listed_above_xlas_heap_at_the_peak_are_said_to_be():
  """On a GPU the peak is XLA's heap simulation, and the buffers listed
  there can still hold one at another step than the heap does where the
  liveness model places it (output storage): under dots_saveable the
  sharded transformer's add up to 2 MiB more than XLA's peak over 8
  H100s. The explanation says so, in the view too, instead of a gap XLA's
  heap holds beyond them."""
  from remat_explorer.viz.charts import timeline_view
  from remat_explorer.viz.html import timeline_html
  from remat_explorer.viz.text import format_bytes
  mesh = rx.target_mesh('h100:8', {'data': 4, 'model': 2})
  loss, args = examples.sharded_transformer(
      mesh, abstract=True, num_layers=2, d_model=512, num_heads=8, seq_len=256, batch=16,
      policy=jax.checkpoint_policies.dots_saveable)
  report, costs = rx.analyze(loss, *args), rx.compile_costs(loss, *args)
  explained = rx.analysis.explain_peak(report, costs)
  by_hand = step_by_hand(loss, *args).memory_analysis().peak_memory_in_bytes
  assert explained.peak_bytes == costs.peak_bytes == by_hand
  assert explained.gap_bytes < 0  # premise
  assert explained.listed_bytes == sum(b.bytes for b in rx.live_at_peak(report, costs))
  assert explained.gap_reason.startswith("they add up to more than XLA's heap")
  page = timeline_html.timeline_html(timeline_view.timeline_view(report, costs))
  (said,) = re.findall(r'<p class="remat-caption remat-peak-gap">(.*?)</p>', page, re.S)
  assert (f'{format_bytes(-explained.gap_bytes)} more than the peak of '
          f'{format_bytes(explained.peak_bytes)}') in html.unescape(said)


def test_the_buffers_live_at_each_step_are_those_xlas_heap_holds():
  """On a GPU the placed curve is XLA's heap simulation along the
  schedule, and each buffer of the entry computation is live at the steps
  that simulation holds it: the buffers live at a step add up to XLA's
  heap there, give or take the few bytes of XLA's own tables. Taken from
  the liveness model, the ranges of the sharded transformer over 8 H100s
  made one step hold 20 MiB (17% of the peak) more than XLA's heap. A
  temporary is held in an output's storage not yet written only where
  XLA placed it in that output's allocation: parked wherever it fit, as
  XLA:CPU parks them, one of the scanned MLP's 8 MiB stacked temporaries
  left a step of its forward pass 8 MiB under XLA's heap."""
  everything = jax.checkpoint_policies.everything_saveable
  mesh = rx.target_mesh('h100:8', {'data': 4, 'model': 2})
  sharded = examples.sharded_transformer(
      mesh, abstract=True, num_layers=2, d_model=256, num_heads=4, seq_len=256, batch=32,
      policy=everything)
  one = jax.sharding.Mesh(np.array(mesh.devices.flat[:1]), ('data',))
  loss, args = examples.mlp(abstract=True, policy=everything)
  scanned = loss, rx.on_target(args, one)
  for loss, args in (sharded, scanned):
    costs = rx.compile_costs(loss, *args)
    assert costs.peak_bytes == step_by_hand(loss, *args).memory_analysis().peak_memory_in_bytes
    timeline = costs.timeline
    apart = [live - placed for live, placed in zip(timeline.live_bytes, timeline.placed_bytes)]
    assert max(map(abs, apart)) <= 1024, (max(apart), min(apart))
    explained = rx.analysis.explain_peak(rx.analyze(loss, *args), costs)
    assert 0 <= explained.gap_bytes <= 1024, explained.gap_bytes


def test_a_search_budget_may_be_a_share_of_the_devices_memory():
  mesh = rx.target_mesh('a100_40gb')
  loss, args = examples.mlp(num_layers=4, width=256, batch=64, abstract=True)
  args = rx.on_target(args, mesh)
  found = rx.search_policy(loss, *args, memory_budget='50%')
  assert found.budget_bytes == 42331013120 // 2
  assert found.fits and found.costs.platform == 'gpu'
  cpu_loss, cpu_args = examples.mlp(num_layers=2, width=32, batch=8)
  with pytest.raises(ValueError, match='memory of'):
    rx.search_policy(cpu_loss, *cpu_args, memory_budget='50%')
  with pytest.raises(ValueError, match='percentage'):
    rx.search_policy(cpu_loss, *cpu_args, memory_budget='150%')


def test_a_search_ranked_by_estimate_takes_a_budget_in_bytes_per_device():
  """A sharded program's estimate is the whole program's (``num_devices``
  says over how many devices), and a budget in bytes is per device. The
  search ranked by estimate calibrates on the two built-ins it compiles
  first: it takes a budget below the whole program's arguments, no
  built-in that fits the budget, compiled, beats its answer, and the
  candidates it did not compile are given per device. (Taken as they
  were, the whole program's arguments put such a budget below what any
  policy could fit, and it was refused.)"""
  mesh = rx.target_mesh('h100:8')
  seed = int(np.random.default_rng(41).integers(1000))
  loss, (params, batch) = examples.mlp(num_layers=4, width=128, batch=8192, seed=seed,
                                       abstract=True)
  params, batch = rx.on_target((params, batch), mesh, (P(), P('data')))
  cp = rx.checkpoint_policies
  ends = [rx.compile_costs(loss, params, batch, policy=policy)
          for policy in (cp.nothing_saveable, cp.everything_saveable)]
  estimate = rx.estimate_costs(loss, params, batch, policy=cp.nothing_saveable)
  assert estimate.num_devices == ends[0].num_devices == 8
  whole = estimate.argument_bytes + estimate.output_bytes
  budget = (ends[0].peak_bytes + ends[1].peak_bytes) // 2
  assert budget < whole, (budget, whole)
  rx.clear_caches()  # the search's own compiles counted
  found = rx.search_policy(loss, params, batch, memory_budget=budget, rank_by_estimate=True)
  assert found.fits and found.peak_bytes <= budget and found.compiles_used <= 3
  compiled = {label: rx.compile_costs(loss, params, batch, policy=policy) for label, policy in
              (('no remat', rx.analysis.NO_REMAT), ('nothing_saveable', cp.nothing_saveable),
               ('dots_with_no_batch_dims_saveable', cp.dots_with_no_batch_dims_saveable),
               ('dots_saveable', cp.dots_saveable),
               ('everything_saveable', cp.everything_saveable))}
  beaten = [label for label, c in compiled.items()
            if c.peak_bytes <= budget and c.executed_flops < found.flops]
  assert not beaten, (found.label, found.flops, beaten)
  estimated = [c for c in found.candidates if c.estimated and c.label in compiled]
  assert estimated
  for c in estimated:
    assert abs(c.peak_bytes / compiled[c.label].peak_bytes - 1) < 0.1, (c, compiled[c.label])
    assert abs(c.flops / compiled[c.label].executed_flops - 1) < 0.1, (c, compiled[c.label])


# -- a quiet start ---------------------------------------------------------------

def test_import_starts_no_backend_and_targets_start_quietly():
  """libtpu and the CUDA plugin announce, on a machine without their
  hardware, that it is missing; the explorer keeps that from its user, and
  importing it starts no backend."""
  script = textwrap.dedent('''
      import jax, jax.numpy as jnp
      import remat_explorer as rx
      from jax._src import xla_bridge
      assert not xla_bridge.backends_are_initialized(), 'import started a backend'
      import sys
      print('--- after import ---', file=sys.stderr, flush=True)
      for target in ('v5e:2x2', 'h100:4'):
        mesh = rx.target_mesh(target)
        x = jax.ShapeDtypeStruct((8, 64), jnp.float32,
                                 sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data')))
        print(rx.compile_costs(lambda x: jnp.sum(jnp.sin(x) ** 2), x).platform)
  ''')
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                        env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ['tpu', 'gpu']
  after_import = done.stderr.split('--- after import ---', 1)[1]
  for notice in ('TPU_ACCELERATOR_TYPE', 'Unable to load CUDA', 'plugin configuration error',
                 'TPU_WORKER_HOSTNAMES'):
    assert notice not in after_import, after_import[-2000:]


# -- the report CLI --------------------------------------------------------------

def test_the_report_cli_compiles_for_a_target(tmp_path, capsys):
  from remat_explorer.__main__ import report_main
  out = tmp_path / 'report.html'
  assert report_main(['--model', 'mlp', '--target', 'h100:2', '--mesh', 'data=2',
                      '--out', str(out)]) == 0
  page = out.read_text()
  assert 'Device: NVIDIA H100 80GB HBM3 (gpu, 79.1 GiB of memory each)' in page
  assert re.search(r'<td>[0-9.]+% of 79\.1 GiB</td>', page)
  assert 'compiling for 2 × NVIDIA H100 80GB HBM3' in capsys.readouterr().out
  for argv, words in ((['--mesh', 'data=2'], '--mesh needs --target'),
                      (['--target', 'h100:2', '--mesh', 'data=two'], 'axis=size pairs'),
                      (['--target', 'h100:2', '--mesh', 'data=3'], "has 2 devices")):
    with pytest.raises(SystemExit, match=words):
      report_main(['--model', 'mlp', '--out', str(out), *argv])


def test_the_explorer_shows_the_target_and_its_memory():
  mesh = rx.target_mesh('h100:2')
  w, x = _stack(mesh, layers=2, seq=64, width=256, seed=11)
  explorer = rx.explore(_loss(rx.checkpoint_policies.dots_saveable), w, x)
  explorer.wait(300)
  assert 'error' not in explorer.error.value, explorer.error.value
  for view in (explorer.residual_view, explorer.costs_view):
    caption = re.search(r'<p class="remat-caption">(.*?)</p>', view.value).group(1)
    assert 'NVIDIA H100 80GB HBM3' in caption, caption
  costs = rx.compile_costs(_loss(rx.checkpoint_policies.dots_saveable), w, x)
  share = re.escape(rx.viz.memory_share_text(costs.peak_bytes, costs.device_memory_bytes))
  assert re.search(share, explorer.costs_view.value)


def test_a_step_that_does_not_fit_the_target_is_refused_not_fatal():
  """XLA:TPU refuses a step that does not fit the chip: its row fails with
  XLA's reason, the analysis goes on, and the search answers a policy that
  fits."""
  mesh = rx.target_mesh('v5e:2x2')
  w, x = _stack(mesh, layers=32, batch=64, seq=3072, width=1024, seed=2)
  loss = _loss(rx.checkpoint_policies.nothing_saveable)
  table = rx.compare(loss, w, x, policies=['nothing_saveable', 'everything_saveable'],
                     include_no_remat=False, suggest_lowering=False)
  refused = table.row('everything_saveable')
  assert refused.failed and 'Ran out of memory' in refused.costs.error
  assert not table.row('nothing_saveable').failed
  assert table.row('nothing_saveable').costs.fits
  found = rx.search_policy(loss, w, x, memory_budget='90%')
  assert found.fits and found.peak_bytes <= 0.9 * 16 * GIB
  assert ('everything_saveable', False) in [(c.label, c.fits) for c in found.candidates]


def test_a_search_where_xla_refuses_every_candidate_for_memory_says_so():
  """Weights whose gradients alone exceed a v5e chip's 16 GiB: XLA:TPU
  refuses every candidate. Nothing fits, and the answer says why in XLA's
  words, rather than quoting a peak that no compile gave; the Pareto chart
  draws the budget without a searched point. A fraction of the way between
  two built-ins XLA refused has no size: an error says to pass bytes or a
  share instead."""
  from remat_explorer import viz
  mesh = rx.target_mesh('v5e:2x2')
  w, x = _stack(mesh, layers=8, seq=8, width=16384, seed=1)
  loss = _loss(rx.checkpoint_policies.nothing_saveable)
  found = rx.search_policy(loss, w, x, memory_budget='90%')
  assert not found.fits and found.peak_bytes is None
  assert found.candidates and not any(c.fits for c in found.candidates)
  assert 'refused every candidate' in found.explanation
  assert 'Ran out of memory' in found.explanation and '\n' not in found.explanation
  table = rx.compare(loss, w, x, policies=['nothing_saveable'], include_no_remat=False,
                     suggest_lowering=False)
  viz.plot_pareto(table, search_result=found)
  with pytest.raises(RuntimeError, match='pass bytes'):
    rx.search_policy(loss, w, x, memory_budget=0.5)


def test_a_concrete_array_beside_a_targets_arguments_goes_to_the_target():
  """An array made on this machine (uncommitted, as ``jax.random`` makes
  it) beside shapes sharded over a target mesh: jit moves it to the
  target, and every figure is the target's, not the CPU's."""
  mesh = rx.target_mesh('h100:8')
  w = jax.random.normal(jax.random.key(3), (256, 256))
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, P('data')))
  loss = lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2)
  costs = rx.compile_costs(loss, w, x)
  by_hand = step_by_hand(loss, w, x)
  assert (costs.platform, costs.device_kind) == ('gpu', 'NVIDIA H100 80GB HBM3'), costs.device_kind
  assert costs.num_devices == 8 and costs.fits is True
  assert costs.peak_bytes == by_hand.memory_analysis().peak_memory_in_bytes


def test_arrays_a_user_has_are_placed_on_a_target_as_abstract_shapes():
  """A parameter tree and a batch drawn on this machine, placed with
  ``on_target``: a spec per subtree, the same by a function of each path,
  or replicated; other leaves kept. What ``compile_costs`` measures on
  them is XLA's compile by hand of the same step on the same placement
  written out leaf by leaf."""
  mesh = rx.target_mesh('h100:8', {'data': 2, 'model': 4})
  rng = np.random.default_rng(17)
  params = {'hidden': {'kernel': rng.standard_normal((128, 256), np.float32),
                       'bias': rng.standard_normal(256, np.float32)},
            'out': {'kernel': rng.standard_normal((256, 128), np.float32)}}
  batch = rng.standard_normal((16, 128), np.float32)
  specs = {'hidden': {'kernel': P(None, 'model'), 'bias': P('model')}, 'out': P('model')}
  placed, placed_batch, steps = rx.on_target((params, batch, 3), mesh, (specs, P('data'), None))
  assert steps == 3
  by_path = rx.on_target(params, mesh, lambda path, leaf: {
      'hidden/kernel': P(None, 'model'), 'hidden/bias': P('model')}.get(path, P('model')))
  written_out = {
      'hidden': {'kernel': jax.ShapeDtypeStruct((128, 256), jnp.float32,
                                                sharding=NamedSharding(mesh, P(None, 'model'))),
                 'bias': jax.ShapeDtypeStruct((256,), jnp.float32,
                                              sharding=NamedSharding(mesh, P('model')))},
      'out': {'kernel': jax.ShapeDtypeStruct((256, 128), jnp.float32,
                                             sharding=NamedSharding(mesh, P('model')))}}
  for tree in (placed, by_path):
    assert jax.tree_util.tree_structure(tree) == jax.tree_util.tree_structure(written_out)
    for got, want in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(written_out)):
      assert isinstance(got, jax.ShapeDtypeStruct)
      assert (got.shape, got.dtype) == (want.shape, want.dtype)
      assert got.sharding == want.sharding
  assert placed_batch.sharding == NamedSharding(mesh, P('data'))
  assert all(leaf.sharding == NamedSharding(mesh, P())
             for leaf in jax.tree_util.tree_leaves(rx.on_target(params, mesh)))
  # Each dtype as jit takes the array (float64 is float32 unless x64 is on); a key's kept.
  assert rx.on_target(np.ones(4), mesh).dtype == jnp.asarray(np.ones(4)).dtype
  key = jax.random.key(0)
  assert rx.on_target(key, mesh).dtype == key.dtype

  def loss(params, x):
    h = jnp.tanh(x @ params['hidden']['kernel'] + params['hidden']['bias'])
    return jnp.mean((h @ params['out']['kernel']) ** 2)
  costs = rx.compile_costs(loss, placed, placed_batch)
  hand = step_by_hand(loss, written_out, jax.ShapeDtypeStruct(
      (16, 128), jnp.float32, sharding=NamedSharding(mesh, P('data'))))
  assert (costs.platform, costs.num_devices) == ('gpu', 8)
  assert costs.peak_bytes == hand.memory_analysis().peak_memory_in_bytes


def test_a_linen_models_own_partition_specs_place_its_parameters():
  """Flax's partitioning annotations (``nn.with_partitioning``) read back
  with ``nn.get_partition_spec`` are a tree of specs ``on_target`` takes
  as it is, boxed parameters or unboxed: the weights split over 'model' as
  the model says, and the compile is XLA's compile by hand of the same
  placement."""
  from flax import linen as nn

  class TwoLayers(nn.Module):
    @nn.compact
    def __call__(self, x):
      init = nn.initializers.lecun_normal()
      h = nn.Dense(256, kernel_init=nn.with_partitioning(init, (None, 'model')),
                   name='hidden')(x)
      h = nn.remat(nn.Dense)(256, kernel_init=nn.with_partitioning(init, ('model', None)),
                             name='out')(jnp.tanh(h))
      return jnp.tanh(h)

  model = TwoLayers()
  x = jnp.asarray(np.random.default_rng(23).standard_normal((32, 128), np.float32))
  variables = model.init(jax.random.key(23), x)
  specs = nn.get_partition_spec(variables)['params']
  mesh = rx.target_mesh('h100:8', {'data': 2, 'model': 4})
  batch = rx.on_target(x, mesh, P('data'))
  unboxed = rx.on_target(nn.unbox(variables['params']), mesh, specs)
  boxed = rx.on_target(variables['params'], mesh, specs)
  for params in (unboxed, nn.unbox(boxed)):
    assert params['hidden']['kernel'].sharding.spec == P(None, 'model')
    assert params['out']['kernel'].sharding.spec == P('model', None)
    assert params['hidden']['bias'].sharding.spec == P()

  def loss(params, x):
    return jnp.mean(model.apply({'params': params}, x) ** 2)
  costs = rx.compile_costs(loss, unboxed, batch)
  hand = step_by_hand(loss, unboxed, batch)
  assert (costs.platform, costs.num_devices) == ('gpu', 8)
  assert costs.peak_bytes == hand.memory_analysis().peak_memory_in_bytes
  assert rx.compile_costs(loss, boxed, batch).peak_bytes == costs.peak_bytes


@pytest.mark.parametrize('spec, error, words', [
    (P('modle'), ValueError, ["no axis 'modle'", 'data, model', "'w'"]),
    (P('model'), ValueError, ["'w'", '6 x 8', 'is 6', '4 devices of mesh axis model']),
    (P(('data', 'model')), ValueError, ['8 devices of mesh axis data x model']),
    (P(None, None, 'data'), ValueError, ['3 dimensions', "'w'", 'has 2']),
    ('data', TypeError, ["'w'", 'str, not a PartitionSpec']),
])
def test_a_placement_the_mesh_cannot_make_is_refused_naming_the_array(spec, error, words):
  mesh = rx.target_mesh('h100:8', {'data': 2, 'model': 4})
  params = {'w': np.ones((6, 8), np.float32), 'b': np.ones(8, np.float32)}
  with pytest.raises(error) as raised:
    rx.on_target(params, mesh, {'w': spec, 'b': None})
  message = str(raised.value)
  assert message.startswith('on_target: ') and '\n' not in message, message
  assert all(word in message for word in words), message


def test_a_spec_tree_that_does_not_fit_the_arguments_is_refused_without_their_values():
  mesh = rx.target_mesh('h100:8', {'data': 2, 'model': 4})
  params = {'w': np.full((6, 8), 0.125, np.float32), 'b': np.ones(8, np.float32)}
  for spec in ([P()], {'w': P()}):
    with pytest.raises(ValueError) as raised:
      rx.on_target(params, mesh, spec)
    message = str(raised.value)
    assert message.startswith('on_target: spec must be') and '\n' not in message, message
    assert 'is not a prefix of' in message and '0.125' not in message, message


def test_on_target_takes_a_mesh_not_a_target_name():
  with pytest.raises(TypeError, match=r'^on_target: mesh must be a jax.sharding.Mesh'):
    rx.on_target({'w': np.ones(4, np.float32)}, 'h100:8')


def test_two_targets_of_one_shape_are_not_confused():
  """The same program on two GPUs with meshes of one shape: each result is
  its own target's (a cache keyed on the shardings' text alone would give
  the first for both)."""
  results, loss = {}, _loss(rx.checkpoint_policies.nothing_saveable)
  for target in ('h100:2', 'a100:2'):
    w, x = _stack(rx.target_mesh(target), layers=2, seq=64, width=256, seed=5)
    results[target] = rx.compile_costs(loss, w, x)
  assert results['h100:2'].device_kind == 'NVIDIA H100 80GB HBM3'
  assert results['a100:2'].device_kind == 'NVIDIA A100-SXM4-80GB'
  assert results['a100:2'].device_memory_bytes == 85100068864


def test_a_one_device_target_is_analyzed_without_a_compile():
  """On one device every residual is whole: the analysis asks the
  partitioner nothing, and each residual's shard is the residual itself,
  as the compiled forward pass would say."""
  from remat_explorer.analysis.context import compiles_run
  loss = _loss(rx.checkpoint_policies.dots_saveable)
  w, x = _stack(rx.target_mesh('h100'), layers=2, seq=64, width=256, seed=4)
  rx.clear_caches()
  before = compiles_run()
  report = rx.analyze(loss, w, x)
  assert compiles_run() == before
  assert report.num_devices == 1 and report.device_kind == 'NVIDIA H100 80GB HBM3'
  assert report.residuals and all(
      (r.per_device_shape, r.per_device_bytes) == (r.shape, r.bytes) for r in report.residuals)
  assert {r.sharding for r in report.residuals} == {'replicated'}
  # What the partitioner says of the same step compiled by hand.
  compiled = step_by_hand(loss, w, x)
  assert all(s.is_fully_replicated for s in jax.tree_util.tree_leaves(compiled.output_shardings))


@pytest.mark.parametrize('target, other, other_kind', [
    ('h100:4', 'a100:4', 'NVIDIA A100-SXM4-80GB'), ('v5e:2x2', 'v6e:2x2', 'TPU v6 lite')])
def test_residual_shardings_on_a_target_are_the_partitioners_without_a_compile(
    target, other, other_kind, monkeypatch):
  """Where each residual lies on a target is its partitioner's answer:
  Shardy's propagation, run on the forward pass without compiling it,
  places every residual as compiling that forward pass for the target does.
  ``analyze`` compiles nothing, under the policy the program was written
  with and under ``nothing_saveable`` (the same forward pass) alike, nor
  on another target of the same mesh shape."""
  from remat_explorer.analysis.context import compiles_run
  from remat_explorer.analysis.split import sharding
  loss = _loss(rx.checkpoint_policies.nothing_saveable)
  w, x = _stack(rx.target_mesh(target), layers=2, seq=64, width=256, seed=8)
  rx.clear_caches()
  before = compiles_run()
  written = rx.analyze(loss, w, x)
  again = rx.analyze(loss, w, x, policy=rx.checkpoint_policies.nothing_saveable)
  placed = [(r.sharding, r.per_device_shape) for r in written.residuals]
  assert [(r.sharding, r.per_device_shape) for r in again.residuals] == placed
  assert ("P('data')", (x.shape[0] // 4, *x.shape[1:])) in placed, placed
  w2, x2 = _stack(rx.target_mesh(other), layers=2, seq=64, width=256, seed=8)
  on_other = rx.analyze(loss, w2, x2)
  assert on_other.device_kind == other_kind
  assert [(r.sharding, r.per_device_shape) for r in on_other.residuals] == placed
  assert compiles_run() == before
  # The same forward pass compiled for the target puts them in the same places.
  rx.clear_caches()
  monkeypatch.setattr(sharding, 'propagated_shardings', lambda *_: None)
  compiled = rx.analyze(loss, w, x)
  assert compiles_run() == before + 1
  assert [(r.sharding, r.per_device_shape) for r in compiled.residuals] == placed


def test_convolutions_a_gpu_hands_to_cudnn_count_as_the_convolutions_they_are():
  """XLA:GPU runs a convolution, its input's gradient and its kernel's as
  cuDNN custom calls, which XLA's cost analysis counts as nothing: each is
  counted as the forward convolution it carries the window of, its
  operands put back in that convolution's order. With nothing recomputed,
  the step's executed FLOPs on a compile-only H100 are within 3% of
  XLA:CPU's count of the same step, which has no such calls (it counts
  each backward convolution by its own window), and of the jaxpr's."""
  loss, args = examples.convnet(num_blocks=2, channels=8, image_size=16, batch=4, seed=41,
                                policy=rx.checkpoint_policies.everything_saveable)
  on_h100 = rx.on_target(args, rx.target_mesh('h100'))
  on_gpu = rx.compile_costs(loss, *on_h100)
  hlo = step_by_hand(loss, *on_h100).as_text()
  assert len(re.findall(r'custom_call_target="__cudnn\$conv', hlo)) >= 3
  by_cpu = step_by_hand(loss, *args).cost_analysis()['flops']  # no loops: XLA's count
  assert abs(on_gpu.executed_flops / by_cpu - 1) <= 0.03, (on_gpu.executed_flops, by_cpu)
  jaxpr = rx.analyze(loss, *args).total_flops
  assert abs(on_gpu.executed_flops / jaxpr - 1) <= 0.03, (on_gpu.executed_flops, jaxpr)
