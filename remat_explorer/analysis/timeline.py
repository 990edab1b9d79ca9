"""Live bytes at each step of a compiled XLA program, with residuals marked.

Read from the scheduled HLO of ``compiled.as_text()`` (entry instruction order
is run order). JAX 0.10.2's ``serialized_buffer_assignment_proto`` has no heap
trace without XLA dump flags, so it cannot say when buffers are live.

Modelled: one buffer per shape leaf of each instruction, live from its step to
its last use; ``get-tuple-element``, ``tuple``, ``bitcast``, ``opt-barrier``,
``add-dependency``, ``domain``, ``*-done`` only alias. Fusions count their
output only; constants (in the executable) are left out; parameters live
throughout. A ``while`` updates its state in place (passed-through elements
stay the operand's buffer) and adds, at its step, the peak of its body's and
condition's own temporaries as ``<name>/temps`` (so do ``call`` and
``conditional``). In-place reuse as in XLA: an output takes over a same-shaped
operand that dies there, for ``dynamic-update-slice``/``scatter`` (operand 0)
and fusions rooted in one, elementwise ops, and loop fusions using the operand
only elementwise. Live-out buffers are allocated before the run, so count from
step 0 (``<name>/reserved`` until written), and hold temporaries that fit and
die before that write, one at a time, largest first, as XLA parks them.
Donated parameters (``input_output_alias``) hand their storage to the output.
Non-device memory spaces (``S(n)``, n > 0: host offload) are not counted. On
CPU, for the MLPs, scans, loops and conds tried, the peak matched
``argument_size_in_bytes + output_size_in_bytes + temp_size_in_bytes -
alias_size_in_bytes`` to within tuple index tables (tens of bytes).

Residuals: JAX's name stack reaches HLO as ``metadata={op_name=...}``; under
``jax.jit(jax.grad(f))`` forward ops read ``jit(f)/jvp()/...`` (``jvp(jvp())``
in ``jax.checkpoint``) and backward ops ``jit(f)/transpose(jvp())/...``. A
residual is a buffer defined by a forward instruction (op_name without
``transpose(``; not a parameter) and read by a backward one; state a forward
``while`` writes counts as its own. Not seen: values XLA's CSE merged into
their recomputation (which keeps the backward name), or moved by copies
without metadata.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from typing import Any, Iterable, NamedTuple, Sequence, Union

import jax


@dataclasses.dataclass(frozen=True)
class Buffer:
  """One buffer, live from step ``start`` to step ``end`` inclusive."""
  name: str  # the defining instruction, with ``{i}`` for a tuple leaf
  bytes: int
  start: int
  end: int
  op_name: str
  is_residual: bool
  is_parameter: bool
  is_output: bool
  memory_space: int = 0  # 0 is device memory, the only one counted
  source: str = ''
  """``file:line`` of the user code that defined it, from HLO metadata."""


@dataclasses.dataclass(frozen=True)
class MemoryTimeline:
  """Device bytes live at each step of a program's schedule."""
  steps: tuple[str, ...]
  live_bytes: tuple[int, ...]
  buffers: tuple[Buffer, ...]
  peak_bytes: int
  peak_step: int

  def live_at(self, step: int | str) -> list[Buffer]:
    """Buffers live at `step`, an index or an instruction name."""
    i = self.steps.index(step) if isinstance(step, str) else step
    return [b for b in self.buffers if b.start <= i <= b.end]

  def residual_bytes_at(self, step: int | str) -> int:
    """Device bytes held by residual buffers at `step`."""
    return sum(b.bytes for b in self.live_at(step)
               if b.is_residual and b.memory_space == 0)

  def to_dict(self) -> dict[str, Any]:
    """The timeline as plain, JSON-serializable data."""
    return {'steps': list(self.steps), 'live_bytes': list(self.live_bytes),
            'buffers': [dataclasses.asdict(b) for b in self.buffers],
            'peak_bytes': self.peak_bytes, 'peak_step': self.peak_step}


def memory_timeline(compiled: jax.stages.Compiled) -> MemoryTimeline:
  """The timeline of ``jax.jit(f).lower(*args).compile()``."""
  return memory_timeline_from_hlo_text(compiled.as_text())


def memory_timeline_from_hlo_text(text: str, module=None) -> MemoryTimeline:
  """The timeline of the ENTRY computation of a scheduled HLO module;
  `module` is ``parse_hlo_module(text)`` where the caller has it already."""
  comps, entry = module or parse_hlo_module(text)
  graph = _Graph(comps, comps[entry], {}, _donations(text))
  buffers = tuple(graph.buffers())
  device = [(b.start, b.end, b.bytes) for b in buffers if not b.memory_space]
  live = _live_bytes(len(graph.instrs), device)
  peak = max(range(len(live)), key=live.__getitem__, default=0)
  return MemoryTimeline(tuple(i.name for i in graph.instrs), tuple(live),
                        buffers, live[peak] if live else 0, peak)


def _live_bytes(steps: int,
                ranges: Iterable[tuple[int, int, int]]) -> list[int]:
  delta = [0] * (steps + 1)
  for start, end, nbytes in ranges:
    delta[start] += nbytes
    delta[end + 1] -= nbytes
  return list(itertools.accumulate(delta[:steps]))


# --- HLO text -----------------------------------------------------------------

class _Leaf(NamedTuple):
  bytes: int
  memory_space: int
  type: str  # dtype, dims and memory space: equal types may share storage


Shape = Union[_Leaf, list]  # a list is a tuple shape


@dataclasses.dataclass
class _Instr:
  name: str
  shape: Shape
  opcode: str
  args: str  # the text between the opcode's parentheses
  attrs: str
  is_root: bool

  def __post_init__(self):
    self.operands = re.findall(r'%([\w.\-]+)', self.args)

  # Read from the metadata on demand: most instructions are never asked.
  @functools.cached_property
  def op_name(self) -> str:
    m = re.search(r'\bop_name="((?:[^"\\]|\\.)*)"', self.attrs)
    return m.group(1) if m else ''

  @functools.cached_property
  def source(self) -> str:
    file = re.search(r'\bsource_file="((?:[^"\\]|\\.)*)"', self.attrs)
    line = re.search(r'\bsource_line=(\d+)', self.attrs)
    return f'{file.group(1)}:{line.group(1)}' if file and line else ''

  def attr(self, key: str) -> str | None:
    m = re.search(rf'\b{key}=%?([\w.\-]+)', self.attrs)
    return m.group(1) if m else None

  def called(self) -> list[str]:
    """Computations run as part of this instruction: not fusions' and not
    the scalar ones of reduce, sort, scatter, ..., which are loop bodies."""
    keys = {'while': 'body|condition', 'call': 'to_apply',
            'conditional': 'true_computation|false_computation'}
    if self.opcode not in keys:
      return []
    names = re.findall(rf'\b(?:{keys[self.opcode]})=%?([\w.\-]+)', self.attrs)
    if m := re.search(r'branch_computations=\{([^}]*)\}', self.attrs):
      names += re.findall(r'%?([\w.\-]+)', m.group(1))
    return names


_HEADER = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*->.*\{\s*$')
_INSTR = re.compile(r'^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*')
_OPCODE = re.compile(r'\s*([\w\-]+)\(')
_ARRAY = re.compile(r'(\w+)\[([^\]]*)\](\{[^}]*\})?')
_SEPARATORS = re.compile(r'(\s|,|/\*.*?\*/)*')


def parse_hlo_module(text: str) -> tuple[dict[str, list[_Instr]], str]:
  """The computations of an HLO module's text, by name, and the entry's name."""
  comps: dict[str, list[_Instr]] = {}
  entry, current = '', None
  for line in text.splitlines():
    if current is None:
      if m := _HEADER.match(line):
        current = comps.setdefault(m.group(2), [])
        entry = m.group(2) if m.group(1) else entry
    elif line.strip() == '}':
      current = None
    elif m := _INSTR.match(line):
      current.append(_parse_instr(line, m))
  if not entry:
    raise ValueError('no ENTRY computation in the HLO text')
  return comps, entry


_Donation = tuple[list[int], int, list[int]]


def _donations(text: str) -> list[_Donation]:
  """(output index, parameter number, parameter index) of each alias."""
  m = re.search(r'input_output_alias=\{(.*?\))\s*\}', text.split('\n', 1)[0])
  found = re.findall(r'\{([\d,\s]*)\}:\s*\((\d+),\s*\{([\d,\s]*)\}',
                     m.group(1) if m else '')
  path = lambda s: [int(k) for k in re.findall(r'\d+', s)]
  return [(path(out), int(num), path(index)) for out, num, index in found]


def _parse_instr(line: str, m: re.Match) -> _Instr:
  shape, i = _parse_shape(line, m.end())
  if not (op := _OPCODE.match(line, i)):
    raise ValueError(f'cannot parse HLO instruction: {line.strip()}')
  j = _after_closing_paren(line, op.end())
  return _Instr(m.group(2), shape, op.group(1), line[op.end():j - 1],
                line[j:], bool(m.group(1)))


_PARENS = re.compile(r'[()]')


def _after_closing_paren(line: str, start: int) -> int:
  """The position after the ``)`` closing a ``(`` just before `start`."""
  depth = 1
  for m in _PARENS.finditer(line, start):
    depth += 1 if m.group() == '(' else -1
    if not depth:
      return m.end()
  raise ValueError(f'unbalanced parentheses in HLO instruction: {line.strip()}')


def _parse_shape(text: str, i: int) -> tuple[Shape, int]:
  if text[i] == '(':
    elems: list[Shape] = []
    i += 1
    while text[i := _SEPARATORS.match(text, i).end()] != ')':
      elem, i = _parse_shape(text, i)
      elems.append(elem)
    return elems, i + 1
  if not (m := _ARRAY.match(text, i)):
    raise ValueError(f'cannot parse HLO shape at: {text[i:i + 40]!r}')
  dtype, dims, layout = m.groups()
  space = re.search(r'S\((\d+)\)', layout or '')
  space = int(space.group(1)) if space else 0
  n = 1
  for d in re.findall(r'\d+', dims):  # a dynamic '<=8' counts as its bound
    n *= int(d)
  leaf = _Leaf(n * _dtype_bits(dtype) // 8, space, f'{dtype}[{dims}]S{space}')
  return leaf, m.end()


@functools.lru_cache(maxsize=None)
def _dtype_bits(dtype: str) -> int:
  if dtype == 'pred':
    return 8
  m = re.search(r'\d+', dtype)  # f32, bf16, s4, c64, f8e4m3fn, ...
  return int(m.group()) if m else 0  # token[] holds no data


def _leaves(value: Any) -> list:
  if isinstance(value, list):
    return [x for v in value for x in _leaves(v)]
  return [value]


def _at(value: Any, path: list[int]) -> Any:
  for k in path:
    value = value[k] if isinstance(value, list) and k < len(value) else None
  return value


def _root(instrs: list[_Instr]) -> _Instr | None:
  return next((x for x in instrs if x.is_root), instrs[-1] if instrs else None)


def _index(ins: _Instr) -> int:
  return int(re.search(r'\bindex=(\d+)', ins.attrs).group(1))


def _passes_through(body: list[_Instr], k: int) -> bool:
  """Whether a while body returns element `k` of its state unchanged."""
  root, by_name = _root(body), {x.name: x for x in body}
  if root is None or root.opcode != 'tuple' or k >= len(root.operands):
    return False
  src = by_name.get(root.operands[k])
  if src is None or src.opcode != 'get-tuple-element' or _index(src) != k:
    return False
  return getattr(by_name.get(src.operands[0]), 'opcode', '') == 'parameter'


# --- Liveness -----------------------------------------------------------------

_ALIASES = {'bitcast', 'opt-barrier', 'add-dependency', 'domain'}
_IN_PLACE = {'dynamic-update-slice', 'scatter'}
_ELEMENTWISE = set("""abs add and atan2 cbrt ceil clamp compare complex convert
  cosine divide erf exponential exponential-minus-one floor imag is-finite log
  log-plus-one logistic maximum minimum multiply negate not or popcnt power real
  reduce-precision remainder round-nearest-afz round-nearest-even rsqrt select
  shift-left shift-right-arithmetic shift-right-logical sign sine sqrt subtract
  tan tanh xor""".split())


@dataclasses.dataclass
class _Buf:
  name: str
  leaf: _Leaf
  start: int
  op_name: str
  is_parameter: bool = False
  uses: list[int] = dataclasses.field(default_factory=list)
  reusable: list[int] = dataclasses.field(default_factory=list)  # operands
  end: int = -1


class _Graph:
  """The buffers of one computation and their live ranges."""

  def __init__(self, comps: dict[str, list[_Instr]], instrs: list[_Instr],
               peaks: dict[str, int], donations: Sequence[_Donation] = ()):
    self.comps, self.instrs, self.peaks = comps, instrs, peaks
    self.bufs: list[_Buf] = []
    self.extra: dict[int, int] = {}  # step -> peak of the computations it runs
    values: dict[str, Any] = {}
    for i, ins in enumerate(instrs):
      ops = [values.get(o) for o in ins.operands]
      values[ins.name] = self._define(i, ins, ops)
    root = _root(instrs)
    leaves = _leaves(values[root.name]) if root else []
    self.outputs = {b for b in leaves if b is not None}
    self.took_over: dict[int, int] = {}  # buffer -> the one it took storage of
    self._assign_ends()
    params = {int(x.args): values[x.name] for x in instrs
              if x.opcode == 'parameter'}
    for out, num, index in donations:
      self._donate(_at(values[root.name], out), _at(params.get(num), index))

  def _fresh(self, i: int, ins: _Instr, shape: Shape, path: str = '',
             **kw) -> Any:
    if isinstance(shape, list):
      return [self._fresh(i, ins, s, f'{path}{k},', **kw)
              for k, s in enumerate(shape)]
    name = f'{ins.name}{{{path[:-1]}}}' if path else ins.name
    self.bufs.append(_Buf(name, shape, i, ins.op_name, **kw))
    return len(self.bufs) - 1

  def _define(self, i: int, ins: _Instr, ops: list) -> Any:
    code = ins.opcode
    if code == 'parameter':
      return self._fresh(0, ins, ins.shape, is_parameter=True)
    if code == 'constant':
      return [None] * len(ins.shape) if isinstance(ins.shape, list) else None
    if code == 'get-tuple-element':
      return ops[0][_index(ins)]
    if code == 'tuple':
      return ops
    if code in _ALIASES:
      return ops[0]
    for b in _leaves(ops):
      if b is not None:
        self.bufs[b].uses.append(i)
    if code.endswith('-done'):  # the result slot of the matching *-start
      first = ops[0]
      return first[code != 'copy-done'] if isinstance(first, list) else first
    if peak := max((self._peak(c) for c in ins.called() if c in self.comps),
                   default=0):
      self.extra[i] = peak
    if code == 'while':
      return self._while(i, ins, ops[0])
    if code.endswith('-start') and isinstance(ins.shape, list) and ops:
      # copy-start: (destination, source, context); others: (operands, result..)
      src = int(code == 'copy-start')
      return [(ops[0] if len(ops) == 1 else ops) if k == src
              else self._fresh(i, ins, s, f'{k},')
              for k, s in enumerate(ins.shape)]
    value = self._fresh(i, ins, ins.shape)
    for k, b in enumerate(_leaves(value)):
      self.bufs[b].reusable = self._reusable(ins, k, ops)
    return value

  def _while(self, i: int, ins: _Instr, state: Any) -> Any:
    body = self.comps.get(ins.attr('body') or '', [])
    is_tuple = isinstance(ins.shape, list)
    value = []
    for k, elem in enumerate(state if is_tuple else [state]):
      if is_tuple and _passes_through(body, k):
        value.append(elem)  # the same buffer, never written by the loop
        continue
      new = self._fresh(i, ins, ins.shape[k] if is_tuple else ins.shape,
                        f'{k},' if is_tuple else '')
      for n, old in zip(_leaves(new), _leaves(elem)):
        self.bufs[n].reusable = [] if old is None else [old]
      value.append(new)
    return value if is_tuple else value[0]

  def _reusable(self, ins: _Instr, k: int, ops: list) -> list[int]:
    """Operand buffers whose storage output leaf `k` may take over."""
    if ins.opcode in _IN_PLACE:
      nums = [0]
    elif ins.opcode in _ELEMENTWISE:
      nums = list(range(len(ops)))
    else:
      nums = self._fusion_reusable(ins, k) if ins.opcode == 'fusion' else []
    out = _leaves(ins.shape)[k]
    return [op for n in nums if n < len(ops) and isinstance(op := ops[n], int)
            and self.bufs[op].leaf.type == out.type]

  def _fusion_reusable(self, ins: _Instr, k: int) -> list[int]:
    body = self.comps.get(ins.attr('calls') or '', [])
    by_name = {x.name: x for x in body}
    numbers = {x.name: int(x.args) for x in body if x.opcode == 'parameter'}
    root = _root(body)
    if root is not None and root.opcode == 'tuple':
      root = by_name.get(root.operands[k])
    if root is not None and root.opcode in _IN_PLACE:
      src = by_name.get(root.operands[0])
      while src is not None and src.opcode == 'bitcast':
        src = by_name.get(src.operands[0])
      return [numbers[src.name]] if src and src.name in numbers else []
    if 'kind=kLoop' not in ins.attrs:
      return []
    users: dict[str, set[str]] = {}
    for x in body:
      for o in x.operands:
        users.setdefault(o, set()).add(x.opcode)
    return [n for p, n in numbers.items()
            if users.get(p, {''}) <= _ELEMENTWISE]

  def _assign_ends(self) -> None:
    last = len(self.instrs) - 1
    for n, b in enumerate(self.bufs):
      held = b.is_parameter or n in self.outputs
      b.end = last if held else max(b.uses, default=b.start)
    taken: set[int] = set()
    for n, b in enumerate(self.bufs):
      for o in b.reusable:
        old = self.bufs[o]
        if (o not in taken and o not in self.outputs and not old.is_parameter
            and old.end == b.start > old.start):
          old.end = b.start - 1  # from here on `b` owns the storage
          self.took_over[n] = o
          taken.add(o)
          break

  def _donate(self, out: Any, param: Any) -> None:
    """Lets output `out` (and the buffers it took over) use `param`'s storage
    once the parameter is last read."""
    if not isinstance(out, int) or not isinstance(param, int) or out == param:
      return
    while out in self.took_over:
      out = self.took_over[out]
    p, first = self.bufs[param], self.bufs[out].start
    if max(p.uses, default=0) <= first and not self.bufs[out].is_parameter:
      p.end = first - 1
      self.took_over[out] = param

  def _peak(self, comp: str) -> int:
    """Peak bytes of `comp`'s own temporaries (not its parameters or root)."""
    if comp not in self.peaks:
      g = _Graph(self.comps, self.comps[comp], self.peaks)
      temps = [(b.start, b.end, b.leaf.bytes) for n, b in enumerate(g.bufs)
               if not (b.is_parameter or n in g.outputs or b.leaf.memory_space)]
      temps += [(i, i, extra) for i, extra in g.extra.items()]
      self.peaks[comp] = max(_live_bytes(len(g.instrs), temps), default=0)
    return self.peaks[comp]

  def _reserved(self) -> list[Buffer]:
    """Output storage not yet written nor lent to a temporary, by step."""
    stores, chained = [], set(self.outputs)
    for o in sorted(self.outputs):
      if self.bufs[o].is_parameter or self.bufs[o].leaf.memory_space:
        continue
      first = o
      while first in self.took_over:
        first = self.took_over[first]
        chained.add(first)
      if self.bufs[first].is_parameter:  # a donated parameter's storage
        continue
      stores.append((self.bufs[first].start, self.bufs[o].leaf.bytes,
                     self.bufs[o].name, []))
    stores.sort(key=lambda s: s[1])
    temps = [b for n, b in enumerate(self.bufs) if n not in chained
             and not b.is_parameter and not b.leaf.memory_space]
    for t in sorted(temps, key=lambda b: (-b.leaf.bytes, b.start)):
      for first, size, _, parked in stores:
        if (t.leaf.bytes <= size and t.end < first
            and all(t.end < s or t.start > e for s, e, _ in parked)):
          parked.append((t.start, t.end, t.leaf.bytes))
          break
    out = []
    for first, size, name, parked in stores:
      pieces, pos = [], 0
      for s, e, nbytes in sorted(parked):
        pieces += [(pos, s - 1, size), (s, e, size - nbytes)]
        pos = e + 1
      out += [Buffer(f'{name}/reserved', nbytes, s, e, '', False, False, True)
              for s, e, nbytes in pieces + [(pos, first - 1, size)]
              if nbytes and s <= e]
    return out

  def buffers(self) -> list[Buffer]:
    out = []
    for n, b in enumerate(self.bufs):
      forward = b.op_name and 'transpose(' not in b.op_name
      read_back = any('transpose(' in self.instrs[u].op_name for u in b.uses)
      out.append(Buffer(b.name, b.leaf.bytes, b.start, b.end, b.op_name,
                        bool(forward and read_back and not b.is_parameter),
                        b.is_parameter, n in self.outputs, b.leaf.memory_space,
                        self.instrs[b.start].source if b.start >= 0 else ''))
    for i, extra in sorted(self.extra.items()):
      ins = self.instrs[i]
      out.append(Buffer(f'{ins.name}/temps', extra, i, i, ins.op_name,
                        False, False, False))
    return out + self._reserved()
