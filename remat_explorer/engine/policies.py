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


# cuDNN's scaled matmul is recognised by name, so as not to import its module.
_SCALED_MATMUL = 'scaled_matmul_wrapper'


def _name_of(prim, params) -> str | None:
  """The name a ``checkpoint_name`` equation gives its output; None for any
  other equation."""
  return params['name'] if prim is jx.jax_name_p else None


def _is_matmul_like(prim) -> bool:
  return (prim is jx.dot_general_p or prim is jx.conv_general_dilated_p
          or prim.name == _SCALED_MATMUL)


def _has_no_batch_dims(prim, avals, params) -> bool:
  """Whether a matmul-like equation has no batch dimension. A scaled
  matmul's leading axis is its batch, so a batch of one counts as none; a
  convolution never counts as unbatched (JAX's policy never saves one)."""
  if prim is jx.dot_general_p:
    _, batch_dims = params['dimension_numbers']
    return not any(batch_dims)
  if prim.name == _SCALED_MATMUL:
    return avals[0].shape[0] == 1
  return False


def everything_saveable(*_, **__) -> bool:
  """Save every value: differentiation behaves as if there were no remat."""
  return True


def nothing_saveable(*_, **__) -> bool:
  """Save nothing computed inside the block: recompute it all (the default)."""
  return False


@dataclass(frozen=True)
class DotsSaveable:
  """Save the outputs of matrix multiplies and convolutions.

  With ``only_if_no_batch_dims``, only the unbatched ones (weight matmuls,
  not attention's batched products; see ``_has_no_batch_dims``).
  """
  only_if_no_batch_dims: bool

  def __call__(self, prim, *avals, **params) -> bool:
    if not _is_matmul_like(prim):
      return False
    return (not self.only_if_no_batch_dims
            or _has_no_batch_dims(prim, avals, params))


dots_saveable = checkpoint_dots = DotsSaveable(only_if_no_batch_dims=False)
dots_with_no_batch_dims_saveable = checkpoint_dots_with_no_batch_dims = (
    DotsSaveable(only_if_no_batch_dims=True))


@dataclass(frozen=True)
class SaveOnlyTheseNames:
  """Save only values named with one of ``names``; recompute the rest."""
  names: frozenset[str]

  def __call__(self, prim, *_, **params) -> bool:
    return _name_of(prim, params) in self.names


@dataclass(frozen=True)
class SaveAnyNamesButThese:
  """Save every named value except those named in ``names``."""
  names: frozenset[str]

  def __call__(self, prim, *_, **params) -> bool:
    name = _name_of(prim, params)
    return name is not None and name not in self.names


@dataclass(frozen=True)
class SaveAnythingExceptTheseNames:
  """Save everything, as JAX 0.10.2's policy of the same name does.

  Excluding a name cannot drop the value it names: the equation that produced
  it is itself saveable, so the same buffer is kept under another label.
  JAX 0.10.2 therefore saves everything here, and so do we, for parity.
  Before 0.10.2, JAX refused the names' own equations, and so do we there.
  """
  names: frozenset[str]

  def __call__(self, prim, *_, **params) -> bool:
    if jx.EXCEPT_THESE_NAMES_SAVES_EVERYTHING or prim is not jx.jax_name_p:
      return True
    return params['name'] not in self.names


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
    # Both are always asked, so a policy that cannot be combined is reported
    # whichever way the other answers.
    answers = [policy(prim, *avals, **params) for policy in (self.first, self.second)]
    if not all(isinstance(answer, bool) for answer in answers):
      raise ValueError(
          'save_from_both_policies combines policies that answer True/False, '
          f'but got {answers[0]!r} and {answers[1]!r}. Write a custom policy '
          'for policies that answer Saveable/Recompute/Offloadable.')
    return any(answers)


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
    name = _name_of(prim, params)
    if name in self.saved:
      return Saveable
    if name in self.offloaded:
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

  def __call__(self, prim, *avals, **params):
    if prim is jx.dot_general_p and _has_no_batch_dims(prim, avals, params):
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


# -- a user's policy, as the split calls it ----------------------------------

class _CheckedPolicy:
  """A user's policy, with its failures explained in terms of `policy=`."""

  def __init__(self, policy):
    self.policy = policy

  def __eq__(self, other):
    return isinstance(other, _CheckedPolicy) and other.policy == self.policy

  def __hash__(self):
    return hash(self.policy)

  def __call__(self, prim, *avals, **params):
    try:
      answer = self.policy(prim, *avals, **params)
    except Exception as e:
      # One line naming the policy, the primitive and what went wrong; the
      # policy's own exception stays attached as the cause.
      problem = str(e).splitlines()[0] if str(e) else ''
      raise TypeError(
          f'The remat policy {_policy_name(self.policy)} (the `policy=` argument of '
          f'checkpoint) raised {type(e).__name__} when asked about primitive '
          f'{prim.name!r}: {problem} (a policy is called as policy(prim, *avals, '
          '**params))') from e
    if not isinstance(answer, (bool, type(jx.Saveable), type(jx.Recompute),
                               jx.Offloadable)):
      raise TypeError(
          f'The remat policy {_policy_name(self.policy)} (the `policy=` argument of '
          f'checkpoint) returned {answer!r} of type {type(answer).__name__} '
          f'for primitive {prim.name!r}; a policy must return a bool, or '
          'Saveable, Recompute or Offloadable(src=..., dst=...) from '
          'jax.ad_checkpoint.')
    return answer


def _policy_name(policy) -> str:
  """A policy as its author would recognise it: its name, and where it
  was written."""
  code = getattr(policy, '__code__', None)
  name = getattr(policy, '__qualname__', None)
  if code is None or name is None:
    return repr(policy)
  return f'{name.rsplit("<locals>.", 1)[-1]} ({code.co_filename}:{code.co_firstlineno})'


def checked_policy(policy):
  """`policy` (None for the default) as the split calls it: a failure or a
  wrong answer explained in terms of ``policy=``."""
  return None if policy is None else _CheckedPolicy(policy)
