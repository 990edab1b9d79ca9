"""The FLOPs a compiled program executes, each loop's body once per trip.

XLA's ``cost_analysis()`` visits every computation of a module once, so a
``while`` loop's body counts once however many times it runs: a 1,000-step
``scan`` costs one step. The program's own text says how often each body
runs (``known_trip_count`` in the loop's backend config), and XLA can still
count each body by its own rules: made the entry of a module of its own,
the body is what ``cost_analysis`` measures. So, for a computation ``C``
that runs loops ``w`` (directly, or through calls and conditionals),

    executed(C) = xla(C) + sum over w of (trips(w) * executed(body(w))
                                          - xla(body(w)))

and likewise for each loop's condition, which runs once more than its body
does not matter here (it compares a counter). A loop whose trip count XLA
did not infer is counted once, as ``cost_analysis`` counts it, and said so.
Nothing is estimated: each term is XLA's own count of a computation of the
optimized module.
"""

from __future__ import annotations

import dataclasses
import re

from remat_explorer import engine
from remat_explorer.analysis.hlo import HloModule, parse_hlo

_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_HEADER = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*->.*\{\s*$')


@dataclasses.dataclass(frozen=True)
class ExecutedFlops:
  flops: float
  """FLOPs the program executes on one device, loop trip counts applied."""
  loops: int
  """``while`` loops in the program (each counted by its trips)."""
  unknown_trip_counts: int
  """Loops whose trip count XLA did not infer: counted once."""


def executed_flops(hlo_text: str, device, module: HloModule | None = None
                   ) -> ExecutedFlops | None:
  """The FLOPs the optimized module `hlo_text` executes on `device`, or None
  where this jaxlib cannot run XLA's cost analysis on a module's text."""
  module = module or parse_hlo(hlo_text)
  counter = _Counter(hlo_text, module, device)
  total = counter.xla(module.entry)
  if total is None:
    return None
  return ExecutedFlops(total + counter.extra(module.entry), counter.loops,
                       counter.unknown)


class _Counter:
  def __init__(self, text: str, module: HloModule, device):
    self.module, self.device = module, device
    self.lines = text.splitlines()
    self.headers = {m.group(2): i for i, line in enumerate(self.lines)
                    if (m := _HEADER.match(line))}
    self.counted: dict[str, float | None] = {}
    self.extras: dict[str, float] = {}
    self.loops = self.unknown = 0

  def xla(self, name: str) -> float | None:
    """XLA's cost analysis of computation `name` as a module's entry."""
    if name not in self.counted:
      self.counted[name] = engine.hlo_text_flops(self._as_entry(name), self.device)
    return self.counted[name]

  def extra(self, name: str) -> float:
    """What XLA's count of `name` misses: its loops' trips after the first."""
    if name in self.extras:
      return self.extras[name]
    total = 0.0
    for instruction in self.module.computations.get(name, []):
      if instruction.opcode == 'while':
        body = instruction.attr('body')
        trips = _TRIP_COUNT.search(instruction.attrs)
        self.loops += 1
        if trips is None:
          self.unknown += 1
        once = self.xla(body) or 0.0
        runs = int(trips.group(1)) if trips else 1
        total += runs * (once + self.extra(body)) - once
      else:
        total += sum(self.extra(c) for c in instruction.called())
    self.extras[name] = total
    return total

  def _as_entry(self, name: str) -> str:
    """The module's text with `name` as its entry, keeping only what it
    calls (fewer computations for XLA to parse)."""
    keep = self._reachable(name)
    out = [self.lines[0].split(',')[0]]  # `HloModule name`, no entry layout
    current = None
    for i, line in enumerate(self.lines[1:], 1):
      if current is None:
        m = _HEADER.match(line)
        if m is None:
          # Tables before the first computation (file names, stack frames).
          if not self.headers or i < min(self.headers.values()):
            out.append(line)
          continue
        current = m.group(2)
        if current in keep:
          header = line[len(m.group(1)):] if m.group(1) else line
          out.append(('ENTRY ' + header) if current == name else header)
      else:
        if current in keep:
          out.append(line)
        if line.strip() == '}':
          current = None
    return '\n'.join(out) + '\n'

  def _reachable(self, name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
      c = todo.pop()
      if c in seen:
        continue
      seen.add(c)
      for instruction in self.module.computations.get(c, []):
        todo.extend(instruction.all_called())
    return seen
