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


@pytest.mark.parametrize('name,policy', _built(jax.checkpoint_policies),
                         ids=lambda v: v if isinstance(v, str) else '')
def test_labels_of_builtins_read_back_as_the_same_policy(name, policy):
  from remat_explorer.analysis.policies.policy_text import parse_policy
  label = describe_policy(policy)
  assert describe_policy(parse_policy(label)) == label
  assert describe_policy(parse_policy('jax.checkpoint_policies.' + label)) == label


def test_policy_expressions_are_read_safely_and_errors_say_what_is_accepted():
  from remat_explorer.analysis.policies.policy_text import parse_policy
  both = parse_policy("save_from_both_policies(dots_saveable, save_only_these_names('x', 'y'))")
  assert describe_policy(both) == (
      "save_from_both_policies(dots_saveable, save_only_these_names('x', 'y'))")
  with pytest.raises(ValueError, match="'os.system' is not in jax.checkpoint_policies"):
    parse_policy("os.system('echo')")
  with pytest.raises(ValueError, match='is not a policy'):
    parse_policy('save_only_these_names(open("f").read())')
  with pytest.raises(ValueError, match='not a Python expression'):
    parse_policy('save_only_these_names(')


def test_a_users_lambda_is_labelled_by_its_line():
  label = describe_policy(lambda prim, *_, **__: prim.name == 'dot_general')
  assert label.startswith('lambda at tests/test_policy_labels.py:')
  assert "prim.name == 'dot_general'" in label

  def my_policy(prim, *_, **__):
    return False
  assert describe_policy(my_policy) == 'my_policy'


def test_a_checkpoint_name_written_without_quotes_is_told_to_be_quoted():
  from remat_explorer.analysis.policies.policy_text import parse_policy
  with pytest.raises(ValueError, match=r"quote them, as in save_only_these_names\('mlp_hidden'\)"):
    parse_policy('save_only_these_names(mlp_hidden)')
  with pytest.raises(ValueError, match=r"save_only_these_names\('qkv', 'k'\)\.$"):
    parse_policy("save_from_both_policies(dots_saveable, save_only_these_names(qkv, 'k'))")
  # A policy's own name stays a policy: not a name to quote.
  parse_policy('save_from_both_policies(dots_saveable, nothing_saveable)')


def test_the_source_of_every_answer_defines_policy():
  """Code pasted from "as written" or "no remat" runs and binds ``policy``."""
  from remat_explorer.analysis import NO_REMAT, policy_source
  import jax
  for choice, expected in ((None, None), (NO_REMAT, jax.checkpoint_policies.everything_saveable),
                           (jax.checkpoint_policies.dots_saveable,
                            jax.checkpoint_policies.dots_saveable)):
    scope = {}
    exec(policy_source(choice), scope)
    assert scope['policy'] is expected, policy_source(choice)
