"""What a user's function takes by keyword, read from its signature before
anything is traced.

``saved_residuals(f, x, policy=p)`` passes ``policy`` on to `f`, as JAX's
own ``print_saved_residuals`` does; where `f` takes no such argument, the
keyword reaches JAX as one more leaf of the arguments, and tracing fails
deep inside JAX with an error about an argument it cannot read as an
array. A keyword `f` does not take is refused first, by name.
"""

from __future__ import annotations

import inspect


def keyword_parameters(fn) -> tuple[bool, set[str]] | None:
  """(whether `fn` takes ``**kwargs``, the names it takes by keyword); None
  where it has no signature to read (the function decides)."""
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return None
  params = signature.parameters.values()
  return (any(p.kind is p.VAR_KEYWORD for p in params),
          {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)})


def refuse_keywords_not_taken(caller: str, f, kwargs) -> None:
  """A ``TypeError`` naming the first keyword of `kwargs` that `f` does not
  take, for `caller`, which passes its keywords on to `f`."""
  params = keyword_parameters(f)
  if params is None or params[0]:
    return
  for name in kwargs:
    if name not in params[1]:
      hint = (' To see the residuals under another policy, checkpoint the function '
              'with it, or use remat_explorer.analyze(f, *args, policy=...).residuals.'
              if name == 'policy' else '')
      raise TypeError(f'{caller}: {name}= is not an argument of '
                      f'{getattr(f, "__qualname__", None) or type(f).__name__}; '
                      f'{caller} passes its keyword arguments on to the function, as '
                      f'jax.ad_checkpoint.{caller} does.{hint}')
