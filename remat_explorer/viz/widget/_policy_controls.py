"""The Explorer's policy controls: which policy each remat block runs under.

One policy for every block (the "policy" dropdown with "all blocks"), or a
block and a policy for the function it runs: each function picked keeps its
own choice, the others the one for all blocks, and the views show the whole
combination (``{block function: policy}``, as ``analyze`` takes it and the
copied code writes it). A choice for a function that several blocks run
(the layers of an unrolled model) applies to all of them, and says so. A
policy can also be written as an expression (``parse_policy`` reads it:
nothing of it is run) or picked as a set of the program's names. Every
choice that is not a built-in becomes a row of "compare all policies", and
"copy as code" copies the choice as Python (``policy_source``, the text of
``SearchResult.to_source()``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import jax

from remat_explorer.analysis import (NO_REMAT, builtin_policies, describe_policy,
                                     parse_policy, policy_source, AS_WRITTEN,
                                     AS_WRITTEN_NO_REMAT)
from remat_explorer.viz.text import html_text

NAMED = 'save_only_these_names (pick names)'
ALL_BLOCKS = 'all blocks'
HOST_MEMORY = 'pinned_host'
_AUTO = {'width': 'auto', 'flex': '0 0 auto'}  # as wide as its text: never cut


def offload_policies(names, device) -> dict:
  """The offload policies a device can run: residuals moved to host memory
  instead of kept on the device or recomputed."""
  kinds = {m.kind for m in device.addressable_memories()}
  if HOST_MEMORY not in kinds:
    return {}
  cp = jax.checkpoint_policies
  policies = [cp.offload_dot_with_no_batch_dims('device', HOST_MEMORY)]
  if names:
    policies.append(cp.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(names),
        offload_src='device', offload_dst=HOST_MEMORY))
  return {describe_policy(p): p for p in policies}


class PolicyControls:
  """The widgets that choose the policy, and the choice they make.

  `report`: the program as written (its names and blocks), or None when it
  could not be analyzed. `on_change()` is called once per change the user
  makes, after the choice is updated.
  """

  def __init__(self, report, on_change):
    import ipywidgets as w

    from remat_explorer.viz.widget.code_widget import CopyCode
    self._on_change = on_change
    self.names = report.names_in_program if report else ()
    written = AS_WRITTEN if report is None or report.blocks else AS_WRITTEN_NO_REMAT
    self.builtins = {written: None, 'no remat': NO_REMAT, **builtin_policies()}
    self.policies = {**self.builtins, **offload_policies(self.names, jax.devices()[0])}
    """Every option of the dropdown but the names picker, by label."""
    self.tried: dict[str, object] = {}
    """Choices shown that are not built-ins, by label: rows to compare."""
    self._picked_names: str | None = None
    """The row the names picker added: its latest pick, not each click."""
    self.base = written
    """The option every block runs under, but those given their own."""
    self.own: dict[str, str] = {}
    """Blocks given their own option: block function -> option label."""
    self._functions: dict[str, str] = {}  # block name -> the function it runs
    self._quiet = False  # set while the code moves a control

    options = list(self.policies) + ([NAMED] if self.names else [])
    # As wide as its label, up to a bound: a found or typed policy's label
    # may be hundreds of characters long; the whole label is its tooltip.
    # (ipywidgets shows a dropdown's tooltip only where it has no
    # description: its label is a widget beside it.)
    self.policy = w.Dropdown(options=options, value=written,
                             layout=w.Layout(width='auto', max_width='36em'))
    self.policy_row = w.HBox([w.Label('policy'), self.policy])
    self.policy_row.add_class('remat-policy-row')
    self.names_select = w.SelectMultiple(options=self.names, value=self.names[:1],
                                         description='names', rows=min(6, len(self.names) or 1),
                                         layout=w.Layout(display='none'))
    self.block = w.Dropdown(options=[ALL_BLOCKS], value=ALL_BLOCKS, description='block',
                            tooltip='the block the policy applies to, and '
                            'the one the diagram shows')
    self.expression = w.Text(
        description='expression', continuous_update=False,
        placeholder="e.g. save_from_both_policies(dots_saveable, save_only_these_names('q'))",
        layout=w.Layout(width='34em'))
    self.expression_note = w.HTML()
    self.per_block = w.HTML()
    self.per_block.add_class('remat-per-block')
    self.reset = w.Button(description='one policy for all blocks', layout=w.Layout(**_AUTO))
    self.copy = CopyCode()
    # The source a search wrote for the option it answered, copied in place
    # of ``policy_source``'s (for no remat it names, from the search's
    # compiles, the policy to keep the checkpoints with).
    self.searched_sources: dict[str, str] = {}
    self.policy.add_class('remat-policy')
    self.expression.add_class('remat-expression')
    self.set_blocks(report)

    self.policy.observe(self._policy_changed, names='value')
    self.names_select.observe(lambda _: self._quiet or self._changed(), names='value')
    self.block.observe(self._block_changed, names='value')
    self.expression.observe(self._expression_entered, names='value')
    self.reset.on_click(lambda _: self.one_for_all())
    self._show_state()

  # -- the choice ------------------------------------------------------------------

  def option_policy(self, label):
    """The policy of a dropdown option (the names picker's, as picked)."""
    if label == NAMED:
      return jax.checkpoint_policies.save_only_these_names(*self.names_select.value)
    return self.policies[label]

  def option_label(self, label) -> str:
    return describe_policy(self.option_policy(label)) if label == NAMED else label

  def choice(self):
    """What ``analyze`` and the compiles take: a policy, ``NO_REMAT``,
    None (as written), or ``{block function: policy}``."""
    base = self.option_policy(self.base)
    if not self.own:
      return base
    if base is None:  # every other block keeps its own policy
      combined = {}
    elif isinstance(base, Mapping):
      combined = dict(base)
    else:
      combined = {function: base for function in self._functions.values()}
    for function, label in self.own.items():
      policy = self.option_policy(label)
      if policy is None:
        combined.pop(function, None)
      else:
        combined[function] = policy
    return combined or None

  def label(self) -> str:
    """The choice in words: the option, then each block given its own."""
    text = self.option_label(self.base)
    if self.own:
      text += ', with ' + '; '.join(f'{self._function_text(function)}: {self.option_label(label)}'
                                    for function, label in sorted(self.own.items()))
    return text

  def _function_text(self, function: str) -> str:
    """A block's function as the choice applies to it: to every block that
    runs it (the layers of an unrolled model), said with their count, as
    ``policy={function: ...}`` and the copied code apply it."""
    blocks = sum(1 for f in self._functions.values() if f == function)
    return function if blocks < 2 else f'{function} (all {blocks} blocks)'

  def shown(self) -> None:
    """The choice is on screen: a row to compare if it is no built-in, and
    the code the copy button copies."""
    label = self.label()
    if label not in self.builtins:
      if NAMED in (self.base, *self.own.values()):
        # Picking names takes clicks: the row is the names picked, not
        # each set on the way to them.
        if self._picked_names not in (None, label):
          self.tried.pop(self._picked_names, None)
        self._picked_names = label
      self.tried[label] = self.choice()
    self.copy.code = self.searched_sources.get(label) or policy_source(self.choice())

  def comparison_rows(self) -> dict:
    """The policies "compare all policies" compiles beside the program as
    written and no remat: the built-ins and every choice tried."""
    return {**builtin_policies(self.names), **self.tried}

  # -- changing it -----------------------------------------------------------------

  def block_function(self) -> str | None:
    return self._functions.get(self.block.value)

  def set_blocks(self, report) -> None:
    """The blocks of `report` (the program as written; another layout)."""
    blocks = report.blocks if report else ()
    self._functions = {b.name: b.function for b in blocks}
    self.own.clear()
    with self._holding():
      self.block.options = [ALL_BLOCKS] + [b.name for b in blocks]
      self.block.value = ALL_BLOCKS
      self.policy.value = self.base
    self.block.layout.display = '' if len(blocks) > 1 else 'none'
    self._show_state()

  def select(self, label, policy=None) -> str:
    """Show option `label` for every block (added first if `policy` is
    given and it is not an option yet); returns the option shown."""
    if policy is not None:
      label = self.add(label, policy)
    self.own.clear()
    with self._holding():
      self.block.value = ALL_BLOCKS
      self.base = label
      self.policy.value = label
    self._changed()
    return label

  def one_for_all(self) -> None:
    """Drop the blocks' own choices: the one for all blocks everywhere."""
    self.select(self.base)

  def add(self, label, policy) -> str:
    """`policy` among the options, once (a built-in or one added before is
    found, not repeated); returns its option."""
    label = next((k for k, p in self.policies.items() if p is not None and p == policy), label)
    if label not in self.policy.options:  # before the names picker, if any
      self.policies[label] = policy
      options = [o for o in self.policy.options if o != NAMED] + [label]
      with self._holding():
        self.policy.options = options + ([NAMED] if NAMED in self.policy.options else [])
    return label

  def _policy_changed(self, change) -> None:
    if self._quiet:
      return
    function = self.block_function()
    if function is None:
      self.base = change['new']
    elif change['new'] == self.base:
      self.own.pop(function, None)
    else:
      self.own[function] = change['new']
    self._changed()

  def _block_changed(self, _) -> None:
    # The dropdown shows the block's option; the diagram follows the block.
    if self._quiet:
      return
    function = self.block_function()
    with self._holding():
      self.policy.value = self.own.get(function, self.base) if function else self.base
    self._changed()

  def _expression_entered(self, change) -> None:
    text = change['new'].strip()
    if not text:
      self.expression_note.value = ''
      return
    try:
      policy = parse_policy(text)
    except (ValueError, TypeError) as e:
      self.expression_note.value = f'<span class="remat-error">{html_text(str(e))}</span>'
      return
    self.expression_note.value = ''
    self.policy.value = self.add(describe_policy(policy), policy)

  def _changed(self) -> None:
    self.expression_note.value = ''  # an expression's error is about the choice it replaced
    self._show_state()
    self._on_change()

  def _show_state(self) -> None:
    self.policy.tooltip = self.policy.value
    self.names_select.layout.display = (
        '' if NAMED in (self.base, *self.own.values()) else 'none')
    if self.own:
      self.per_block.value = (
          '<span class="remat-caption">' + html_text(
              f'all blocks: {self.option_label(self.base)} · '
              + ' · '.join(f'{self._function_text(f)}: {self.option_label(l)}'
                           for f, l in sorted(self.own.items())))
          + '</span>')
    else:
      self.per_block.value = ''
    self.reset.layout.display = '' if self.own else 'none'

  @contextlib.contextmanager
  def _holding(self):
    self._quiet = True
    try:
      yield
    finally:
      self._quiet = False
