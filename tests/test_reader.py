"""The one reader of XLA's compiled program, checked against what XLA says
of the same executable through its own API."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer.analysis.xla.reader import read_compiled


def _step(num_layers=3, width=32, seed=0):
  rng = np.random.default_rng(seed)
  ws = [jnp.asarray(rng.normal(size=(width, width)) / width**0.5, jnp.float32)
        for _ in range(num_layers)]
  x = jnp.asarray(rng.normal(size=(8, width)), jnp.float32)

  def layer(h, w):
    return jnp.tanh(h @ w), None

  def loss(ws, x):
    h, _ = jax.lax.scan(rx.checkpoint(layer), x, jnp.stack(ws))
    return jnp.sum(h ** 2)

  return jax.jit(jax.value_and_grad(loss)).lower(ws, x).compile()


@pytest.fixture(scope='module')
def compiled():
  return _step(seed=3141)


def test_allocations_add_up_to_xla_memory_analysis(compiled):
  program = read_compiled(compiled)
  memory = compiled.memory_analysis()
  assert program.buffers is not None
  assert program.buffers.bytes_of('temp') == memory.temp_size_in_bytes
  # Parameters: every argument's allocation; outputs: the live-out ones.
  assert program.buffers.bytes_of('parameter') == memory.argument_size_in_bytes
  assert program.buffers.bytes_of('output') == memory.output_size_in_bytes


def test_every_placed_buffer_names_an_instruction_of_the_parsed_module(compiled):
  program = read_compiled(compiled)
  names = {(c, i.name) for c, instrs in program.module.computations.items() for i in instrs}
  assert all((b.computation, b.instruction) in names for b in program.buffers.buffers)


def test_a_scan_loop_knows_its_trip_count_and_each_computation_stands_alone(compiled):
  program = read_compiled(compiled)
  loops = [i for instrs in program.module.computations.values() for i in instrs
           if i.opcode == 'while']
  # The forward and the backward scans, three layers each.
  assert sorted(i.trip_count for i in loops) == [3, 3]
  for loop in loops:
    body = loop.attr('body')
    alone = program.module.as_entry(body)
    # XLA parses and measures the body as a module of its own.
    assert rx.engine.hlo_text_flops(alone, jax.devices()[0]) > 0
    assert alone.count('ENTRY ') == 1


def test_the_python_stack_of_an_instruction_reaches_this_file(compiled):
  program = read_compiled(compiled)
  from remat_explorer.analysis.xla.hlo_provenance import stack_of
  stacks = [stack_of(i, program.stacks)
            for instrs in program.module.computations.values() for i in instrs]
  assert any(frame[0] == __file__ and frame[2] == '_step.<locals>.layer'
             for s in stacks for frame in s)
