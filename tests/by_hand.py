"""A step compiled by hand, as its user compiles it:
``jax.jit(jax.value_and_grad(loss)).lower(*args).compile()``; and the
compiles XLA runs while a block of code does (``xla_compiles``).

For arguments on a compile-only GPU the compile is given this thread's
kernel cache, the one the explorer's analysis compiles take
(``remat_explorer/analysis/xla/kernel_cache.py``): ptxas then runs once for
the kernels that the policies of one step share. What XLA makes of the
program, its optimized module, buffer assignment and memory figures, is
byte for byte a compile's without it (tests/test_analysis_compile.py
compares the two).
"""

from __future__ import annotations

import contextlib

import jax

from remat_explorer.analysis.xla.kernel_cache import kernel_cache_options, reuses_kernels


def compile_by_hand(function, *args):
  """``function`` (jitted) lowered at `args` and compiled."""
  lowered = function.lower(*args)
  devices = {d for x in jax.tree_util.tree_leaves(args)
             if (sharding := getattr(x, 'sharding', None)) is not None
             for d in sharding.device_set}
  if devices and all(reuses_kernels(d) for d in devices):
    return lowered.compile(kernel_cache_options())
  return lowered.compile()


def step_by_hand(loss, *args, argnums=0):
  """The training step of `loss` compiled by hand."""
  return compile_by_hand(jax.jit(jax.value_and_grad(loss, argnums=argnums)), *args)


def allocated_bytes(memory) -> int:
  """What a compiled program allocates, by its ``memory_analysis()``: its
  arguments, outputs and temporaries, less what its outputs write over
  donated arguments (on the CPU, the peak the explorer reports)."""
  return (memory.argument_size_in_bytes + memory.output_size_in_bytes
          + memory.temp_size_in_bytes - memory.alias_size_in_bytes)


@contextlib.contextmanager
def xla_compiles():
  """A list that gathers one entry per XLA compile run while the block
  runs, on any thread (the explorer compiles on worker threads), from
  JAX's compile events; a program loaded from a cache is not one."""
  compiled = []

  def listener(event, seconds, **kwargs):
    if event == '/jax/core/compile/backend_compile_duration':
      compiled.append(seconds)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield compiled
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
