"""Policy labels: every built-in policy, ours or JAX's, is named the way it
was built, so tables, charts and reports can say which one they show."""

import jax
import pytest

import remat_explorer as rx
from remat_explorer.analysis import describe_policy


def _built(namespace):
  """Each policy of `namespace` (ours or jax.checkpoint_policies), built
  with arguments where it is a factory: (attribute name, policy)."""
  arguments = {
      'save_only_these_names': ('a', 'b'),
      'save_any_names_but_these': ('a',),
      'save_anything_except_these_names': ('a',),
      'save_and_offload_only_these_names': dict(
          names_which_can_be_saved=['a'], names_which_can_be_offloaded=['b'],
          offload_src='device', offload_dst='pinned_host'),
      'offload_dot_with_no_batch_dims': ('device', 'pinned_host'),
      'save_from_both_policies': (namespace.dots_saveable, namespace.nothing_saveable),
  }
  built = []
  for name in dir(namespace):
    if name.startswith('_'):
      continue
    policy = getattr(namespace, name)
    args = arguments.get(name)
    if isinstance(args, dict):
      policy = policy(**args)
    elif args is not None:
      policy = policy(*args)
    built.append((name, policy))
  return built


@pytest.mark.parametrize('name,policy', [
    *_built(rx.checkpoint_policies), *_built(jax.checkpoint_policies)],
    ids=lambda v: v if isinstance(v, str) else '')
def test_policies_are_labelled_by_their_factory(name, policy):
  label = describe_policy(policy)
  aliases = {'checkpoint_dots': 'dots_saveable',
             'checkpoint_dots_with_no_batch_dims': 'dots_with_no_batch_dims_saveable'}
  assert label.startswith(aliases.get(name, name)), label
  assert 'object at 0x' not in label and '=' not in label.split('(')[0]


def test_jax_factories_are_labelled_like_ours():
  cp = jax.checkpoint_policies
  assert describe_policy(cp.save_only_these_names('q', 'k')) == "save_only_these_names('k', 'q')"
  assert describe_policy(rx.checkpoint_policies.offload_dot_with_no_batch_dims(
      'device', 'pinned_host')) == "offload_dot_with_no_batch_dims('device', 'pinned_host')"
