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

(a loop's condition compares a counter: left out). A loop whose trip count
XLA did not infer is counted once, as ``cost_analysis`` counts it, and said
so. A conditional runs one branch, and which one the program decides as it
runs: XLA counts its costliest branch, so where branches differ the count
is a range, from every conditional at its cheapest branch (``low``) to every
one at its costliest (``flops``, XLA's convention).

The conditionals and loops that guard a recompute (``lowering="cond"`` and
``"while"``) are opaque to XLA by design, yet always run the recompute
once; the engine's scope in their ``op_name`` tells them apart, and they are
counted as exactly that. Where the engine knows how often each branch of a
conditional runs (the binomial loop's backward pass reverses a step on
``n - 1`` of its turns), it says so in the conditional's scope, and each
branch is counted by its share of the runs. Nothing is estimated:
each term is XLA's own count of a computation of the optimized module,
with one addition: a GPU's matmuls and convolutions that XLA hands to
cuBLAS and cuDNN are custom calls, which XLA's cost analysis counts as
nothing. A cuBLAS call is counted as XLA counts the ``dot`` it replaces
(2 x output elements x contracted size, and the output once more where the
call also adds its ``beta`` operand); a cuDNN call as XLA's cost analysis
counts the forward ``convolution`` it carries the window and dimension
labels of. A backward pass's call computes the input's or the kernel's
gradient of that convolution, the same multiply-adds: its operands and
result are that convolution's, in another order, put back in order here.
(XLA:GPU's own cost model reads them in the call's order, which counts a
kernel's gradient as a convolution producing the kernel: a small fraction
of its work.)
"""

from __future__ import annotations

import dataclasses
import math
import re

from remat_explorer import engine
from remat_explorer.analysis.xla.hlo import HloModule, Instruction, Leaf


@dataclasses.dataclass(frozen=True)
class ExecutedFlops:
  flops: float
  """FLOPs the program executes on one device, loop trip counts applied,
  each conditional at its costliest branch (as XLA counts one)."""
  low: float
  """The same with each conditional at its cheapest branch: the program
  executes between ``low`` and ``flops``."""
  loops: int
  """``while`` loops in the program (each counted by its trips)."""
  unknown_trip_counts: int
  """Loops whose trip count XLA did not infer: counted once."""


def executed_flops(module: HloModule, device,
                   module_flops: float | None = None) -> ExecutedFlops | None:
  """The FLOPs the optimized `module` (``hlo.parse_hlo``) executes on
  `device`, or None where this jaxlib cannot run XLA's cost analysis on a
  module's text. `module_flops`: XLA's count of the whole module where the
  caller has it (``cost_analysis()['flops']`` of the same executable): for
  a module without loops or conditionals, that is the answer, and nothing
  is counted again from the text."""
  counter = _Counter(module, device)
  if module_flops is not None and not counter.loops_or_branches(module.entry):
    return ExecutedFlops(float(round(module_flops)), float(round(module_flops)), 0, 0)
  if module_flops is not None and device.platform == 'cpu':
    # The CPU's count of its own module is the entry's count: the whole
    # module's text need not be parsed and counted again. (A TPU's count
    # is XLA:TPU's, its computations' the CPU's: the two are not mixed.)
    counter.counted[module.entry] = float(module_flops)
  if counter.xla(module.entry) is None:
    return None
  high, low = counter.executed(module.entry)
  # Branch shares are fractions; their total over a loop's trips is whole.
  return ExecutedFlops(float(round(high)), float(round(low)), counter.loops, counter.unknown)


class _Counter:
  def __init__(self, module: HloModule, device):
    self.module, self.device = module, device
    self.counted: dict[str, float | None] = {}
    self.library: dict[str, float] = {}
    self.convolutions: dict[str, float] = {}  # a convolution's HLO -> its FLOPs
    self.runs: dict[str, tuple[float, float]] = {}
    self.branching: dict[str, bool] = {}
    self.loops = self.unknown = 0
    # Only a GPU's modules call cuBLAS or cuDNN; most modules are read
    # without visiting their computations for such calls.
    self.calls_libraries = ('__cublas' in module.text or '__cudnn' in module.text
                            or not module.text)

  def xla(self, name: str) -> float | None:
    """XLA's cost analysis of computation `name` as a module's entry."""
    if name not in self.counted:
      counted = engine.hlo_text_flops(self.module.as_entry(name), self.device)
      self.counted[name] = (None if counted is None
                            else counted + self.library_calls(name))
    return self.counted[name]

  def library_calls(self, name: str) -> float:
    """FLOPs of the cuBLAS and cuDNN calls computation `name` runs, visited
    as XLA's cost analysis visits computations: fusions, calls, a loop's
    body and condition once each, a conditional's costliest branch."""
    if not self.calls_libraries:
      return 0.0
    if name not in self.library:
      self.library[name] = 0.0  # a module's calls form no cycle
      instructions = self.module.computations.get(name, [])
      by_name = {i.name: i for i in instructions}
      total = 0.0
      for instruction in instructions:
        total += _cublas_gemm_flops(instruction, by_name)
        total += self.cudnn_convolution(instruction, by_name)
        if instruction.opcode == 'conditional':
          total += max((self.library_calls(b) for b in instruction.branches()), default=0.0)
        else:
          total += sum(self.library_calls(c) for c in instruction.all_called())
      self.library[name] = total
    return self.library[name]

  def cudnn_convolution(self, instruction: Instruction, by_name) -> float:
    """XLA's count of the forward convolution a cuDNN call stands for; 0
    for any other instruction."""
    text = _cudnn_convolution_hlo(instruction, by_name)
    if text is None:
      return 0.0
    if text not in self.convolutions:
      self.convolutions[text] = engine.hlo_text_flops(text, self.device) or 0.0
    return self.convolutions[text]

  def loops_or_branches(self, name: str) -> bool:
    """Whether computation `name` runs a loop or a conditional, itself or
    through what it calls: else XLA's count of it is what it executes."""
    if name not in self.branching:
      self.branching[name] = False  # a module's calls form no cycle
      self.branching[name] = any(
          i.opcode in ('while', 'conditional')
          or any(self.loops_or_branches(c) for c in i.called())
          for i in self.module.computations.get(name, []))
    return self.branching[name]

  def executed(self, name: str) -> tuple[float, float]:
    """(costliest, cheapest) FLOPs one run of computation `name` executes."""
    if name not in self.runs:
      once = self.xla(name) or 0.0
      if not self.loops_or_branches(name):  # nothing to add to XLA's count
        self.runs[name] = once, once
        return self.runs[name]
      high = low = once
      for instruction in self.module.computations.get(name, []):
        guard = _guards_recompute(instruction)
        if instruction.opcode == 'while':
          body = instruction.attr('body')
          trips = instruction.trip_count
          if not guard:
            self.loops += 1
            self.unknown += trips is None
          runs = 1 if trips is None else trips
          counted = self.xla(body) or 0.0  # in `once` already
          body_high, body_low = self.executed(body)
          high += runs * body_high - counted
          low += runs * body_low - counted
        elif instruction.opcode == 'conditional':
          branches = instruction.branches()
          counted = max((self.xla(b) or 0.0) for b in branches)  # XLA's choice
          each = [self.executed(b) for b in branches]
          shares = _branch_shares(instruction, len(branches))
          if shares is not None:
            high += sum(w * h for w, (h, _) in zip(shares, each)) - counted
            low += sum(w * l for w, (_, l) in zip(shares, each)) - counted
          else:
            costliest = max(each)
            # A guard always takes its recompute branch, the costliest (the
            # other only fills placeholders).
            cheapest = costliest if guard else min(each, key=lambda e: e[1])
            high += costliest[0] - counted
            low += cheapest[1] - counted
        else:
          for callee in filter(self.loops_or_branches, instruction.called()):
            callee_high, callee_low = self.executed(callee)
            counted = self.xla(callee) or 0.0
            high += callee_high - counted
            low += callee_low - counted
      self.runs[name] = high, low
    return self.runs[name]


_CUDNN_CONVOLUTION = re.compile(r'custom_call_target="__cudnn\$(conv\w*)"')
_CONVOLUTION_ATTRS = re.compile(
    r'\b(window=\{[^}]*\}|dim_labels=[\w>-]+|feature_group_count=\d+|batch_group_count=\d+)')


def _cudnn_convolution_hlo(instruction: Instruction, by_name: dict[str, Instruction]) -> str | None:
  """A module of the one forward ``convolution`` a cuDNN call stands for,
  or None for any other instruction. Its operands and result: the call's
  (forward), the call's result as the image (the input's gradient), or as
  the kernel (the kernel's gradient)."""
  target = (_CUDNN_CONVOLUTION.search(instruction.attrs)
            if instruction.opcode == 'custom-call' else None)
  if target is None:
    return None
  operands = [by_name.get(o) for o in instruction.operands[:2]]
  if any(o is None for o in operands):
    raise ValueError(f'cannot read the shapes of the cuDNN call {instruction.name}')
  first, second = (_array_type(o.shape) for o in operands)
  result = _array_type(instruction.shape)
  image, kernel, output = {'convBackwardInput': (result, second, first),
                           'convBackwardFilter': (first, result, second)}.get(
                               target.group(1), (first, second, result))
  attrs = ', '.join(_CONVOLUTION_ATTRS.findall(instruction.attrs))
  return ('HloModule convolution\n\nENTRY main {\n'
          f'  image = {image} parameter(0)\n  kernel = {kernel} parameter(1)\n'
          f'  ROOT output = {output} convolution(image, kernel), {attrs}\n}}\n')


def _array_type(shape) -> str:
  """``f32[4,16,16,8]``: the dtype and dimensions of an array result, or of
  a tuple's first array (a library call returns its result and a workspace)."""
  while isinstance(shape, list):
    shape = shape[0]
  assert isinstance(shape, Leaf)
  return shape.type[:shape.type.index(']') + 1]


_CUBLAS_GEMM = re.compile(r'custom_call_target="__cublas\$(?:lt\$matmul|gemm)')
_LHS_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_BETA = re.compile(r'"beta":([-\d.eE+]+)')


def _cublas_gemm_flops(instruction: Instruction, by_name: dict[str, Instruction]) -> float:
  """What XLA's cost analysis would count for the ``dot`` a cuBLAS call
  stands for; 0 for any other instruction."""
  if instruction.opcode != 'custom-call' or not _CUBLAS_GEMM.search(instruction.attrs):
    return 0.0
  contracting = _LHS_CONTRACTING.search(instruction.attrs)
  lhs = by_name.get(instruction.operands[0]) if instruction.operands else None
  if contracting is None or lhs is None:
    raise ValueError(f'cannot read the shapes of the cuBLAS call {instruction.name}')
  lhs_dims = _dims(lhs.shape)
  contracted = math.prod(lhs_dims[int(d.strip('" '))] for d in contracting.group(1).split(',')
                         if d.strip())
  out = math.prod(_dims(instruction.shape))
  beta = _BETA.search(instruction.attrs)
  adds_beta = beta is not None and float(beta.group(1)) != 0
  return 2.0 * out * contracted + (out if adds_beta else 0)


def _dims(shape) -> list[int]:
  """The dimensions of an array result, or of a tuple's first array."""
  array = _array_type(shape)
  dims = array[array.index('[') + 1:-1]
  return [int(re.search(r'\d+', d).group()) for d in dims.split(',') if d]  # '<=8': its bound


def _scope(instruction) -> str:
  """The scope `instruction` stands directly in."""
  path = instruction.op_name.split('/')
  return path[-2] if len(path) >= 2 else ''


def _guards_recompute(instruction) -> bool:
  """Whether `instruction` is the conditional or loop the engine lowers a
  recompute into."""
  return _scope(instruction) == engine.RECOMPUTE_GUARD_SCOPE


def _branch_shares(instruction, num_branches: int) -> list[float] | None:
  """Each branch's share of a conditional's runs, where the engine said."""
  runs = engine.branch_runs(_scope(instruction))
  if runs is None or len(runs) != num_branches or sum(runs) == 0:
    return None
  return [k / sum(runs) for k in runs]
