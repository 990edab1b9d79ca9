"""Devices to compile for: the machine's own, and accelerators it does not have.

JAX's PJRT plugins make *compile-only* devices: libtpu for any TPU topology,
the CUDA plugin for GPUs described by a ``GpuTargetConfig``. A program
lowered with shardings over them compiles as it would on that hardware, and
its executable can be read (memory, cost, optimized HLO) but not run. The
analysis builds its target meshes from these, and asks the partitioner's
propagation where a program's results lie on them
(``propagated_result_shardings``); how JAX is asked is ``_jax_internals``'
part.
"""

from remat_explorer.engine import _jax_internals as jx

jx.settle_absent_accelerators()  # before any backend starts, so on import

compile_only_tpu_devices = jx.compile_only_tpu_devices
compile_only_cuda_devices = jx.compile_only_cuda_devices
initialize_backends_quietly = jx.initialize_backends_quietly
gpu_target_config_of = jx.gpu_target_config_of
tpu_support_installed = jx.tpu_support_installed
propagated_result_shardings = jx.propagated_result_shardings
# An executable compiled for a compile-only device cannot be loaded back
# from JAX's persistent compilation cache (JAX warns, "PjRtCompiler must be
# constructed with a Client to call Deserialize", and compiles again): its
# compiles are made under this, so that no entry fills the user's cache.
no_persistent_cache_writes = jx.no_persistent_cache_writes


def cuda_plugin_installed() -> bool:
  return jx.cuda_plugin_library() is not None


def is_compile_only(device) -> bool:
  """Whether `device` can compile but not run programs (a target's)."""
  return type(device.client).__name__ == 'CompileOnlyPyClient'
