"""What a policy is, in words: its name, the names it refers to, and the
mistakes in it that JAX accepts silently.

A named-value policy whose names match no ``checkpoint_name`` in the program
saves nothing it was meant to save; a name both saved and offloaded is
ambiguous. Both are easy to make (a typo, a renamed layer) and invisible in
the results, so the report says so.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterable

from remat_explorer.analysis.source.cells import line_text
from remat_explorer.analysis.source.origins import relative_path
from remat_explorer.engine import (DotsSaveable, OffloadDotWithNoBatchDims,
                                   SaveAndOffloadOnlyTheseNames, SaveAnyNamesButThese,
                                   SaveAnythingExceptTheseNames, SaveFromBothPolicies,
                                   SaveOnlyTheseNames)


class _NoRemat:
  """Pass as `policy` to run every block as a plain call: no remat at all."""

  def __repr__(self):
    return 'NO_REMAT'

NO_REMAT = _NoRemat()


def describe_policy(policy) -> str:
  """A short name for a policy, ours or JAX's: for a built-in one, the
  expression that builds it (``save_only_these_names('k', 'q')``, which
  ``parse_policy`` reads back); for a function of the user's, its name, and
  for a lambda the line that wrote it.

  Example:
    >>> import jax
    >>> from remat_explorer import analysis
    >>> analysis.describe_policy(jax.checkpoint_policies.save_only_these_names('q', 'k'))
    "save_only_these_names('k', 'q')"
    >>> analysis.describe_policy(jax.checkpoint_policies.dots_saveable)
    'dots_saveable'
  """
  if policy is None:
    return 'nothing_saveable (default)'
  if policy is NO_REMAT:
    return 'no remat'
  if isinstance(policy, DotsSaveable):
    return ('dots_with_no_batch_dims_saveable' if policy.only_if_no_batch_dims
            else 'dots_saveable')
  for cls, factory in _NAMED_POLICY_FACTORIES.items():
    if isinstance(policy, cls):
      return _call(factory, sorted(policy.names))
  if isinstance(policy, SaveAndOffloadOnlyTheseNames):
    return _save_and_offload(policy.saved, policy.offloaded, policy.offload_src,
                             policy.offload_dst)
  if isinstance(policy, OffloadDotWithNoBatchDims):
    return _call('offload_dot_with_no_batch_dims', [policy.offload_src, policy.offload_dst])
  if isinstance(policy, SaveFromBothPolicies):
    return _both(policy.first, policy.second)
  if hasattr(policy, 'checkpoint_names'):  # describes itself (SaveChosen)
    return repr(policy)
  if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
    return _describe_jax_dataclass(policy)
  qualname = getattr(policy, '__qualname__', None) or ''
  if '.<locals>' in qualname and _is_jax_function(policy):
    return _describe_jax_closure(policy, qualname.split('.<locals>')[0])
  if qualname.endswith('<lambda>'):
    return _lambda_text(policy)
  return getattr(policy, '__name__', None) or repr(policy)


def _call(factory: str, args) -> str:
  return f"{factory}({', '.join(map(repr, args))})"


def _both(first, second) -> str:
  return f'save_from_both_policies({describe_policy(first)}, {describe_policy(second)})'


def _save_and_offload(saved, offloaded, src, dst) -> str:
  return ('save_and_offload_only_these_names('
          f'names_which_can_be_saved={sorted(saved)!r}, '
          f'names_which_can_be_offloaded={sorted(offloaded)!r}, '
          f'offload_src={src!r}, offload_dst={dst!r})')


def _is_jax_function(fn) -> bool:
  return (getattr(fn, '__module__', '') or '').startswith('jax.')


def _closure(fn) -> dict:
  names = getattr(getattr(fn, '__code__', None), 'co_freevars', ())
  cells = getattr(fn, '__closure__', None) or ()
  out = {}
  for name, cell in zip(names, cells):
    try:
      out[name] = cell.cell_contents
    except ValueError:  # an empty cell
      pass
  return out


def _describe_jax_closure(policy, factory: str) -> str:
  """JAX's policy factories that return closures, by the factory and the
  arguments the closure holds."""
  held = _closure(policy)
  if factory == 'save_from_both_policies' and {'policy_1', 'policy_2'} <= set(held):
    return _both(held['policy_1'], held['policy_2'])
  if factory == 'offload_dot_with_no_batch_dims' and 'offload_src' in held:
    return _call(factory, [held['offload_src'], held['offload_dst']])
  if factory == 'save_and_offload_only_these_names' and 'offload_src' in held:
    return _save_and_offload(held['names_which_can_be_saved'],
                             held['names_which_can_be_offloaded'],
                             held['offload_src'], held['offload_dst'])
  # The closure may not keep what it was built with (JAX 0.10.2's
  # save_anything_except_these_names keeps no names): the factory alone.
  return _call(factory, sorted(policy_names(policy)[0]))


def _lambda_text(policy) -> str:
  """``lambda at model.py:12: <the line>``: a lambda has no name; its line
  says what it is."""
  code = getattr(policy, '__code__', None)
  if code is None:
    return '<lambda>'
  where = line_text(relative_path(code.co_filename), code.co_firstlineno)
  try:
    line = inspect.getsourcelines(policy)[0][0].strip()
  except (OSError, TypeError):
    return f'lambda at {where}'
  text = _balanced_prefix(line[line.find('lambda'):]).rstrip(' ,')
  text = text if len(text) <= 60 else text[:59] + '…'
  return f'lambda at {where}: {text}'


def _balanced_prefix(text: str) -> str:
  """`text` up to where a bracket it did not open closes."""
  depth = 0
  for i, c in enumerate(text):
    depth += {'(': 1, '[': 1, '{': 1, ')': -1, ']': -1, '}': -1}.get(c, 0)
    if depth < 0:
      return text[:i]
  return text


def _describe_jax_dataclass(policy) -> str:
  """JAX's dataclass policies (``DotsSaveable``, ``SaveOnlyTheseNames``, ...)
  by the factory that builds them: the class name in snake case."""
  cls = type(policy).__name__
  if cls == 'DotsSaveable':
    return ('dots_with_no_batch_dims_saveable'
            if getattr(policy, 'only_if_no_batch_dims', False) else 'dots_saveable')
  # From JAX 0.11 the offloading policies are dataclasses too.
  if cls == 'OffloadDotWithNoBatchDims':
    return _call('offload_dot_with_no_batch_dims', [policy.offload_src, policy.offload_dst])
  if cls == 'SaveAndOffloadOnlyTheseNames':
    return _save_and_offload(policy.names_which_can_be_saved,
                             policy.names_which_can_be_offloaded,
                             policy.offload_src, policy.offload_dst)
  factory = re.sub(r'(?<!^)(?=[A-Z])', '_', cls).lower()
  return _call(factory, sorted(policy_names(policy)[0]))


_NAMED_POLICY_FACTORIES = {
    SaveOnlyTheseNames: 'save_only_these_names',
    SaveAnyNamesButThese: 'save_any_names_but_these',
    SaveAnythingExceptTheseNames: 'save_anything_except_these_names',
}


def policy_names(policy) -> tuple[frozenset[str], frozenset[str]]:
  """(names the policy refers to, names it both saves and offloads)."""
  if isinstance(policy, (SaveOnlyTheseNames, SaveAnyNamesButThese,
                         SaveAnythingExceptTheseNames)):
    return policy.names, frozenset()
  if isinstance(policy, SaveAndOffloadOnlyTheseNames):
    return policy.saved | policy.offloaded, policy.saved & policy.offloaded
  if isinstance(policy, SaveFromBothPolicies):
    first, second = policy_names(policy.first), policy_names(policy.second)
    return first[0] | second[0], first[1] | second[1]
  if hasattr(policy, 'checkpoint_names'):  # says which of its strings are names
    return frozenset(policy.checkpoint_names), frozenset()
  if dataclasses.is_dataclass(policy):  # JAX's own name policies, e.g.
    return frozenset().union(*(
        v for v in vars(policy).values() if _is_name_set(v))), frozenset()
  return _names_in_closure(policy), _saved_and_offloaded_in_closure(policy)


def _is_name_set(value) -> bool:
  return (isinstance(value, (set, frozenset, list, tuple)) and bool(value)
          and all(isinstance(v, str) for v in value))


def _string_sets_in_closure(policy) -> list[frozenset[str]]:
  # JAX's name policies are closures over the sets of names they were given.
  cells = getattr(policy, '__closure__', None) or ()
  found = []
  for cell in cells:
    try:
      value = cell.cell_contents
    except ValueError:  # an empty cell
      continue
    if _is_name_set(value):
      found.append(frozenset(value))
    elif callable(value) and getattr(value, '__closure__', None):
      found.extend(_string_sets_in_closure(value))
  return found


def _names_in_closure(policy) -> frozenset[str]:
  return frozenset().union(*_string_sets_in_closure(policy))


def _saved_and_offloaded_in_closure(policy) -> frozenset[str]:
  if 'offload' not in getattr(policy, '__qualname__', ''):
    return frozenset()
  sets = _string_sets_in_closure(policy)
  return (sets[0] & sets[1]) if len(sets) >= 2 else frozenset()


def _some(names: list[str], shown: int = 6) -> str:
  """`names` joined, the first `shown` of a longer list and how many more."""
  more = len(names) - shown
  return ', '.join(names[:shown]) + (f' and {more} more' if more > 0 else '')


def _shortened(label: str, length: int = 80) -> str:
  return label if len(label) <= length else label[:length - 1] + '…'


def policy_warnings(policies: Iterable, names_in_program: Iterable[str], *,
                    subject: str | None = None) -> list[str]:
  """Warnings about `policies` (one per distinct policy) for this program;
  each names its policy, or says `subject` (``'this policy'``, where the
  policy is named beside it: a comparison's row, whose note is kept short)."""
  names_in_program = set(names_in_program)
  warnings, seen = [], set()
  for policy in policies:
    key = repr(policy)
    if policy is None or key in seen:
      continue
    seen.add(key)
    names, both = policy_names(policy)
    unmatched = sorted(names - names_in_program)
    label = subject or f'policy {_shortened(describe_policy(policy))}'
    shown = 2 if subject else 6
    if unmatched:
      warnings.append(
          f'{label} refers to checkpoint_name(s) {_some(unmatched, shown)} that do not '
          'occur in the program (names in the program: '
          f'{_some(sorted(names_in_program), shown) or "none"}); it cannot save those values.')
    if both:
      warnings.append(
          f'{label} lists {_some(sorted(both), shown)} both to save '
          'on the device and to offload; the saved list wins, so these values '
          'are not offloaded.')
  return warnings


