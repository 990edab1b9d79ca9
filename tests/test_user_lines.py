"""A residual's line of the user's code: the line JAX's own
``print_saved_residuals`` names, whatever ran before, and a notebook cell
named as its user sees it (``In [3], line 2``), not by IPython's temp file."""

import html
import json
import os
import sys
import textwrap
from pathlib import Path
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import nbformat
import numpy as np
from nbclient import NotebookClient

from remat_explorer.analysis import analyze
from remat_explorer.viz.text import html_text
from tests.parity import printed_residuals


class _Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    y = nn.relu(nn.Conv(self.features, (3, 3))(x))
    y = nn.Conv(self.features, (3, 3))(y)
    return nn.relu(x + y)


class _ResNet(nn.Module):
  """``relu`` is a jitted function: JAX traces its body once, at the stem,
  and reuses that trace (with the stem's frames) in every block."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(8, (3, 3))(x))
    for _ in range(3):
      x = nn.remat(_Block)(8)(x)
    return nn.Dense(4)(jnp.mean(x, axis=(1, 2)))


def _lines(residuals):
  return [f'{r.dtype.replace("float", "f")}[{",".join(map(str, r.shape))}] {r.description}'
          for r in residuals]


def test_residual_lines_are_jaxs_whatever_ran_before():
  """Each residual's ``source`` (the user's line the diagram and the tables
  show) is the line JAX's ``print_saved_residuals`` names where that line
  is the user's, before and after JAX's own report has run."""
  rng = np.random.default_rng(1618)
  x = jnp.asarray(rng.standard_normal((2, 8, 8, 3)), jnp.float32)
  model = _ResNet()
  params = model.init(jax.random.key(int(rng.integers(1 << 16))), x)
  loss = lambda params, x: jnp.sum(model.apply(params, x) ** 2)

  first = analyze(loss, params, x)
  jaxs = printed_residuals(jax.ad_checkpoint.print_saved_residuals, loss, params, x)
  again = analyze(loss, params, x)
  assert [r.source for r in first.residuals] == [r.source for r in again.residuals]
  computed = [r for r in first.residuals if r.kind != 'argument']
  jaxs = [line for line in jaxs if 'from the argument' not in line]
  assert _lines(computed) == jaxs
  compared = 0
  for r, line in zip(computed, jaxs):
    m = re.search(r' from (\S+):(\d+):\d+ \((.*)\)$', line)
    if m and __file__.endswith(m.group(1).rsplit('/', 1)[-1]):
      assert r.source.endswith(f'test_user_lines.py:{m.group(2)} ({m.group(3)})'), (r, line)
      compared += 1
  assert compared >= 4
  # The blocks' outputs come from the block's last line, not the stem's.
  with open(__file__) as source:
    block_line = 1 + [l.strip() for l in source].index('return nn.relu(x + y)')
  assert sum(f'.py:{block_line} ' in (r.source or '') for r in first.residuals) == 2


def test_a_notebook_cell_is_named_by_its_execution_count(tmp_path):
  cells = [
      'import jax, jax.numpy as jnp\nfrom remat_explorer import analyze',
      'def loss(w, x):\n    h = jnp.tanh(x @ w)\n    return jnp.sum(h ** 2)',
      'w, x = jnp.ones((4, 4)) / 3, jnp.arange(8.0).reshape(2, 4)\n'
      'print([r.source for r in analyze(loss, w, x).residuals if r.primitive == "tanh"])',
  ]
  notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
  NotebookClient(notebook, timeout=120, kernel_name='python3',
                 resources={'metadata': {'path': str(tmp_path)}}).execute()
  printed = ''.join(o.get('text', '') for o in notebook.cells[2].outputs)
  assert json.loads(printed.replace("'", '"')) == ['In [2], line 2 (loss)']


def test_a_model_installed_as_a_package_keeps_its_own_lines(tmp_path):
  """A model installed from a package index lies in site-packages beside
  JAX and Flax; it is the user's code all the same: its residuals and
  blocks are named by its own lines, not by the call of ``model.apply``."""
  import importlib
  import shutil
  import sysconfig
  import uuid
  name = f'remat_explorer_installed_model_{uuid.uuid4().hex[:8]}'
  package = Path(sysconfig.get_paths()['purelib']) / name
  package.mkdir()
  try:
    (package / '__init__.py').write_text(textwrap.dedent('''\
        import jax.numpy as jnp
        from flax import linen as nn


        class Block(nn.Module):
          @nn.compact
          def __call__(self, x):
            h = nn.Dense(16, name='up')(x)
            h = jnp.sin(h) * jnp.tanh(h)
            return x + nn.Dense(8, name='down')(h)


        class Model(nn.Module):
          @nn.compact
          def __call__(self, x):
            for i in range(2):
              x = nn.remat(Block)(name=f'block{i}')(x)
            return x
        '''))
    importlib.invalidate_caches()
    installed = importlib.import_module(name)
    model = installed.Model()
    x = jax.random.normal(jax.random.key(5), (4, 8))
    params = model.init(jax.random.key(6), x)['params']
    loss = lambda params, x: jnp.sum(model.apply({'params': params}, x) ** 2)
    report = analyze(loss, params, x)
    # The first block's output, saved for the second: made on the package's
    # line 10, shown as its import names the file (not the path of the
    # virtual environment, wherever that is).
    lines = {r.source for r in report.residuals if r.primitive == 'add'}
    assert lines and all(line.startswith(f'{name}/__init__.py:10 ') for line in lines), lines
    assert not any('core_fn' in b.name for b in report.blocks), [b.name for b in report.blocks]
    # The tables show the line so; its file's whole path is its tooltip.
    from remat_explorer import viz
    from remat_explorer.analysis import compile_costs, live_at_peak
    whole = f'{os.path.realpath(package)}/__init__.py:10 '
    table = viz.residual_table_html(report)
    titles = [(html.unescape(title), html.unescape(text.replace('<wbr>', ''))) for title, text
              in re.findall(r'<td[^>]* title="([^"]*)">([^<]*(?:<wbr>[^<]*)*)</td>', table)]
    assert (f'{os.path.realpath(package)}/__init__.py:10 (Block.__call__)',
            f'{name}/__init__.py:10 (Block.__call__)') in titles, titles
    here = os.path.realpath(__file__)
    assert all(title.startswith(here) and text == os.path.relpath(here) + title[len(here):]
               for title, text in titles if 'test_user_lines' in text), titles
    live = live_at_peak(report, compile_costs(loss, params, x))
    peak = viz.peak_table_html(live)
    assert html_text(whole) in peak, peak
  finally:
    shutil.rmtree(package, ignore_errors=True)
    sys.modules.pop(name, None)


def test_residuals_made_in_a_scanned_block_name_the_blocks_line():
  """A value saved from inside ``nn.scan(nn.remat(Block))`` (and a scan of our
  own checkpoint) is named by the line of the block that made it, not by
  the line that runs the scan."""
  from remat_explorer import checkpoint_policies, examples
  from tests import framework_models
  source = Path(framework_models.__file__).read_text().splitlines()
  line_of = lambda text: 1 + next(i for i, l in enumerate(source) if text in l)
  loss, args = framework_models.linen_transformer(remat=True)
  named = {r.name: r.source for r in analyze(loss, *args).residuals if r.name}
  assert named['qkv'].endswith(f'framework_models.py:{line_of("qkv = checkpoint_name")} '
                               '(LinenBlock.__call__)'), named
  assert named['mlp_hidden'].endswith(
      f'framework_models.py:{line_of("checkpoint_name(jax.nn.gelu")} (LinenBlock.__call__)')
  loss, args = examples.transformer(num_layers=2, use_scan=True, seed=4)
  policy = checkpoint_policies.save_only_these_names('attention_output', 'mlp_hidden')
  named = {r.name: r.source for r in analyze(loss, *args, policy=policy).residuals if r.name}
  assert '(_attention)' in named['attention_output'], named
  assert '(_transformer_block)' in named['mlp_hidden'], named


def test_a_value_einops_computes_is_named_by_the_line_that_called_it():
  """einops is machinery between the model and JAX, as jax.numpy is: a
  residual its ``einsum`` computed is the model's line that called it, as
  recurrentgemma's Griffin calls it (it showed ``einops/_backends.py``)."""
  import einops
  import remat_explorer as rx

  def block(w, x):
    h = einops.einsum(x, w, 'b i, i o -> b o')  # the line a residual names
    return jnp.sum(h * jnp.sin(h))
  w, x = jax.random.normal(jax.random.key(9), (2, 8, 8))
  report = analyze(rx.checkpoint(block, policy=rx.checkpoint_policies.everything_saveable),
                   w, x)
  line = block.__code__.co_firstlineno + 1
  sources = {r.source for r in report.residuals}
  assert any(s and s.startswith(f'tests/test_user_lines.py:{line} ') for s in sources), sources
  assert not any(s and 'einops' in s.split(' (')[0] for s in sources), sources
