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
  `device`'s backend: what ``Compiled.cost_analysis()`` reports for a
  compiled module, applicable to a module rewritten from one (a loop's body
  as the entry). None where this jaxlib has no such binding."""
  from jax._src import lib
  parse = getattr(getattr(lib, 'hlo', None), 'hlo_module_from_text', None)
  analyze = getattr(getattr(lib, '_jax', None), 'hlo_module_cost_analysis', None)
  if parse is None or analyze is None:
    return None
  return float(analyze(device.client, parse(hlo_text)).get('flops', 0.0))


__all__ = [name for name in dir() if not name.startswith('__')]
