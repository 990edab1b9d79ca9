"""The lines around a view: what it shows (policy, lowering, device), its
warnings and its error. Shared by the Explorer's tabs and its static
snapshot."""

from __future__ import annotations

import jax

from remat_explorer.analysis import mesh_text
from remat_explorer.viz.text import html_text, unique_lines


def caption_html(policy: str, lowering: str, device: str, what: str = 'showing') -> str:
  """The line that says what a view shows: ``'<what> under <policy> ·
  lowering <lowering> · <device>'``."""
  return (f'<p class="remat-caption">{html_text(what)} under {html_text(policy)} · '
          f'lowering {html_text(lowering)} · {html_text(device)}</p>')


def device_text(report=None) -> str:
  """Where `report`'s program runs: its device's kind (a target's, or the
  default device's), and for a sharded program how many devices and which
  mesh (without a report, the default device)."""
  kind = (report.device_kind if report is not None and report.device_kind
          else jax.devices()[0].device_kind)
  if report is None or report.num_devices <= 1:
    return f'device {kind}'
  mesh = mesh_text(report.mesh_shape)
  return f'{report.num_devices} × {kind}' + (f' (mesh {mesh})' if mesh else '')


def warnings_html(warnings) -> str:
  return ''.join(f'<p class="warning">{html_text(w)}</p>' for w in unique_lines(warnings))


def error_html(message: str) -> str:
  """One paragraph; its colour inline, since a sanitized snapshot keeps no
  style sheet."""
  return f'<p class="error" style="color:#b00020">{html_text(message)}</p>'


def compile_error_html(costs, what: str = 'Compile failed') -> str:
  """A failed compile: XLA's first line as the error, and its whole
  message folded beneath it where there is more (XLA:TPU's out-of-memory
  report lists its buffers, XLA:GPU's can quote pages of HLO)."""
  whole = (costs.error or '').strip()
  shown = error_html(f'{what}: {costs.error_line}')
  if '\n' not in whole:
    return shown
  return (shown + '<details class="remat-error-message"><summary>XLA\'s whole message'
          '</summary><pre style="white-space:pre-wrap;margin:0">'
          f'{html_text(whole)}</pre></details>')
