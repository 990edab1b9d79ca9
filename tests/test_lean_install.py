"""Without the ``[lab]`` extra: the engine, the analysis and the static
rendering import and run; the widgets say what to install."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_WITHOUT_LAB = textwrap.dedent('''
    import importlib.abc, sys

    class NotInstalled(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('ipywidgets', 'anywidget', 'jupyterlab', 'notebook',
                                  'ipykernel'):
          raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        return None

    sys.meta_path.insert(0, NotInstalled())
''')


def _run_without_lab(body: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-c', _WITHOUT_LAB + textwrap.dedent(body)],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_analysis_and_static_rendering_run_without_the_widget_packages():
  done = _run_without_lab('''
      import jax, jax.numpy as jnp
      import remat_explorer as rx
      from remat_explorer import viz

      def loss(w, x):
        return jnp.sum(jnp.sin(jnp.tanh(x @ w)) ** 2)

      w = jax.random.normal(jax.random.key(0), (8, 8))
      x = jax.random.normal(jax.random.key(1), (4, 8))
      report = rx.analyze(rx.checkpoint(loss), w, x)
      html = viz.residual_table_html(report)
      svg = viz.to_svg(viz.split_graph(report))
      assert report.residuals and '<table' in html and '<svg' in svg
      assert not {'ipywidgets', 'anywidget'} & set(sys.modules), sorted(sys.modules)
      for make in (lambda: rx.explore(loss, w, x),
                   lambda: __import__('remat_explorer.viz.widget.viewer_widget')):
        try:
          make()
        except ImportError as e:
          print('REFUSED:', e)
        else:
          raise SystemExit('a widget was made without its packages')
  ''')
  assert done.returncode == 0, done.stderr
  refusals = [line for line in done.stdout.splitlines() if line.startswith('REFUSED:')]
  assert len(refusals) == 2, done.stdout
  for line in refusals:
    assert "pip install 'remat_explorer[lab]'" in line and 'ipywidgets' in line
