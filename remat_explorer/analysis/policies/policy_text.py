"""Policies written as text: ``save_only_these_names('qkv', 'mlp_hidden')``.

``parse_policy`` builds a policy from the expression a user would write
with ``jax.checkpoint_policies`` (on a command line, in a text box, or as
``SearchResult.to_source()`` returns it), evaluating nothing but the
policies' names, their factories and literal arguments: it is safe to call
on text from anywhere.
"""

from __future__ import annotations

import ast
import difflib

import jax

_PREFIXES = ('jax.checkpoint_policies.', 'jax.ad_checkpoint.checkpoint_policies.',
             'checkpoint_policies.', 'rx.checkpoint_policies.',
             'remat_explorer.checkpoint_policies.', 'cp.')


def parse_policy(text: str):
  """The policy `text` builds with ``jax.checkpoint_policies``.

  Accepts a policy's name (``dots_saveable``, with or without the
  ``jax.checkpoint_policies.`` prefix), or a call of a factory with literal
  arguments and other policies: ``save_from_both_policies(dots_saveable,
  save_only_these_names('x'))``. Anything else is a ``ValueError`` that says
  what is accepted.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> from remat_explorer import analysis
    >>> policy = analysis.parse_policy("save_only_these_names('hidden')")
    >>> f = jax.checkpoint(lambda x: jnp.sum(jnp.sin(rx.checkpoint_name(jnp.sin(x), 'hidden'))),
    ...                    policy=policy)
    >>> x = jax.random.normal(jax.random.key(0), (16,))
    >>> [r.argument or r.name for r in rx.analyze(f, x).residuals]
    ['x', 'hidden']
  """
  if not isinstance(text, str):
    raise TypeError(f'a policy expression is a str, got {type(text).__name__}.')
  try:
    tree = ast.parse(text.strip(), mode='eval')
  except SyntaxError as e:
    raise ValueError(f'{text!r} is not a Python expression: {e.msg}. '
                     + _ACCEPTED) from None
  return _evaluate(tree.body, text)


_ACCEPTED = ('Write a policy of jax.checkpoint_policies by name (dots_saveable) '
             "or as a call with literal arguments, e.g. "
             "save_only_these_names('qkv', 'mlp_hidden').")


# The entries of checkpoint_policies that build a policy from arguments.
FACTORIES = frozenset({
    'save_only_these_names', 'save_any_names_but_these',
    'save_anything_except_these_names', 'save_and_offload_only_these_names',
    'offload_dot_with_no_batch_dims', 'save_from_both_policies'})


def _evaluate(node, text):
  if isinstance(node, (ast.Name, ast.Attribute)):
    name, policy = _policy_named(_dotted(node, text), text)
    if name in FACTORIES:
      raise ValueError(f'{text!r}: {name} builds a policy from arguments; call '
                       f"it, e.g. {name}('qkv')." if 'names' in name else
                       f'{text!r}: {name} builds a policy from arguments; call it.')
    return policy
  if isinstance(node, ast.Call):
    name, factory = _policy_named(_dotted(node.func, text), text)
    if name not in FACTORIES:
      raise ValueError(f'{text!r}: {name} is a policy already, not a factory: '
                       f'write {name} without parentheses.')
    _names_are_quoted(name, node, text)
    args = [_argument(a, text) for a in node.args]
    kwargs = {k.arg: _argument(k.value, text) for k in node.keywords}
    if any(k is None for k in kwargs):
      raise ValueError(f'{text!r}: **kwargs are not accepted. ' + _ACCEPTED)
    try:
      return factory(*args, **kwargs)
    except (TypeError, ValueError) as e:
      raise ValueError(f'{text!r}: {e}') from None
  raise ValueError(f'{text!r}: {ast.unparse(node)!r} is not a policy. ' + _ACCEPTED)


def _names_are_quoted(factory: str, call, text) -> None:
  """A factory of names given a bare word (``save_only_these_names(qkv)``)
  was given a name without its quotes: say so, with the call quoted."""
  if 'names' not in factory:
    return
  given = [*call.args, *(k.value for k in call.keywords)]
  given += [e for a in given if isinstance(a, (ast.List, ast.Tuple, ast.Set)) for e in a.elts]
  bare = {a.id for a in given
          if isinstance(a, ast.Name) and not hasattr(jax.checkpoint_policies, a.id)}
  if bare:
    quoted = ast.unparse(_QuoteNames(bare).visit(call))
    raise ValueError(f'{text!r}: checkpoint names are strings: quote them, as in '
                     f'{quoted}.')


class _QuoteNames(ast.NodeTransformer):
  def __init__(self, names):
    self.names = names

  def visit_Name(self, node):
    return ast.Constant(node.id) if node.id in self.names else node


def _argument(node, text):
  if isinstance(node, (ast.Call, ast.Name, ast.Attribute)):
    return _evaluate(node, text)
  try:
    return ast.literal_eval(node)
  except ValueError:
    raise ValueError(f'{text!r}: the argument {ast.unparse(node)!r} is neither a '
                     'literal nor a policy. ' + _ACCEPTED) from None


def _dotted(node, text) -> str:
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    raise ValueError(f'{text!r}: {ast.unparse(node)!r} is not a policy. ' + _ACCEPTED)
  return '.'.join([node.id, *reversed(parts)])


def _policy_named(name: str, text):
  for prefix in _PREFIXES:
    if name.startswith(prefix):
      name = name[len(prefix):]
      break
  if name.startswith('_') or not hasattr(jax.checkpoint_policies, name):
    names = sorted(n for n in vars(jax.checkpoint_policies) if not n.startswith('_'))
    where = '' if text == name else f'{text!r}: '
    close = difflib.get_close_matches(name, names, n=1)
    hint = f'; did you mean {close[0]!r}?' if close else ''
    raise ValueError(f'{where}{name!r} is not in jax.checkpoint_policies{hint} '
                     f'(it has {", ".join(names)}).')
  return name, getattr(jax.checkpoint_policies, name)
