"""A search's memory budget: bytes (an int, or a size with its unit such as
"14 GiB", as budgets are printed), a fraction of the way from
``nothing_saveable``'s compiled peak to ``everything_saveable``'s, or a
share of the device's memory ("90%"), checked before anything is compiled
and resolved to bytes once the policies it is measured on are."""

from __future__ import annotations

import re

from remat_explorer.analysis.units import parse_bytes

_SHARE = re.compile(r'\s*(\d+(?:\.\d*)?)\s*%\s*')


def device_share(memory_budget: str) -> float:
  """``"90%"`` -> 0.9."""
  m = _SHARE.fullmatch(memory_budget)
  if m is None or not 0 < float(m.group(1)) <= 100:
    raise ValueError(f'memory_budget={memory_budget!r} as a share of the device\'s memory '
                     'must be a percentage above 0 and at most 100, such as "90%".')
  return float(m.group(1)) / 100


def checked_budget(memory_budget) -> int | float | str:
  """`memory_budget` checked, before anything is compiled: a size with its
  unit (``"14 GiB"``) made bytes, anything else as given."""
  if isinstance(memory_budget, str):
    size = parse_bytes(memory_budget)
    if size is not None:
      memory_budget = size
    elif not memory_budget.strip().endswith('%'):
      raise ValueError(
          f'memory_budget={memory_budget!r} is neither a size with its unit, such as '
          '"14 GiB" or "512 MiB" (KiB, MiB, GiB, TiB: powers of 1024; kB, MB, GB, TB: of '
          '1000), nor a share of the device\'s memory as a percentage, such as "90%".')
    else:
      device_share(memory_budget)
      return memory_budget
  if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float)):
    raise TypeError(
        f'memory_budget must be bytes (an int, or a size such as "14 GiB"), a fraction '
        f'(a float between 0.0 and 1.0) or a share of the device\'s memory ("90%"), got '
        f'{type(memory_budget).__name__} {memory_budget!r}.')
  if isinstance(memory_budget, float) and not 0.0 <= memory_budget <= 1.0:
    raise ValueError(
        f'memory_budget={memory_budget} as a fraction must lie between 0.0 (the '
        'peak of nothing_saveable) and 1.0 (that of everything_saveable); pass '
        'an int for a budget in bytes.')
  if isinstance(memory_budget, int) and memory_budget <= 0:
    raise ValueError(f'memory_budget={memory_budget} bytes must be positive.')
  return memory_budget


def resolve_budget(memory_budget, builtins, floor=None) -> int:
  """The budget in bytes; `builtins` holds nothing_saveable's and
  everything_saveable's compiled (costs, report) for a fraction, `floor`
  the step's argument and output bytes where nothing_saveable's is not."""
  if isinstance(memory_budget, int):
    nothing = builtins.get('nothing_saveable', (None,))[0]
    if floor is None and nothing is not None and not nothing.failed:
      floor = nothing.argument_bytes + nothing.output_bytes
    if floor is not None and memory_budget < floor:
      raise ValueError(
          f'memory_budget={memory_budget} is bytes, fewer than the step\'s '
          f'arguments and outputs alone take ({floor:,} bytes), so no policy '
          'can fit it. For a fraction of the way from nothing_saveable to '
          'everything_saveable pass a float (memory_budget=1.0, 0.5, ...).')
    return memory_budget
  if isinstance(memory_budget, str):
    costs = builtins['nothing_saveable'][0]
    if not costs.device_memory_bytes:
      raise ValueError(
          f'memory_budget={memory_budget!r} is a share of the device\'s memory, and the '
          f'memory of {costs.device_kind!r} ({costs.platform}) is not known; pass '
          'bytes, or compile for a GPU or TPU (target_mesh).')
    return int(device_share(memory_budget) * costs.device_memory_bytes)
  ends = [label for label in ('nothing_saveable', 'everything_saveable')
          if builtins[label][0].failed]
  if ends:
    costs = builtins[ends[0]][0]
    what = ('refused it for the device\'s memory; pass bytes (an int) or a share of '
            'the device\'s memory ("90%") instead' if costs.refused_for_memory
            else 'failed on it')
    raise NothingCompiled(
        f'memory_budget={memory_budget} is a fraction of the way from nothing_saveable\'s '
        f'compiled peak to everything_saveable\'s, and XLA {what}. On {ends[0]}: '
        f'{costs.error_line}')
  low = builtins['nothing_saveable'][0].peak_bytes
  high = builtins['everything_saveable'][0].peak_bytes
  return int(low + memory_budget * (high - low))


class NothingCompiled(RuntimeError):
  """``search_policy`` has no answer: XLA compiled none of its candidates
  (or not the built-ins a fractional budget is measured between), for a
  reason other than memory. The message is XLA's first line."""
