"""A button that copies Python to the clipboard, and shows what it copied.

The clipboard can only be written from the page, in answer to the user's
click, so the copy happens in the front end: Python keeps ``code`` current
(the policy shown, as ``policy_source`` writes it); a click copies it and
opens it below the button, where it can also be selected by hand (a page
served without a secure context has no clipboard).
"""

from __future__ import annotations

from remat_explorer.viz.widget.lab import require_lab

require_lab('The copy-as-code widget')

import anywidget  # noqa: E402
import traitlets  # noqa: E402

_ESM = r"""
function render({model, el}) {
  const button = document.createElement('button');
  button.type = 'button';
  button.className = 'remat-copy-code jupyter-button';
  button.textContent = 'copy as code';
  button.title = 'Copy the policy shown as Python that needs only JAX';
  const said = document.createElement('span');
  said.className = 'remat-copy-said';
  const code = document.createElement('pre');
  code.className = 'remat-code';
  code.hidden = true;
  const show = () => { code.textContent = model.get('code'); };
  button.addEventListener('click', async () => {
    show();
    code.hidden = false;
    try {
      await navigator.clipboard.writeText(model.get('code'));
      said.textContent = 'copied';
    } catch (e) {
      said.textContent = 'select the code below to copy it';
    }
    model.set('copies', model.get('copies') + 1);
    model.save_changes();
  });
  const changed = () => { show(); said.textContent = ''; };
  model.on('change:code', changed);
  el.replaceChildren(button, said, code);
  return () => model.off('change:code', changed);
}
export default { render };
"""

_CSS = """
.remat-copy-code { width: auto; white-space: nowrap; }
.remat-copy-said { margin-left: 0.5em; font-size: 12px; color: #444; }
pre.remat-code { margin: 0.3em 0; padding: 0.5em; background: #f7f7f7; font-size: 12px;
                 white-space: pre-wrap; overflow-wrap: anywhere; max-width: 100%; }
"""


class CopyCode(anywidget.AnyWidget):
  _esm = _ESM
  _css = _CSS
  code = traitlets.Unicode('').tag(sync=True)
  copies = traitlets.Int(0).tag(sync=True)
  """How many times the user copied (for tests and the notebook's own use)."""
