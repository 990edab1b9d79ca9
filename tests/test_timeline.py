"""Tests for the memory timeline of compiled programs."""

import contextlib
import io
import json
import re

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import print_saved_residuals

from remat_explorer.analysis.xla.hlo import parse_hlo
from remat_explorer.analysis.xla.reader import read_compiled
from remat_explorer.analysis.xla.timeline import MemoryTimeline, memory_timeline, timeline_of
from tests.by_hand import allocated_bytes


def memory_timeline_from_hlo_text(text):
  return timeline_of(parse_hlo(text))

WIDTH, BATCH = 512, 256


def _layer(h, wb):
  w, b = wb
  return jnp.tanh(h @ w + b)


def _scan_loss(params, x, target):
  def body(h, wb):
    return jax.checkpoint(_layer)(h, wb), None
  h, _ = jax.lax.scan(body, x, params)
  return jnp.mean((h - target) ** 2)


def _unrolled_loss(checkpoint):
  layer = jax.checkpoint(_layer) if checkpoint else _layer

  def loss(params, x, target):
    h = x
    for w, b in zip(*params):
      h = layer(h, (w, b))
    return jnp.mean((h - target) ** 2)
  return loss


def _args(layers):
  params = (jnp.zeros((layers, WIDTH, WIDTH)), jnp.zeros((layers, WIDTH)))
  return params, jnp.zeros((BATCH, WIDTH)), jnp.zeros((BATCH, WIDTH))


PROGRAMS = {
    'scan_checkpointed': (_scan_loss, 16),
    'unrolled_checkpointed': (_unrolled_loss(True), 6),
    'unrolled': (_unrolled_loss(False), 6),
}


@pytest.fixture(scope='module')
def compiled_grads():
  return {name: jax.jit(jax.grad(f)).lower(*_args(n)).compile()
          for name, (f, n) in PROGRAMS.items()}


@pytest.mark.parametrize('name', list(PROGRAMS))
def test_peak_is_xlas_allocation(compiled_grads, name):
  compiled = compiled_grads[name]
  stats = compiled.memory_analysis()
  timeline = memory_timeline(read_compiled(compiled))
  allocated = allocated_bytes(stats)
  # The placed curve follows XLA's buffer assignment: its peak is what XLA
  # allocates, and no set of buffers live at once exceeds it.
  assert timeline.placed_bytes is not None
  assert timeline.peak_bytes == max(timeline.placed_bytes) == allocated
  assert max(timeline.live_bytes) <= timeline.peak_bytes
  assert max(timeline.live_bytes) >= 0.9 * timeline.peak_bytes
  if jax.default_backend() == 'gpu':
    # On GPUs peak_memory_in_bytes is XLA's own peak, temporaries included.
    assert timeline.peak_bytes == pytest.approx(stats.peak_memory_in_bytes, rel=0.02)


@pytest.mark.parametrize('name', list(PROGRAMS))
def test_live_bytes_are_consistent(compiled_grads, name):
  timeline = memory_timeline(read_compiled(compiled_grads[name]))
  assert len(timeline.live_bytes) == len(timeline.steps) == len(timeline.placed_bytes)
  assert all(b >= 0 for b in timeline.live_bytes)
  # The peak's step: the busiest of those within 0.1% of the placed peak.
  near_top = [i for i, h in enumerate(timeline.placed_bytes)
              if h >= (1 - 1e-3) * timeline.peak_bytes]
  assert timeline.peak_bytes == max(timeline.placed_bytes)
  assert timeline.peak_step in near_top
  assert timeline.live_bytes[timeline.peak_step] == max(timeline.live_bytes[i] for i in near_top)
  assert all(live <= placed for live, placed in
             zip(timeline.live_bytes, timeline.placed_bytes))
  for step in (0, timeline.peak_step, len(timeline.steps) - 1):
    assert sum(b.bytes for b in timeline.live_at(step)) == timeline.live_bytes[step]


def _saved_residual_bytes(f, *args):
  """Bytes of the non-argument residuals `print_saved_residuals` lists."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    print_saved_residuals(f, *args)
  total = 0
  for line in out.getvalue().splitlines():
    m = re.match(r'(\w+)\[([\d,]*)\]', line)
    if m and 'from the argument' not in line:
      size = jnp.dtype({'f32': 'float32', 'bf16': 'bfloat16'}[m.group(1)]).itemsize
      for d in filter(None, m.group(2).split(',')):
        size *= int(d)
      total += size
  return total


def test_checkpointed_scan_holds_residuals_at_peak(compiled_grads):
  timeline = memory_timeline(read_compiled(compiled_grads['scan_checkpointed']))
  at_peak = timeline.residual_bytes_at(timeline.peak_step)
  assert at_peak > 0
  saved = _saved_residual_bytes(_scan_loss, *_args(16))
  assert saved / 2 <= at_peak <= 2 * saved
  residuals = [b for b in timeline.buffers if b.is_residual]
  assert all('transpose(' not in b.op_name and not b.is_parameter for b in residuals)
  # The stacked per-layer inputs the scan saves for the backward loop.
  assert any(b.bytes == 16 * BATCH * WIDTH * 4 for b in residuals)


def test_program_without_gradient_has_no_residuals():
  f, n = PROGRAMS['unrolled']
  timeline = memory_timeline(read_compiled(jax.jit(f).lower(*_args(n)).compile()))
  assert not any(b.is_residual for b in timeline.buffers)
  assert timeline.residual_bytes_at(timeline.peak_step) == 0


def test_to_dict_round_trips_through_json(compiled_grads):
  timeline = memory_timeline(read_compiled(compiled_grads['scan_checkpointed']))
  data = timeline.to_dict()
  assert json.loads(json.dumps(data)) == data
  assert data['peak_bytes'] == timeline.peak_bytes
  assert len(data['buffers']) == len(timeline.buffers)


# Hand-written HLO: a while loop (body temporaries, state kept in place), a
# host-memory parameter, a bitcast alias, and forward/backward op_names.
LOOP_HLO = """\
HloModule m, is_scheduled=true

%body (p: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %p = (s32[], f32[4,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4,4]{1,0} get-tuple-element(%p), index=1
  %e = f32[4,4]{1,0} exponential(%x)
  %y = f32[4,4]{1,0} add(%e, %x)
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], f32[4,4]{1,0}) tuple(%j, %y)
}

%cond (q: (s32[], f32[4,4])) -> pred[] {
  %q = (s32[], f32[4,4]{1,0}) parameter(0)
  %k = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%k, %n), direction=LT
}

ENTRY %main (a: f32[4,4], b: bf16[2,8]) -> (f32[4,4], f32[2,8]) {
  %a = f32[4,4]{1,0} parameter(0), metadata={op_name="a"}
  %b = bf16[2,8]{1,0:S(5)} parameter(1)
  %zero = s32[] constant(0)
  %c = f32[4,4]{1,0} copy(%a), metadata={op_name="jit(f)/jvp()/copy"}
  %init = (s32[], f32[4,4]{1,0}) tuple(%zero, %c)
  %w = (s32[], f32[4,4]{1,0}) while(%init), condition=%cond, body=%body, metadata={op_name="jit(f)/jvp()/while"}
  %h = f32[4,4]{1,0} get-tuple-element(%w), index=1
  %bc = f32[16]{0} bitcast(%h)
  %g = f32[4,4]{1,0} negate(%h), metadata={op_name="jit(f)/transpose(jvp())/neg"}
  %big = f32[2,8]{1,0} convert(%b)
  ROOT %out = (f32[4,4]{1,0}, f32[2,8]{1,0}) tuple(%g, %big)
}
"""


def test_hlo_text_while_loop():
  t = memory_timeline_from_hlo_text(LOOP_HLO)
  assert t.steps == ('a', 'b', 'zero', 'c', 'init', 'w', 'h', 'bc', 'g', 'big', 'out')
  buffers = {b.name: b for b in t.buffers}
  assert buffers['b'].memory_space == 5 and buffers['b'].bytes == 32
  assert buffers['a'].is_parameter and (buffers['a'].start, buffers['a'].end) == (0, 10)
  # The loop state takes the copy's storage over; the body's own temporary
  # (exp, 64 bytes) is added at the while's step.
  assert buffers['c'].end == 4 and buffers['w{1}'].start == 5
  assert buffers['w/temps'].bytes == 64
  # a + state (64 + 4) + body temps + the unwritten output `big` (64 - 4).
  assert t.peak_step == 5 and t.peak_bytes == 64 + 68 + 64 + 60
  assert t.live_bytes == (192,) * 5 + (256,) + (192,) * 5
  assert [b.name for b in t.buffers if b.is_residual] == ['w{1}']
  assert t.residual_bytes_at('h') == 64 and t.residual_bytes_at('g') == 0
  assert {b.name for b in t.buffers if b.is_output} >= {'g', 'big'}


IN_PLACE_HLO = """\
HloModule m, is_scheduled=true

%fused (p0: f32[8,4], p1: f32[1,4], p2: s32[]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = f32[1,4]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %d = f32[8,4]{1,0} dynamic-update-slice(%p0, %p1, %p2, %z)
}

ENTRY %main (x: f32[8,4], u: f32[1,4], i: s32[]) -> f32[8,4] {
  %x = f32[8,4]{1,0} parameter(0)
  %u = f32[1,4]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %y = f32[8,4]{1,0} exponential(%x)
  %f = f32[8,4]{1,0} fusion(%y, %u, %i), kind=kLoop, calls=%fused
  ROOT %r = f32[8,4]{1,0} negate(%f)
}
"""


def test_hlo_text_in_place_updates_share_storage():
  t = memory_timeline_from_hlo_text(IN_PLACE_HLO)
  # Parameters (128 + 16 + 4) plus one 128-byte buffer, shared by exp, the
  # dynamic-update-slice fusion and the negate: reserved as output storage.
  assert t.live_bytes == (276,) * 6
  buffers = {b.name: b for b in t.buffers}
  assert buffers['y'].end < buffers['f'].start
  assert buffers['f'].end < buffers['r'].start


def test_hlo_text_tuple_shapes():
  text = """\
HloModule m, is_scheduled=true

ENTRY %main (p: (f32[2], f32[2], f32[2], f32[2], f32[2], pred[3])) -> pred[3] {
  %p = (f32[2]{0}, f32[2]{0}, f32[2]{0}, f32[2]{0}, f32[2]{0}, /*index=5*/pred[3]{0}) parameter(0)
  ROOT %g = pred[3]{0} get-tuple-element(%p), index=5
}
"""
  t = memory_timeline_from_hlo_text(text)
  assert isinstance(t, MemoryTimeline)
  assert t.steps == ('p', 'g') and t.live_bytes == (43, 43)
  assert [b.name for b in t.buffers if b.is_output] == ['p{5}']


def test_hlo_text_without_entry_is_an_error():
  with pytest.raises(ValueError, match='ENTRY'):
    memory_timeline_from_hlo_text('HloModule m\n')


def test_hlo_text_host_offload_copies_are_not_double_counted():
  text = """\
HloModule m, is_scheduled=true

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %e = f32[4]{0} exponential(%x)
  %cs = (f32[4]{0:S(5)}, f32[4]{0}, u32[]) copy-start(%e)
  %cd = f32[4]{0:S(5)} copy-done(%cs)
  %cs2 = (f32[4]{0}, f32[4]{0:S(5)}, u32[]) copy-start(%cd)
  %cd2 = f32[4]{0} copy-done(%cs2)
  ROOT %n = f32[4]{0} negate(%cd2)
}
"""
  t = memory_timeline_from_hlo_text(text)
  # x, and one 16-byte array on the device at a time (plus 4-byte contexts);
  # the host copy is listed but not counted.
  assert t.live_bytes == (32, 32, 36, 36, 36, 36, 32)
  host = [b for b in t.buffers if b.memory_space]
  assert [(b.name, b.bytes, b.start, b.end) for b in host] == [('cs{0}', 16, 2, 5)]


def test_donated_parameters_hand_their_storage_to_outputs():
  x = jnp.zeros((BATCH, WIDTH))
  compiled = jax.jit(lambda a, b: (a * 2 + b, b),
                     donate_argnums=0).lower(x, x).compile()
  stats = compiled.memory_analysis()
  timeline = memory_timeline(read_compiled(compiled))
  assert stats.alias_size_in_bytes > 0
  # Both parameters, the first one reused for `a * 2 + b`, and the copy of `b`
  # that XLA makes for the second output are live at once...
  assert max(timeline.live_bytes) == 3 * x.nbytes
  # ...within what XLA allocates (the outputs' tuple index table besides).
  assert timeline.peak_bytes == allocated_bytes(stats)
  assert timeline.peak_bytes - 3 * x.nbytes < 64


@pytest.mark.parametrize('policy', ['nothing_saveable', 'dots_saveable'])
def test_scan_transformer_peak_is_xlas_allocation(policy):
  from remat_explorer import checkpoint_policies, examples
  loss_fn, args = examples.transformer(
      num_layers=3, d_model=64, seq_len=32, batch=4, use_scan=True,
      policy=getattr(checkpoint_policies, policy))
  compiled = jax.jit(jax.value_and_grad(loss_fn)).lower(*args).compile()
  stats = compiled.memory_analysis()
  timeline = memory_timeline(read_compiled(compiled))
  assert timeline.peak_bytes == allocated_bytes(stats)
  assert max(timeline.live_bytes) <= timeline.peak_bytes
  # The scan's stacked residuals are held at the peak, which falls in the
  # backward loop.
  assert timeline.residual_bytes_at(timeline.peak_step) > 0
