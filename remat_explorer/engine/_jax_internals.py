"""Every piece of JAX's private API that the engine relies on, in one place.

A remat primitive has to plug into JAX's interpreters (autodiff, partial
evaluation, batching, lowering, state discharge), and those live under
``jax._src``. Keeping every such import here means that moving to a new JAX
release is a matter of fixing this one file.

Supported: JAX 0.10.0 up to (not including) 0.12. What differs between
those releases is bridged below, each difference under a version check:

* 0.10.0 - 0.10.1: an effect on a jaxpr input names the input by position
  (``input_index``); from 0.10.2 it names the input's variable (``input``),
  and ``core.positional_effects`` / ``core.eqn_effects(jaxpr, invars)``
  convert between the two. ``discharge_state`` of a closed jaxpr was
  ``discharge_state2`` before 0.10.2.
* 0.11: ``FlatTree`` moved from ``tree_util`` to ``flattree`` and became a
  family of cases (``flattree.flatten``, ``treedef_args_to_ft``); a
  ``scan``'s parameters give its constants and carries as the flat tree
  ``ft_in`` instead of ``num_consts`` and ``num_carry``. JAX 0.11
  also merged ``ClosedJaxpr`` into ``Jaxpr`` (with ``.jaxpr``/``.consts``
  kept as accessors), and needs Python 3.12.
* 0.11.2: a state discharge rule takes a ``DischargeContext`` holding the
  avals where it took ``in_avals, out_avals``.
* GPU: the PJRT C API has no cost analysis of a module given as HLO text;
  the CPU's (the same ``HloCostAnalysis``) counts a loop body's FLOPs.
"""

import jax

from jax._src import ad_util
from jax._src import api_util
from jax._src import config
from jax._src import core
from jax._src import dispatch
from jax._src import dtypes
from jax._src import effects
from jax._src import source_info_util
from jax._src import traceback_util
from jax._src.ad_checkpoint import name_p as jax_name_p
from jax._src.ad_checkpoint import remat_p as jax_remat_p
from jax._src.ad_checkpoint import CheckpointName as JaxHiCheckpointName
from jax._src.hijax import call_hi_primitive_p
from jax._src.interpreters import ad
from jax._src.interpreters import batching
from jax._src.interpreters import mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import convolution as lax_convolution
from jax._src.lax import lax as lax_internal
from jax._src.lib.mlir.dialects import hlo
from jax._src.state import discharge
from jax._src.state.types import AbstractRef, AccumEffect, WriteEffect
from jax._src.traceback_util import api_boundary
from jax._src.tree_util import broadcast_prefix, tracing_registry
from jax._src.util import (merge_lists, partition_list, split_list, unzip2,
                           weakref_lru_cache)

JAX_VERSION = tuple(jax.__version_info__[:3])

if JAX_VERSION >= (0, 11):
  from jax._src import flattree as _flattree

  def scan_consts_and_carries(params) -> tuple[int, int]:
    """How many of a ``scan`` equation's inputs are constants, and how
    many carries (the rest are the scanned ``xs``)."""
    consts, carries, _ = params['ft_in'].unpack()
    return len(consts), len(carries)

  def flat_tree(tree):
    """`tree` (a pytree of avals) as the flat tree JAX's tracing takes."""
    return _flattree.flatten(tree)

  def flat_tree_of(leaves, treedef):
    """The flat tree with `treedef`'s structure (an ``(args, kwargs)``
    pair) and `leaves` as its values."""
    return _flattree.treedef_args_to_ft(treedef, list(leaves))
else:
  from jax._src.tree_util import FlatTree as _FlatTree

  def scan_consts_and_carries(params) -> tuple[int, int]:
    """How many of a ``scan`` equation's inputs are constants, and how
    many carries (the rest are the scanned ``xs``)."""
    return params['num_consts'], params['num_carry']

  def flat_tree(tree):
    """`tree` (a pytree of avals) as the flat tree JAX's tracing takes."""
    return _FlatTree.flatten(tree)

  def flat_tree_of(leaves, treedef):
    """The flat tree with `treedef`'s structure (an ``(args, kwargs)``
    pair) and `leaves` as its values."""
    return _FlatTree(leaves, treedef, False)


# How JAX words and chooses residuals changed in 0.10.2 (its
# `ad_checkpoint.saved_residuals` and `checkpoint_policies`); the engine
# follows the JAX it runs with, so that its answers equal that JAX's:
# - from 0.10.2 a residual rounded by `reduce_precision` is described by the
#   value it rounds, and a value is "named" only when it is the output of a
#   `checkpoint_name`; before, the rounding was the residual's producer, and
#   a value that a `checkpoint_name` reads was named by it;
# - from 0.10.2 `save_anything_except_these_names` saves everything; before,
#   it refused the values of the names it lists.
RESIDUALS_DESCRIBED_THROUGH_ROUNDING = JAX_VERSION >= (0, 10, 2)
EXCEPT_THESE_NAMES_SAVES_EVERYTHING = JAX_VERSION >= (0, 10, 2)


if JAX_VERSION >= (0, 10, 2):
  positional_effects = core.positional_effects

  def equation_effects(jaxpr, invars):
    """The effects of an equation running `jaxpr` on `invars`."""
    return core.eqn_effects(jaxpr, invars)

  def ref_written_by(jaxpr, effect):
    """The variable of the ref an input effect of `jaxpr` is about."""
    return effect.input

  def discharged(closed_jaxpr, should_discharge=True):
    """`closed_jaxpr` with its refs (those `should_discharge` selects)
    turned into values passed in and out."""
    return discharge.discharge_state(closed_jaxpr, should_discharge=should_discharge)
else:
  def positional_effects(jaxpr):
    # Effects already name inputs by position.
    return core.eqn_effects(jaxpr)

  def equation_effects(jaxpr, invars):
    """The effects of an equation running `jaxpr` on `invars`."""
    del invars  # positions carry over from the jaxpr to the equation
    return core.eqn_effects(jaxpr)

  def ref_written_by(jaxpr, effect):
    """The variable of the ref an input effect of `jaxpr` is about."""
    return [*jaxpr.constvars, *jaxpr.invars][effect.input_index]

  def discharged(closed_jaxpr, should_discharge=True):
    """`closed_jaxpr` with its refs (those `should_discharge` selects)
    turned into values passed in and out."""
    return discharge.discharge_state2(closed_jaxpr, should_discharge)


if hasattr(discharge, 'DischargeContext'):  # 0.11.2
  def register_discharge_rule(primitive, rule):
    """Make `rule(in_avals, out_avals, *args, **params)` discharge
    `primitive`'s refs; from 0.11.2 JAX passes the avals in a context."""
    discharge.register_discharge_rule(primitive)(
        lambda ctx, *args, **params: rule(ctx.in_avals, ctx.out_avals, *args, **params))
    return rule
else:
  def register_discharge_rule(primitive, rule):
    """Make `rule(in_avals, out_avals, *args, **params)` discharge
    `primitive`'s refs."""
    discharge.register_discharge_rule(primitive)(rule)
    return rule


# Primitives that policies and residual reports look at.
dot_general_p = lax_internal.dot_general_p
conv_general_dilated_p = lax_convolution.conv_general_dilated_p
reduce_precision_p = lax_internal.reduce_precision_p
closed_call_p = core.closed_call_p
device_put_p = dispatch.device_put_p

# What a policy may answer besides a bool.
Saveable = pe.Saveable
Recompute = pe.Recompute
Offloadable = pe.Offloadable


def hide_frames_of(filename: str) -> None:
  """Keep `filename` out of user-facing source locations and tracebacks."""
  source_info_util.register_exclusion(filename)
  traceback_util.register_exclusion(filename)


def source_info_of(eqn):
  """A context in which new equations take `eqn`'s source line and names."""
  return source_info_util.user_context(
      eqn.source_info.traceback, name_stack=eqn.source_info.name_stack)


def log_checkpoint_residuals_enabled() -> bool:
  return bool(config.log_checkpoint_residuals.value)


def checks_enabled() -> bool:
  return bool(config.enable_checks.value)


def no_persistent_cache_writes():
  """A context in which this thread's compiles write nothing to JAX's
  persistent compilation cache. The setting is thread-local; the cache's
  own switch (``jax_enable_compilation_cache``) is not used, since JAX
  remembers for the whole process whether the cache is on from the first
  compile that asks, which may be one made under it. Only the minimum
  compile time an entry needs is raised, past any compile's."""
  return config.persistent_cache_min_compile_time_secs(float('inf'))


def traced_setting(name: str, values, help: str):
  """A thread-local setting, usable as ``with setting(value):``, that is part
  of the key of JAX's tracing and compilation caches, so that a function
  traced under one value is traced again under another."""
  return config.optional_enum_state(
      name, values, None, help, include_in_jit_key=True,
      include_in_trace_context=True)


def effects_remat_disallows(jaxpr_effects):
  """The subset of `jaxpr_effects` that remat cannot partially evaluate."""
  return effects.remat_allowed_effects.filter_not_in(jaxpr_effects)


def name_of_named_value(eqn) -> str | None:
  """The checkpoint name an equation attaches to its output, if any."""
  if eqn.primitive is jax_name_p:
    return eqn.params['name']
  if (eqn.primitive is call_hi_primitive_p
      and isinstance(eqn.params.get('_prim'), JaxHiCheckpointName)):
    return eqn.params['_prim'].name
  return None


def hlo_text_flops(hlo_text: str, device) -> float | None:
  """XLA's own cost analysis (``flops``) of an HLO module given as text, for
  `device`'s programs: what ``Compiled.cost_analysis()`` reports for a
  compiled module, applicable to a module rewritten from one (a loop's body
  as the entry). A PJRT plugin's client (a GPU's or a TPU's, live or
  compile-only) has no cost analysis of a module alone: the CPU's
  ``HloCostAnalysis`` counts it (it gives XLA:TPU's own counts of TPU
  modules, checked in tests/test_targets.py). None where this jaxlib has no
  such binding."""
  from jax._src import lib
  parse = getattr(getattr(lib, 'hlo', None), 'hlo_module_from_text', None)
  analyze = getattr(getattr(lib, '_jax', None), 'hlo_module_cost_analysis', None)
  if parse is None or analyze is None:
    return None
  counter = device if device.platform == 'cpu' else jax.devices('cpu')[0]
  return float(analyze(counter.client, parse(hlo_text)).get('flops', 0.0))


# -- compile-only devices ------------------------------------------------------
# JAX compiles for accelerators a machine does not have through the PJRT
# plugins' topologies (``jax.experimental.topologies``). Two things of that
# path are private: whether JAX has found its plugins yet, and, on a machine
# without a GPU, the CUDA plugin itself. Its ``initialize()`` refuses to
# register the plugin when it cannot load CUDA (unless JAX's platforms
# exclude "cuda"), and JAX then has no CUDA topology for the rest of the
# process; yet the plugin's library compiles for a GPU target with no CUDA at
# all. So where JAX registered no CUDA topology, the library is loaded here,
# once, and asked for the topology directly.

import contextlib as _contextlib
import logging as _logging
import os as _os
import pathlib as _pathlib
import tempfile as _tempfile

from jax._src import xla_bridge as _xb
from jax._src.lib import xla_client as _xla_client

_own_cuda_plugin = None
"""The CUDA plugin's C API, where this module loaded the library itself."""


@_contextlib.contextmanager
def quiet_native_stderr():
  """Capture what native code writes to file descriptor 2 (libtpu's and the
  CUDA plugin's start-up notices go there, not through Python). Yields a
  function returning the captured text."""
  import sys
  sys.stderr.flush()
  saved = _os.dup(2)
  with _tempfile.TemporaryFile(mode='w+b') as captured:
    _os.dup2(captured.fileno(), 2)
    try:
      yield lambda: (captured.seek(0), captured.read().decode('utf-8', 'replace'))[1]
    finally:
      sys.stderr.flush()
      _os.dup2(saved, 2)
      _os.close(saved)


class _NoCudaFilter(_logging.Filter):
  """Drops JAX's report that the CUDA plugin found no CUDA: on a machine
  without a GPU that is expected, and the plugin still compiles for one."""

  def filter(self, record):
    text = record.getMessage() + ' ' + str(record.exc_info[1] if record.exc_info else '')
    return not ('initialize()' in text and 'CUDA' in text)


def _quietly(fn):
  logger = _logging.getLogger(_xb.__name__)
  no_cuda = _NoCudaFilter()
  logger.addFilter(no_cuda)
  try:
    with quiet_native_stderr() as captured:
      try:
        return fn(), captured()
      except Exception as e:
        e.add_note(captured().strip())
        raise
  finally:
    logger.removeFilter(no_cuda)


def settle_absent_accelerators() -> None:
  """Prepare, once and quietly, the compilers of accelerators this machine
  does not have, before JAX starts a backend. Where it has no TPU chip and
  libtpu is installed:

  * every process may load libtpu (``ALLOW_MULTIPLE_LIBTPU_LOAD``): libtpu
    guards a TPU with a lockfile taken as it loads, so a second process
    could not compile for a TPU target, and without a TPU it guards nothing;
  * libtpu is loaded and initialized now, its notices that no TPU is
    present captured: JAX's own start would print them into every notebook.

  Where it has no NVIDIA GPU and the CUDA plugin is installed, JAX's plugin
  discovery runs now, its report that CUDA is missing captured. Nothing is
  done where the hardware is present, nor once JAX's backends started."""
  from jax._src import hardware_utils
  if _xb.backends_are_initialized():
    return
  chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
  library = _xb.get_tpu_library_path()
  if chips == 0 and library is not None and not _xla_client.pjrt_plugin_loaded('tpu'):
    _os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
    try:
      _quietly(lambda: (_xla_client.load_pjrt_plugin_dynamically('tpu', library),
                        _xla_client.initialize_pjrt_plugin('tpu')))
    except Exception:  # left to JAX, which reports it in its own way
      pass
  if not hardware_utils.has_visible_nvidia_gpu() and cuda_plugin_library() is not None:
    _quietly(_xb._discover_and_register_pjrt_plugins)


def initialize_backends_quietly() -> None:
  """Initialize JAX's backends, as ``jax.devices()`` does, without the
  start-up notices of accelerators this machine does not have. Any other
  output (a TPU or GPU that is there and failed) is written out as usual."""
  if _xb.backends_are_initialized():
    return
  _, text = _quietly(lambda: (_xb._discover_and_register_pjrt_plugins(), _xb.backends()))
  absent = all(_hardware_absent(err) for err in _xb._backend_errors.values())
  if text.strip() and not (absent and _xb.get_backend().platform == 'cpu'):
    import sys
    sys.stderr.write(text)


def _hardware_absent(error: str) -> bool:
  return any(s in error for s in ('No jellyfish device found', 'no supported devices found',
                                  'Unable to load CUDA', 'No visible'))


def compile_only_tpu_devices(topology_name: str, **options) -> list:
  """libtpu's compile-only devices for a TPU topology (``'v5e:2x2'``)."""
  from jax.experimental import topologies
  initialize_backends_quietly()
  topology, _ = _quietly(lambda: topologies.get_topology_desc(
      platform='tpu', topology_name=topology_name, **options))
  return list(topology.devices)


def compile_only_cuda_devices(topology: str, target_config: str) -> list:
  """The CUDA plugin's compile-only GPUs, ``topology`` ``'slices x hosts x
  devices per host'`` (``'1x1x8'``), each described by `target_config` (a
  ``GpuTargetConfig`` text proto)."""
  global _own_cuda_plugin
  initialize_backends_quietly()
  # XLA's notices (a config field it does not know) go with an error raised.
  if 'cuda' in _xb._topology_factories:  # JAX registered the plugin
    made, _ = _quietly(lambda: _xb.make_pjrt_topology(
        'cuda', '', topology=topology, target_config=target_config))
  else:
    if _own_cuda_plugin is None:
      library = cuda_plugin_library()
      if library is None:
        raise ModuleNotFoundError('no CUDA plugin for JAX is installed')
      _own_cuda_plugin, _ = _quietly(
          lambda: _xla_client.load_pjrt_plugin_dynamically('cuda', str(library)))
    made, _ = _quietly(lambda: _xla_client.make_c_api_device_topology(
        _own_cuda_plugin, '', topology=topology, target_config=target_config))
  return list(made._make_compile_only_devices())


def cuda_plugin_library():
  """The CUDA plugin's shared library, or None where none is installed."""
  import importlib.util
  for package in ('jax_plugins.xla_cuda13', 'jax_plugins.xla_cuda12'):
    try:
      spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
      spec = None
    if spec is not None and spec.origin:
      library = _pathlib.Path(spec.origin).parent / 'xla_cuda_plugin.so'
      if library.exists():
        return library
  return None


def tpu_support_installed() -> bool:
  return _xb.get_tpu_library_path() is not None


def gpu_target_config_of(devices) -> str:
  """The ``GpuTargetConfig`` text proto of live GPUs, as XLA describes them."""
  return str(_xla_client.get_topology_for_devices(list(devices)).target_config)


# -- the partitioner's propagation, without a compile ---------------------------------
# Under Shardy (JAX's partitioner since 0.7) the shardings of a program's
# results are decided by its propagation pipeline, the same MLIR passes
# XLA's compile runs first; jaxlib registers them for Python's pass manager.

from jax._src.lib.mlir import passmanager as _passmanager


def propagated_result_shardings(lowered) -> tuple[list[str], dict[str, str]] | None:
  """The ``sdy.sharding`` attribute of each result of `lowered` (a
  ``jax.stages.Lowered``) after Shardy's propagation, as text ('' for a
  result left unsharded), and the module's meshes by name (``#sdy.mesh<...>``
  as text); None where Shardy is not the partitioner. Runs on a copy:
  `lowered` still compiles as it was."""
  if not config.use_shardy_partitioner.value:
    return None
  module = lowered.compiler_ir('stablehlo').operation.clone()
  try:
    with module.context:
      _passmanager.PassManager.parse('builtin.module(sdy-propagation-pipeline)').run(module)
  except Exception:  # a jaxlib without the pipeline, or one it refuses: compile instead
    return None
  ops = module.regions[0].blocks[0].operations
  main = [op for op in ops
          if 'sym_name' in op.attributes and op.attributes['sym_name'].value == 'main']
  if len(main) != 1:
    return None
  results = main[0].attributes['res_attrs'] if 'res_attrs' in main[0].attributes else []
  meshes = {op.attributes['sym_name'].value: str(op.attributes['mesh'])
            for op in ops if op.operation.name == 'sdy.mesh'}
  return [str(a['sdy.sharding']) if 'sdy.sharding' in a else '' for a in results], meshes


__all__ = [name for name in dir() if not name.startswith('__')]
