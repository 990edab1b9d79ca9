"""The keywords an entry point takes, checked before anything is traced.

``analyze(f, x, polciy=p)`` would otherwise pass ``polciy`` on to the
user's function, which fails deep inside tracing with an error about the
user's own code; and an option that shares its name with an argument of
the user's function would be taken by the entry point, silently.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Mapping

from remat_explorer import engine
from remat_explorer.analysis.program.problem import check_has_aux, function_name

# The analysis' entry points, each registered where it is defined (they sit
# in layers above this one), so that a keyword given to the wrong one
# (``analyze(..., memory_budget=...)``) is recognised.
_ENTRY_POINTS: dict[str, object] = {}


def entry_point(fn):
  """Register `fn` as an entry point whose options the others recognise.
  Its first call starts JAX's backends without the notices of accelerators
  this machine does not have (``engine.initialize_backends_quietly``)."""
  _ENTRY_POINTS[fn.__name__] = fn

  @functools.wraps(fn)
  def entered(*args, **kwargs):
    engine.initialize_backends_quietly()
    return fn(*args, **kwargs)
  return entered


def check_keywords(entry, f, kwargs: Mapping, **given_options) -> None:
  """Refuse keywords in `kwargs` that neither `entry` (an entry point such as
  ``analyze``) nor `f` (or each function of a mapping) accepts, naming the
  option they resemble; refuse an option of `entry` given a value (not its
  default) whose name is also a keyword argument of `f`, and a `has_aux`
  that is not a bool."""
  if 'has_aux' in given_options:
    check_has_aux(given_options['has_aux'])
  functions = list(f.values()) if isinstance(f, Mapping) else [f]
  options = _options(entry)
  defaults = {name: p.default for name, p in inspect.signature(entry).parameters.items()}
  for fn in functions:
    params = engine.keyword_parameters(fn)
    if params is None:  # no signature to read: the function decides
      continue
    accepts_any, names = params
    if not accepts_any:
      for name in kwargs:
        if name not in names:
          raise TypeError(_unknown(entry.__name__, name, fn, options, names))
    for name, value in given_options.items():
      if name in names and not _same(value, defaults.get(name)):
        raise TypeError(
            f'{entry.__name__}: {name}= is an option of {entry.__name__} and also an '
            f'argument of {function_name(fn)}; pass that argument positionally or bind '
            f'it with functools.partial, so that the two cannot be confused.')


def _options(entry) -> list[str]:
  return [name for name, p in inspect.signature(entry).parameters.items()
          if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name != 'f']


def _unknown(entry: str, name: str, fn, options, names) -> str:
  """The error for `name`, naming the closest option or argument: the
  entry point's own and the function's first, then other entry points'."""
  own = {option: f'an option of {entry}' for option in options}
  own.update({n: f'an argument of {function_name(fn)}' for n in names})
  takers: dict[str, list[str]] = {}
  for other, other_entry in _ENTRY_POINTS.items():
    if other != entry:
      for option in _options(other_entry):
        takers.setdefault(option, []).append(other)
  others = {option: f'an option of {_listed(names)}, not of {entry}'
            for option, names in takers.items()}
  # Spelt right and given to the wrong entry point, before any near miss
  # (an option of this one is never unknown): ``estimate_costs``'
  # ``donate_argnums=`` given to ``analyze`` is not a misspelt ``argnums=``.
  hint = f' {name}= is {others[name]}.' if name in others else ''
  for candidates in (own, others):
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if close and not hint:
      hint = f' Did you mean {close[0]}= ({candidates[close[0]]})?'
  return (f'{entry} got the keyword {name}=, which is neither one of its options '
          f'nor an argument of {function_name(fn)}.{hint}')


def _listed(names: list[str]) -> str:
  """``a``, ``a and b``, ``a, b and c``."""
  return ' and '.join(filter(None, (', '.join(names[:-1]), names[-1])))


def _same(value, default) -> bool:
  try:
    return value is default or bool(value == default)
  except Exception:  # an array, or something without a truth value
    return False
