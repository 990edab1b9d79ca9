"""What is alive at the peak, and why: every buffer live at a step of the
compiled schedule (the peak by default), in the user's terms.

The compiled program says itself where each buffer comes from
(``hlo_provenance``): the Python stack JAX recorded for the instruction
that computed its value (looking through the loop that stacks it), and,
for an argument, the name JAX gave it. So:

* a residual buffer is the residual whose producer's frames its stack ends
  with (the longest such match wins; residuals made by the same lines, such
  as the layers of a Python loop, are taken in the order the program makes
  them). Sizes are never compared: two residuals of one size from two lines
  are told apart by their lines.
* a parameter is the argument at its pytree path (``params['blocks']['w1']``),
  an output the gradient of one (or the function's own output).
* a loop's temporaries (``while.4/temps``) are listed as what they hold at
  the body's peak, each with its line and module path.
* ``explain_peak`` adds the gap between the listed buffers and the compiled
  peak, named: the bytes XLA's placement leaves unused between buffers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from remat_explorer.analysis.cache import ResultCache
from remat_explorer.analysis.xla.costs import CompiledCosts
from remat_explorer.analysis.source.origins import (clean_scope, is_library_file, site_of)
from remat_explorer.analysis.split.report import RematReport, Residual
from remat_explorer.analysis.xla.hlo import pass_of
from remat_explorer.analysis.xla.timeline import Buffer
from remat_explorer.analysis.units import format_bytes


@dataclass(frozen=True)
class PeakBuffer:
  """A buffer live at a step of the compiled schedule, with what it is."""
  buffer: str
  bytes: int
  kind: str
  """'residual', 'parameter', 'output', 'temporary' (a loop body's
  temporaries or output storage not yet written included)."""
  made_by: str
  """The pass whose instruction defined it: 'forward', 'backward',
  'recompute', or '' where the HLO does not say."""
  residual: Residual | None = None
  """For a residual buffer: the residual the analysis found, when matched."""
  matched_by: str = ''
  """How the residual was matched: 'provenance' (its producer's stack, as
  the compiled program records it), or 'unmatched'."""
  source: str = ''
  """The user's line: the residual's, else the innermost line of the
  user's code in the stack the compiled program records."""
  policy: str = ''
  label: str = ''
  """What it holds in the user's terms: an argument's pytree path
  (``params['blocks']['w1']``), ``gradient of`` one, ``loop state`` of
  a loop, ``scratch of`` a loop body; '' where nothing more is known."""
  scope: str = ''
  """The module path of the instruction that computed it (for buffers that
  are not residuals), the same string ``Residual.module_path`` and the
  diagram give that module: from the user's method calls in the stack XLA
  records, else JAX's name stack in the parameters' terms."""
  parts: tuple['PeakBuffer', ...] = ()
  """For a loop's temporaries (``/temps``): the buffers its body holds at
  the busiest step of its schedule, largest first. Their bytes make XLA's
  allocation for the loop's temporaries within a few percent: where XLA
  writes an output over an input it reads last, the two count apart here."""

  @property
  def name(self) -> str | None:
    return None if self.residual is None else self.residual.name

  @property
  def module_path(self) -> str:
    return self.scope if self.residual is None else self.residual.module_path

  @property
  def recompute_flops_to_drop(self) -> int | None:
    """At least this many FLOPs would be recomputed if it were not saved."""
    return None if self.residual is None else self.residual.producer_flops

  def _residual_held(self) -> str:
    """An unnamed residual in words: the argument it is, or the output of
    the primitive that computed it."""
    r = self.residual
    if r is None:
      return ''
    if r.argument:
      return r.argument
    return f'output of {r.primitive}' if r.primitive else r.kind

  def holds(self, parts: int = 3) -> str:
    """What it holds, in a line: the ``checkpoint_name`` or `label`, and
    for a loop's temporaries its `parts` largest parts, each with its
    module path or line."""
    text = self.name or self.label or self._residual_held()
    if self.parts:
      shown = ', '.join(
          f'{format_bytes(p.bytes)} {p.module_path or p.source or p.buffer}'
          for p in self.parts[:parts])
      more = len(self.parts) - parts
      text += f': {shown}' + (f', … {more} more' if more > 0 else '')
    return text


PeakResidual = PeakBuffer
"""A residual buffer live at the peak (``residuals_at_peak``)."""


@dataclass(frozen=True)
class PeakExplanation:
  """The compiled peak, buffer by buffer, and what the buffers leave out."""
  peak_bytes: int
  """The timeline's peak: XLA's own allocation at the busiest step."""
  step: int
  buffers: tuple[PeakBuffer, ...]
  """Every device buffer live at `step`, largest first."""
  listed_bytes: int
  gap_bytes: int
  """``peak_bytes - listed_bytes``: what XLA's buffer assignment occupies
  beyond the live buffers (space between buffers that its placement leaves
  free at that step: fragmentation and alignment padding). Negative where
  the buffers listed add up to more than XLA's heap at that step (TPUs and
  GPUs: the liveness model holds some buffers at other steps than XLA's
  heap simulation does); ``gap_reason`` says so."""
  gap_reason: str


def live_at_peak(report: RematReport, costs: CompiledCosts,
                 step: int | None = None) -> list[PeakBuffer]:
  """Every device buffer live at `step` (the timeline's peak by default),
  largest first, residuals linked to the report's.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> def loss(w, x):
    ...   layer = rx.checkpoint(lambda h: jnp.tanh(h @ w))
    ...   return jnp.sum(layer(layer(x)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> report, costs = rx.analyze(loss, w, x), rx.compile_costs(loss, w, x)
    >>> sorted(b.label for b in rx.live_at_peak(report, costs) if b.kind == 'parameter')
    ['w', 'x']
  """
  _check_order(report, costs)
  if costs.failed or costs.timeline is None:
    return []
  timeline = costs.timeline
  step = timeline.peak_step if step is None else step
  words = _words_of(report, costs)
  return [words.describe(b) for b in sorted(timeline.live_at(step), key=lambda b: -b.bytes)
          if not b.memory_space]


def residuals_at_peak(report: RematReport, costs: CompiledCosts) -> list[PeakBuffer]:
  """The residual buffers live at the timeline's peak, largest first.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples
    >>> loss_fn, args = examples.mlp(num_layers=2, width=16, batch=4)
    >>> policy = rx.checkpoint_policies.save_only_these_names('pre_activation')
    >>> report = rx.analyze(loss_fn, *args, policy=policy)
    >>> costs = rx.compile_costs(loss_fn, *args, policy=policy)
    >>> 'pre_activation' in {b.name for b in rx.residuals_at_peak(report, costs)}
    True
  """
  return [b for b in live_at_peak(report, costs) if b.kind == 'residual']


def explain_peak(report: RematReport, costs: CompiledCosts) -> PeakExplanation | None:
  """The buffers live at the compiled peak and the named gap between their
  sum and the peak; None without a timeline (a failed compile).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import remat_explorer as rx
    >>> from remat_explorer import analysis
    >>> f = rx.checkpoint(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
    >>> w, x = jax.random.normal(jax.random.key(0), (2, 16, 16))
    >>> costs = rx.compile_costs(f, w, x)
    >>> why = analysis.explain_peak(rx.analyze(f, w, x), costs)
    >>> why.peak_bytes == why.listed_bytes + why.gap_bytes == costs.timeline.peak_bytes
    True
  """
  buffers = live_at_peak(report, costs)
  if costs.failed or costs.timeline is None:
    return None
  timeline = costs.timeline
  listed = sum(b.bytes for b in buffers)
  gap = timeline.peak_bytes - listed
  if timeline.placed_bytes is None:
    reason = 'the peak is the live buffers\' (XLA\'s placement is not known)'
  elif gap < 0:
    reason = ('they add up to more than XLA\'s heap simulation holds at this step: '
              'the liveness model that lists them allocates or frees some buffers at '
              'other steps than XLA\'s heap simulation does, whose peak this is')
  elif timeline.peak_memory == 'on-chip':
    reason = ('XLA\'s peak for this TPU follows its on-chip memory (VMEM), whose heap is '
              'the higher here; the buffers listed are those in device memory (HBM)')
  elif costs.platform != 'cpu' and gap:
    reason = ('what XLA\'s heap simulation holds beyond the buffers listed (buffers the '
              'liveness model frees earlier, alignment)')
  elif gap:
    reason = ('space XLA\'s buffer assignment leaves free between the live buffers at '
              'the peak (fragmentation, alignment padding)')
  else:
    reason = 'none: the live buffers fill XLA\'s allocation at the peak'
  return PeakExplanation(timeline.peak_bytes, timeline.peak_step, tuple(buffers), listed,
                         gap, reason)


def _check_order(report, costs) -> None:
  if not isinstance(report, RematReport) or not isinstance(costs, CompiledCosts):
    raise TypeError(
        'expected (report, costs): a RematReport from analyze() and the '
        'CompiledCosts from compile_costs() of the same program and policy, '
        f'got ({type(report).__name__}, {type(costs).__name__}).')
  # Another policy's report has other residuals: buffers would be linked to
  # residuals their program does not save.
  said = lambda x: f'{x.function} under {x.policy or "its own policies"} ({x.lowering or "-"})'
  if ((report.function, report.policy, report.lowering)
      != (costs.function, costs.policy, costs.lowering)):
    raise ValueError(
        f'the report and the costs differ: the report is of {said(report)}, the costs of '
        f'{said(costs)}; pass analyze() and compile_costs() of the same function, '
        'policy and lowering.')


# -- the user's terms ---------------------------------------------------------------------

_ARGUMENT = re.compile(r'^\w+\[(\d+)\]$')
"""JAX's name for an argument of the compiled step (``leaves[4]``)."""


class _Words:
  """Buffers of one compiled program described in its user's terms, each
  described once: a timeline's bands ask for the buffers live at up to 150
  steps, most of them the same buffers."""

  def __init__(self, report: RematReport, costs: CompiledCosts):
    self.report, self.policy = report, report.policy
    self.timeline = costs.timeline
    self.residual_of = match_residuals([b for b in costs.timeline.buffers
                                        if b.is_residual and not b.memory_space],
                                       [r for r in report.residuals if r.kind == 'equation'])
    self.paths = report.module_paths
    self.outputs = max((b.output_index for b in self.timeline.buffers
                        if b.output_index is not None), default=-1) + 1
    self._described: dict[str, PeakBuffer] = {}

  def module_path(self, buffer: Buffer) -> str:
    """The module that computed `buffer`, named as the report names its
    residuals' modules (``Residual.module_path``)."""
    scope = scope_of(buffer.computed_by)
    return scope if self.paths is None else self.paths.of_stack(buffer.frames, scope)

  def describe(self, buffer: Buffer) -> PeakBuffer:
    described = self._described.get(buffer.name)
    if described is None:
      described = self._described[buffer.name] = self._describe(buffer)
    return described

  def _describe(self, buffer: Buffer) -> PeakBuffer:
    made_by = pass_of(buffer.op_name)
    common = dict(buffer=buffer.name, bytes=buffer.bytes, policy=self.policy,
                  scope=self.module_path(buffer))
    if buffer.is_residual:
      residual = self.residual_of.get(buffer.name)
      source = residual.source if residual is not None and residual.source else ''
      return PeakBuffer(kind='residual', made_by=made_by, residual=residual,
                        matched_by='unmatched' if residual is None else 'provenance',
                        source=source or user_line(buffer.frames), **common)
    if buffer.is_parameter:  # an argument of the step, made by no pass
      return PeakBuffer(kind='parameter', made_by='', label=self._argument(buffer.op_name),
                        **common)
    kind = 'output' if buffer.is_output else 'temporary'
    loop = buffer.name.split('{')[0].removesuffix('/temps')
    label = (self._output(buffer.output_index) if buffer.is_output else
             f"temporaries of {loop}'s body" if buffer.name.endswith('/temps') else
             f'loop state of {loop}' if buffer.opcode == 'while' else
             _asynchronous_or_collective(buffer))
    parts = tuple(self._part(p, buffer.name) for p in buffer.parts)
    return PeakBuffer(kind=kind, made_by=made_by, source=user_line(buffer.frames),
                      label=label, parts=parts, **common)

  def _part(self, buffer: Buffer, within: str) -> PeakBuffer:
    loop = within.removesuffix('/temps')
    label = (f'temporaries of a loop in {loop}' if buffer.name.endswith('/temps')
             else f'scratch of {loop}')
    return PeakBuffer(buffer=buffer.name, bytes=buffer.bytes, kind='temporary',
                      made_by=pass_of(buffer.op_name), source=user_line(buffer.frames),
                      policy=self.policy, label=label, scope=self.module_path(buffer),
                      parts=tuple(self._part(p, buffer.name) for p in buffer.parts))

  def _argument(self, op_name: str) -> str:
    m = _ARGUMENT.match(op_name)
    names = self.report.argument_names
    if m and int(m.group(1)) < len(names) and names[int(m.group(1))]:
      return names[int(m.group(1))]
    return op_name

  def _output(self, index: int | None) -> str:
    """The step returns its outputs, then one gradient per differentiated
    argument, in order."""
    gradients = self.report.gradient_names
    if index is None or not gradients:
      return ''
    k = index - (self.outputs - len(gradients))
    return f'gradient of {gradients[k]}' if 0 <= k < len(gradients) else 'output'


_COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all',
                'collective-permute', 'collective-broadcast', 'ragged-all-to-all')


def _asynchronous_or_collective(buffer: Buffer) -> str:
  """What a buffer of an asynchronous copy or a collective holds: XLA on
  TPUs and GPUs moves data between memories and devices in the background,
  each move's destination held from its start to its end."""
  op = buffer.opcode.removesuffix('-start').removesuffix('-done')
  reserved = buffer.name.endswith('/reserved')
  if op in _COLLECTIVES:
    return f"{'destination' if reserved else 'result'} of a collective ({op})"
  if op in ('copy', 'slice') and buffer.opcode.endswith(('-start', '-done')):
    return f'{"destination" if reserved else "result"} of an asynchronous {op} ({buffer.opcode})'
  return ''


def user_line(frames) -> str:
  """The innermost line of the user's code in a recorded stack."""
  users = [f for f in frames if not is_library_file(f[0])]
  return str(site_of(users[-1])) if users else ''


# Name-stack parts that are JAX's constructs, not the model's modules.
_CONSTRUCTS = frozenset({'while', 'body', 'cond', 'closed_call', 'checkpoint', 'remat',
                         'scan', 'branch', 'core_call', 'custom_jvp_call',
                         'custom_vjp_call'})


def scope_of(op_name: str) -> str:
  """The module path in an instruction's name stack: without the step's
  own ``jit``, JAX's transformation wrappers and constructs, library
  ``jit``s and the primitive (``jit(step)/jvp(Model)/while/body/blocks/
  mlp/dot_general`` -> ``Model/blocks/mlp``)."""
  parts = op_name.split(';')[0].split('/')[1:-1]
  kept = [p for p in parts if not re.match(r'^p?jit\(', p)]
  return '/'.join(p for p in clean_scope('/'.join(kept)).split('/')
                  if p and p not in _CONSTRUCTS)


# -- residuals by provenance ------------------------------------------------------------------

# Keyed by identity, the objects kept in the entry so an id is not reused.
_words = ResultCache(max_entries=8)


def _words_of(report: RematReport, costs: CompiledCosts) -> _Words:
  """The buffers of `costs` described under `report`, made once per report
  and costs."""
  key = (id(report), id(costs))
  cached = _words.get(key)
  if cached is not None and cached[0] is report and cached[1] is costs:
    return cached[2]
  words = _Words(report, costs)
  _words.put(key, (report, costs, words))
  return words


def match_residuals(buffers, residuals) -> dict[str, Residual]:
  """Each buffer's residual: the one whose computing equations' frames its
  recorded stack ends with, the longest match first. Among equal matches a
  buffer of the residual's size comes first (a loop's carry and the stack
  of that loop's outputs are computed by the same line), then the same
  primitive, then residuals in program order take buffers in schedule
  order."""
  pairs = []
  for b in buffers:
    users = tuple(f for f in b.frames if not is_library_file(f[0]))
    if not users:
      continue
    primitive = b.computed_by.rsplit('/', 1)[-1]
    for r in residuals:
      score = max((len(p) for p in r.provenance if p and users[-len(p):] == p), default=0)
      if score:
        same_kind = r.primitive == primitive
        pairs.append((-score, r.device_bytes != b.bytes, not same_kind, r.index, b.start,
                      b.name, r))
  pairs.sort(key=lambda p: p[:6])
  taken_buffers, taken_residuals, found = set(), set(), {}
  for *_, index, _, name, r in pairs:
    if name in taken_buffers or index in taken_residuals:
      continue
    taken_buffers.add(name)
    taken_residuals.add(index)
    found[name] = r
  return found
