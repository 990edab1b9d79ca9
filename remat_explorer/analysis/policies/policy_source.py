"""A policy choice as Python a user pastes into their own code.

``policy_source(choice)`` writes any choice the analysis takes (a policy,
``{block: policy}``, the program as written, no remat) as text that needs
nothing but JAX: ``SearchResult.to_source()``, the Explorer's "copy as code"
and the report all say a policy with it, so the three say it alike. Policies
of ``jax.checkpoint_policies`` are written as the expression that builds them
(``parse_policy`` reads it back); a function of the user's own is named, not
invented.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Mapping

from remat_explorer.analysis.policies.chosen_policy import SaveChosen
from remat_explorer.analysis.policies.policy_info import NO_REMAT, describe_policy
from remat_explorer.analysis.policies.policy_text import parse_policy

AS_WRITTEN_SOURCE = (
    '# The program as written: keep each checkpoint\'s own policy. None is\n'
    '# jax.checkpoint\'s default (save only what is not computed inside it):\n'
    '# pass it only to a checkpoint that had no policy.\n'
    'policy = None\n')
_NO_REMAT_HEAD = '# No remat: best, call the checkpointed functions without jax.checkpoint.\n'
NO_REMAT_SOURCE = (
    _NO_REMAT_HEAD +
    '# Keeping the checkpoint, the closest policy saves every value and\n'
    '# recomputes nothing:\n'
    'import jax\n\n'
    'policy = jax.checkpoint_policies.everything_saveable\n')


def policy_source(choice) -> str:
  """Python that builds `choice` with JAX alone: as ``policy`` for one
  policy (paste it beside ``jax.checkpoint(f, policy=policy)``), as
  ``policies[name]`` for a ``{block name: policy}`` mapping (each passed to
  the checkpoint of the function that block runs).

  Example:
    >>> import jax
    >>> from remat_explorer import analysis
    >>> print(analysis.policy_source(jax.checkpoint_policies.save_only_these_names('qkv')))
    import jax
    <BLANKLINE>
    policy = jax.checkpoint_policies.save_only_these_names('qkv')
    <BLANKLINE>
  """
  if choice is None:
    return AS_WRITTEN_SOURCE
  if choice is NO_REMAT:
    return NO_REMAT_SOURCE
  if isinstance(choice, Mapping):
    return _per_block_source(choice)
  return 'import jax\n\n' + _defining_policy(choice)


def no_remat_source(keep_with, why: str) -> str:
  """``policy_source(NO_REMAT)`` where the policy to keep the checkpoint
  with is known from compiles (a search's): `keep_with`, `why` saying in a
  sentence what its compile showed."""
  comment = textwrap.fill(f'Keeping the checkpoint: {why}', width=76,
                          initial_indent='# ', subsequent_indent='# ')
  return f'{_NO_REMAT_HEAD}{comment}\nimport jax\n\n{_defining_policy(keep_with)}'


def _defining_policy(policy) -> str:
  """Statements that leave `policy` bound to it."""
  if isinstance(policy, SaveChosen):
    return policy.to_source()
  text = describe_policy(policy)
  try:  # a policy of checkpoint_policies is described as what builds it
    parse_policy(text)
  except ValueError:  # the user's own function (or a lambda): not rewritten
    return f'policy = ...  # {text}: a policy of your own, as in your code\n'
  return f'policy = {_qualified(text)}\n'


class _Qualify(ast.NodeTransformer):
  """Every policy named in an expression, as ``jax.checkpoint_policies.x``
  (a policy built from others names them bare)."""

  def visit_Name(self, node):
    return ast.copy_location(
        ast.Attribute(value=ast.Attribute(value=ast.Name('jax', ast.Load()),
                                          attr='checkpoint_policies', ctx=ast.Load()),
                      attr=node.id, ctx=ast.Load()), node)


def _qualified(text: str) -> str:
  tree = ast.parse(text, mode='eval')
  return ast.unparse(ast.fix_missing_locations(_Qualify().visit(tree)))


def _per_block_source(choice: Mapping) -> str:
  lines = ['import jax', '',
           '# One policy per checkpointed function: pass policies[name] to the',
           '# checkpoint (jax.checkpoint, nn.remat, eqx.filter_checkpoint, ...) of the',
           '# function of that name; the other checkpoints keep their own policies.',
           'policies = {}']
  for block, policy in choice.items():
    lines.append('')
    if policy is NO_REMAT:
      lines.append(f'# {block}: no remat (call it without checkpoint)')
      continue
    if policy is None:
      lines.append(f'# {block}: as written')
      continue
    lines.append(_defining_policy(policy).rstrip('\n'))
    lines.append(f'policies[{block!r}] = policy')
  return '\n'.join(lines) + '\n'
