"""The offload policies: residuals placed in host memory instead of recomputed."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat_explorer as rx
from tests.parity import assert_trees_equal

X = jnp.asarray(np.random.default_rng(5).standard_normal((8, 8)), jnp.float32)
OFFLOAD = dict(offload_src='device', offload_dst='pinned_host')


def block(x):
  h = checkpoint_name(jnp.sin(x @ x), 'a')
  return jnp.sum(jnp.sin(checkpoint_name(h @ x, 'b')))


def _policies(policies):
  return [policies.save_and_offload_only_these_names(
              names_which_can_be_saved=['b'], names_which_can_be_offloaded=['a'], **OFFLOAD),
          policies.offload_dot_with_no_batch_dims(**OFFLOAD)]


@pytest.mark.parametrize('index', [0, 1], ids=['names', 'dots'])
def test_offloaded_residuals_live_in_host_memory_like_jax(index):
  ours = rx.checkpoint(block, policy=_policies(rx.checkpoint_policies)[index])
  theirs = jax.checkpoint(block, policy=_policies(jax.checkpoint_policies)[index])
  residual_spaces = lambda f: [str(v.aval.memory_space) for v in
                               jax.make_jaxpr(lambda x: jax.vjp(f, x))(X).jaxpr.outvars[1:]]
  spaces = residual_spaces(ours)
  assert 'MemorySpace.Host' in spaces
  assert spaces == residual_spaces(theirs)
  assert_trees_equal(jax.jit(jax.grad(ours))(X), jax.jit(jax.grad(theirs))(X))
  assert_trees_equal(jax.grad(ours)(X), jax.grad(theirs)(X))


def test_unknown_memory_kind_is_a_clear_error():
  with pytest.raises(ValueError, match=r"offload_dst='host_ram' is not a memory kind.*pinned_host"):
    rx.checkpoint_policies.offload_dot_with_no_batch_dims('device', 'host_ram')
  with pytest.raises(ValueError, match=r"offload_src='gpu' is not a memory kind"):
    rx.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=['a'],
        offload_src='gpu', offload_dst='pinned_host')


def _placement_annotations(text):
  return sorted(re.findall(r'memory_kind = "\w+"|annotate_device_placement|'
                           r'_xla_buffer_placement[^,}]*', text))


@pytest.mark.parametrize('index', [0, 1], ids=['names', 'dots'])
def test_offloaded_lowering_and_compiled_memory_match_jax(index):
  """Same host placements in the lowered program, same compiled memory.

  On the CPU, host and device memory are one, and XLA lowers the transfers
  to nothing (the documented fallback: offloading there changes no numbers).
  On an accelerator the lowered program must place residuals in pinned host
  memory.
  """
  ours = rx.checkpoint(block, policy=_policies(rx.checkpoint_policies)[index])
  theirs = jax.checkpoint(block, policy=_policies(jax.checkpoint_policies)[index])
  lowered = [jax.jit(jax.grad(f)).lower(X) for f in (ours, theirs)]
  annotations = [_placement_annotations(low.as_text()) for low in lowered]
  assert annotations[0] == annotations[1]
  stats = [low.compile().memory_analysis() for low in lowered]
  assert stats[0].temp_size_in_bytes == stats[1].temp_size_in_bytes
  assert stats[0].host_temp_size_in_bytes == stats[1].host_temp_size_in_bytes
  if jax.devices()[0].platform != 'cpu':
    assert any('pinned_host' in a for a in annotations[0])


def test_offloaded_residuals_keep_the_name_of_the_value_that_moved():
  from remat_explorer.analysis import analyze
  def block(x, w):
    scores = rx.checkpoint_name(jnp.sin(x @ w), 'scores')
    return jnp.sum(jnp.cos(scores) @ w)
  policy = rx.checkpoint_policies.save_and_offload_only_these_names(
      names_which_can_be_saved=[], names_which_can_be_offloaded=['scores'],
      offload_src='device', offload_dst='pinned_host')
  x = jax.random.normal(jax.random.key(0), (4, 8))
  w = jax.random.normal(jax.random.key(1), (8, 8))
  (offloaded,) = [r for r in analyze(rx.checkpoint(block, policy=policy), x, w).residuals
                  if r.memory_space == 'host']
  assert offloaded.name == 'scores' and offloaded.primitive == 'device_put'
