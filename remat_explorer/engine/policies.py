"""Remat policies: which intermediate values the forward pass may keep.

A policy is called once per first-order equation of a checkpointed function,
as ``policy(primitive, *input_avals, **params)``, and answers whether that
equation's outputs may be saved as residuals (``True``), must be recomputed
(``False``), or may be offloaded to another memory space (``Offloadable``).

These are our own implementations of every policy in
``jax.checkpoint_policies`` (JAX 0.10.2). They speak the same protocol, so a
policy from here works with ``jax.checkpoint`` and a JAX policy works with our
``checkpoint``. Values are recognised as named when they come out of JAX's
``name`` primitive, which both libraries' ``checkpoint_name`` bind.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

from remat_explorer.engine import _jax_internals as jx

Saveable = jx.Saveable
Recompute = jx.Recompute
Offloadable = jx.Offloadable


def _is_named(prim) -> bool:
  return prim is jx.jax_name_p


def _is_dot_without_batch_dims(prim, params) -> bool:
  if prim is not jx.dot_general_p:
    return False
  _, (lhs_batch, rhs_batch) = params['dimension_numbers']
  return not lhs_batch and not rhs_batch


def everything_saveable(*_, **__) -> bool:
  """Save every value: differentiation behaves as if there were no remat."""
  return True


def nothing_saveable(*_, **__) -> bool:
  """Save nothing computed inside the block: recompute it all (the default)."""
  return False


@dataclass(frozen=True)
class DotsSaveable:
  """Save the outputs of matrix multiplies and convolutions.

  With ``only_if_no_batch_dims``, only ``dot_general``s without batch
  dimensions are saved (weight matmuls, not attention's batched products).
  """
  only_if_no_batch_dims: bool

  def __call__(self, prim, *avals, **params) -> bool:
    # cuDNN's scaled matmul is matched by name to avoid importing its module.
    is_scaled_matmul = prim.name == 'scaled_matmul_wrapper'
    if self.only_if_no_batch_dims:
      if is_scaled_matmul:
        return avals[0].shape[0] == 1  # a batch of one is no batch
      return _is_dot_without_batch_dims(prim, params)
    return (prim is jx.dot_general_p or prim is jx.conv_general_dilated_p
            or is_scaled_matmul)


dots_saveable = checkpoint_dots = DotsSaveable(only_if_no_batch_dims=False)
dots_with_no_batch_dims_saveable = checkpoint_dots_with_no_batch_dims = (
    DotsSaveable(only_if_no_batch_dims=True))


@dataclass(frozen=True)
class SaveOnlyTheseNames:
  """Save only values named with one of ``names``; recompute the rest."""
  names: frozenset[str]

  def __call__(self, prim, *_, **params) -> bool:
    return _is_named(prim) and params['name'] in self.names


@dataclass(frozen=True)
class SaveAnyNamesButThese:
  """Save every named value except those named in ``names``."""
  names: frozenset[str]

  def __call__(self, prim, *_, **params) -> bool:
    return _is_named(prim) and params['name'] not in self.names


@dataclass(frozen=True)
class SaveAnythingExceptTheseNames:
  """Save everything, as JAX 0.10.2's policy of the same name does.

  Excluding a name cannot drop the value it names: the equation that produced
  it is itself saveable, so the same buffer is kept under another label.
  JAX 0.10.2 therefore saves everything here, and so do we, for parity.
  """
  names: frozenset[str]

  def __call__(self, *_, **__) -> bool:
    return True


def save_only_these_names(*names: str) -> SaveOnlyTheseNames:
  return SaveOnlyTheseNames(frozenset(names))


def save_any_names_but_these(*names: str) -> SaveAnyNamesButThese:
  return SaveAnyNamesButThese(frozenset(names))


def save_anything_except_these_names(*names: str) -> SaveAnythingExceptTheseNames:
  return SaveAnythingExceptTheseNames(frozenset(names))


@dataclass(frozen=True)
class SaveFromBothPolicies:
  """Save a value if either policy would (their logical OR)."""
  first: object
  second: object

  def __call__(self, prim, *avals, **params) -> bool:
    a = self.first(prim, *avals, **params)
    b = self.second(prim, *avals, **params)
    if not (isinstance(a, bool) and isinstance(b, bool)):
      raise ValueError(
          'save_from_both_policies combines policies that answer True/False, '
          f'but got {a!r} and {b!r}. Write a custom policy for policies that '
          'answer Saveable/Recompute/Offloadable.')
    return a or b


def save_from_both_policies(policy_1, policy_2) -> SaveFromBothPolicies:
  return SaveFromBothPolicies(policy_1, policy_2)


@dataclass(frozen=True)
class SaveAndOffloadOnlyTheseNames:
  """Save some names on the device, offload others; recompute the rest."""
  saved: frozenset[str]
  offloaded: frozenset[str]
  offload_src: str
  offload_dst: str

  def __call__(self, prim, *_, **params):
    if _is_named(prim):
      if params['name'] in self.saved:
        return Saveable
      if params['name'] in self.offloaded:
        return Offloadable(src=self.offload_src, dst=self.offload_dst)
    return Recompute


# The memory kinds JAX knows; any other name silently means device memory in
# JAX 0.10.2, so an offload to a misspelt kind would quietly not happen.
MEMORY_KINDS = ('device', 'pinned_host', 'unpinned_host')


def _check_memory_kinds(**kinds):
  for arg, kind in kinds.items():
    if kind not in MEMORY_KINDS:
      raise ValueError(
          f'{arg}={kind!r} is not a memory kind; use one of {MEMORY_KINDS} '
          "(e.g. offload_src='device', offload_dst='pinned_host').")


def save_and_offload_only_these_names(
    *, names_which_can_be_saved, names_which_can_be_offloaded,
    offload_src, offload_dst) -> SaveAndOffloadOnlyTheseNames:
  _check_memory_kinds(offload_src=offload_src, offload_dst=offload_dst)
  saved = frozenset(names_which_can_be_saved)
  offloaded = frozenset(names_which_can_be_offloaded)
  if saved & offloaded:
    raise ValueError(
        'A name cannot be both saved and offloaded, but '
        f'{sorted(saved & offloaded)} appear in both '
        'names_which_can_be_saved and names_which_can_be_offloaded.')
  return SaveAndOffloadOnlyTheseNames(saved, offloaded, offload_src, offload_dst)


@dataclass(frozen=True)
class OffloadDotWithNoBatchDims:
  """Offload the outputs of batch-free dots instead of recomputing them."""
  offload_src: str
  offload_dst: str

  def __call__(self, prim, *_, **params):
    if _is_dot_without_batch_dims(prim, params):
      return Offloadable(src=self.offload_src, dst=self.offload_dst)
    return Recompute


def offload_dot_with_no_batch_dims(offload_src, offload_dst):
  _check_memory_kinds(offload_src=offload_src, offload_dst=offload_dst)
  return OffloadDotWithNoBatchDims(offload_src, offload_dst)


checkpoint_policies = types.SimpleNamespace(
    everything_saveable=everything_saveable,
    nothing_saveable=nothing_saveable,
    dots_saveable=dots_saveable,
    checkpoint_dots=checkpoint_dots,
    dots_with_no_batch_dims_saveable=dots_with_no_batch_dims_saveable,
    checkpoint_dots_with_no_batch_dims=checkpoint_dots_with_no_batch_dims,
    offload_dot_with_no_batch_dims=offload_dot_with_no_batch_dims,
    save_anything_except_these_names=save_anything_except_these_names,
    save_any_names_but_these=save_any_names_but_these,
    save_only_these_names=save_only_these_names,
    save_from_both_policies=save_from_both_policies,
    save_and_offload_only_these_names=save_and_offload_only_these_names,
)
