"""Sharded programs analyzed per device: residual shards, compiled memory
per device as the mesh grows, collectives, parity with ``jax.checkpoint``.

The checks need 8 forced host devices, which must be set before JAX starts,
so they run with pytest in their own process
(``tests/sharded_analysis_checks.py``)."""

import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
CHECKS = ROOT / 'tests' / 'sharded_analysis_checks.py'


def test_sharded_programs_on_8_host_devices():
  """Every check in one process: JAX's start-up with 8 forced devices costs
  more than the checks' compiles gain from two processes on two cores."""
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:xdist', '-p', 'no:cacheprovider',
       str(CHECKS)],
      cwd=ROOT, capture_output=True, text=True, timeout=900,
      env={'PYTHONPATH': str(ROOT), 'PATH': '/usr/bin:/bin', 'JAX_PLATFORMS': 'cpu',
           'XLA_FLAGS': '--xla_force_host_platform_device_count=8',
           'MPLBACKEND': 'Agg'})
  assert result.returncode == 0, (result.stdout[-6000:] + result.stderr[-3000:])
  assert ' passed' in result.stdout.splitlines()[-1]


# -- reading collectives from HLO text (no devices needed) --------------------------

HLO = '''HloModule m, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %g = f32[16]{0} all-gather(%x), dimensions={0}, metadata={op_name="jit(f)/jvp()/while/body/dot_general"}
  %s = f32[8]{0} slice(%g), slice={[0:8]}
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %s)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %ar = (f32[8]{0}, f32[8]{0}) all-reduce(%x, %x), to_apply=%add, metadata={op_name="jit(f)/(transpose(jvp(jvp()))/checkpoint/rematted_computation/dot_general:transpose(jvp())/dot_general)"}
  %r0 = f32[8]{0} get-tuple-element(%ar), index=0
  %r1 = f32[8]{0} get-tuple-element(%ar), index=1
  %b = f32[8]{0} multiply(%r0, %r1), metadata={op_name="jit(f)/transpose(jvp())/mul"}
  %merged = f32[8]{0} all-reduce(%x), to_apply=%add, metadata={op_name="jit(f)/transpose(jvp(jvp()))/checkpoint/rematted_computation/dot_general"}
  %f = f32[8]{0} add(%merged, %b), metadata={op_name="jit(f)/jvp()/add"}
  %ags = (f32[8]{0}, f32[64]{0}) all-gather-start(%f), dimensions={0}, metadata={op_name="jit(f)/jvp()/dot_general"}
  %agd = f32[64]{0} all-gather-done(%ags), metadata={op_name="jit(f)/jvp()/dot_general"}
  %n = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%n, %f)
  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[8]{0} get-tuple-element(%w), index=1
}
'''


def test_collectives_are_read_by_operand_pass_and_loop_trip():
  from remat_explorer.analysis.xla.collectives import collectives_in
  from remat_explorer.analysis.xla.hlo import parse_hlo
  summary = collectives_in(parse_hlo(HLO))
  found = {(c.kind, c.phase): (c.count, c.instructions, c.bytes) for c in summary.collectives}
  f32 = 4
  assert found == {
      # The combined all-reduce carries one recompute and one backward operand.
      ('all-reduce', 'recompute'): (1, 1, 8 * f32),
      ('all-reduce', 'backward'): (1, 1, 8 * f32),
      # Named as the recompute, but a forward operation reads it: merged.
      ('all-reduce', 'forward'): (1, 1, 8 * f32),
      # The async pair once, the loop's all-gather once per trip.
      ('all-gather', 'forward'): (1 + 3, 2, 64 * f32 + 3 * 16 * f32),
  }
  assert not summary.unknown_trip_count
  without_trips = HLO.replace(', backend_config={"known_trip_count":{"n":"3"}}', '')
  assert collectives_in(parse_hlo(without_trips)).unknown_trip_count


def test_combined_names_split_at_the_top_level_only():
  from remat_explorer.analysis.xla.collectives import combined_names
  assert combined_names('jit(f)/jvp()/dot_general') == ['jit(f)/jvp()/dot_general']
  assert combined_names('jit(f)/transpose(jvp())') == ['jit(f)/transpose(jvp())']
  assert combined_names('jit(f)/(jvp(g)/a:transpose(jvp(g))/b)') == [
      'jit(f)/jvp(g)/a', 'jit(f)/transpose(jvp(g))/b']


# -- the partitioner's propagation, read (no devices needed) --------------------------

def test_a_propagated_sharding_is_read_only_where_it_is_whole_mesh_axes():
  """Shardy's result shardings become partition specs over the arguments'
  mesh; anything else (an open dimension, a sub-axis, a priority, another
  mesh) is left to the compile."""
  from jax.sharding import PartitionSpec as P
  from remat_explorer.analysis.split.sharding import _spec_of
  ours = {'mesh'}
  assert _spec_of('', ours) == P()
  assert _spec_of('#sdy.sharding<@mesh, []>', ours) == P()
  assert _spec_of('#sdy.sharding<@mesh, [{"data"}, {}, {"model"}]>', ours) == P(
      'data', None, 'model')
  assert _spec_of('#sdy.sharding<@mesh, [{}, {"data", "model"}]>', ours) == P(
      None, ('data', 'model'))
  for other in ('#sdy.sharding<@mesh, [{"data", ?}, {}]>',
                '#sdy.sharding<@mesh, [{"data":(1)2}, {}]>',
                '#sdy.sharding<@mesh, [{"data"}p0, {}]>',
                '#sdy.sharding<@mesh, [{}, {}], replicated={"model"}>',
                '#sdy.sharding<@other, [{"data"}, {}]>'):
    assert _spec_of(other, ours) is None, other
