"""Background work in the Explorer: superseded requests are not computed,
equal requests are computed once, a stopped Explorer shows nothing more."""

import threading

import jax
import jax.numpy as jnp

import remat_explorer as rx
from remat_explorer.viz.widget import _panels, notebook_output
from remat_explorer.viz.widget._work import Work


class Recorder:
  """A `Work` whose computations wait for a gate, recording what ran and
  what was applied."""

  def __init__(self):
    self.computed, self.applied, self.errors, self.shown = [], [], [], []
    self.gates: dict[str, threading.Event] = {}
    self.work = Work(on_tasks=self.shown.append, on_error=self.errors.append)

  def start(self, name, *, group='costs', key=None, to=None):
    gate = self.gates.setdefault(name, threading.Event())

    def compute(_progress):
      self.computed.append(name)
      gate.wait(30)
      return name
    self.work.start(name, compute, lambda r: self.applied.append((to or name, r)),
                    group=group, key=key)

  def release(self, *names):
    for name in names:
      self.gates.setdefault(name, threading.Event()).set()


def _until_computing(rec, name):
  for _ in range(3000):
    if name in rec.computed:
      return
    threading.Event().wait(0.01)
  raise AssertionError(f'{name} never started')


def test_a_newer_request_replaces_the_waiting_one():
  rec = Recorder()
  for name in ('A', 'B', 'C'):
    rec.start(name)
  _until_computing(rec, 'A')
  # A runs, C waits, B was replaced before it ran: the progress line counts
  # two tasks, one of them waiting.
  tasks = rec.work.running()
  assert [(t.label, t.waiting) for t in tasks] == [('A', False), ('C', True)]
  assert 'C: next, once the one under way ends' in _panels.progress_html(tasks)
  rec.release('A', 'B', 'C')
  rec.work.wait(30)
  assert rec.computed == ['A', 'C']
  assert rec.applied == [('A', 'A'), ('C', 'C')]
  assert rec.work.running() == [] and not rec.errors


def test_an_equal_request_joins_the_one_under_way():
  rec = Recorder()
  rec.start('A', key='same', to='first click')
  _until_computing(rec, 'A')
  rec.start('A', key='same', to='second click')  # a double click
  assert len(rec.work.running()) == 1
  rec.release('A')
  rec.work.wait(30)
  assert rec.computed == ['A']
  assert rec.applied == [('second click', 'A')]


def test_groups_do_not_wait_for_each_other():
  rec = Recorder()
  rec.start('compile', group='costs')
  rec.start('compare', group='comparison')
  _until_computing(rec, 'compile')
  _until_computing(rec, 'compare')
  rec.release('compile', 'compare')
  rec.work.wait(30)
  assert sorted(rec.computed) == ['compare', 'compile']


def test_stop_drops_what_waits_and_what_runs_ends_unseen():
  rec = Recorder()
  rec.start('A')
  rec.start('B')
  _until_computing(rec, 'A')
  rec.work.stop()
  assert rec.work.running() == []
  rec.release('A', 'B')
  rec.work.wait(5)  # nothing is left to wait for
  threading.Event().wait(0.2)
  rec.work.drain()
  assert rec.computed == ['A'] and rec.applied == []
  rec.start('C')  # a stopped Work starts nothing
  rec.release('C')
  rec.work.wait(5)
  assert 'C' not in rec.computed


def _loss(w, x):
  return jnp.sum(rx.checkpoint(lambda w, x: jnp.tanh(x @ w))(w, x) ** 2)


def test_running_the_cell_again_stops_the_earlier_explorer(monkeypatch):
  monkeypatch.setattr(notebook_output, '_current_cell', lambda: 'cell-7')
  monkeypatch.setattr(notebook_output, '_by_cell', {})
  keys = jax.random.split(jax.random.key(5))
  args = (jax.random.normal(keys[0], (8, 8)), jax.random.normal(keys[1], (4, 8)))
  first = rx.explore(_loss, *args)
  first.wait(120)
  second = rx.explore(_loss, *args)
  second.wait(120)
  # The earlier Explorer's controls still work, but start no compile.
  shown = first.costs_view.value
  first.policy.value = 'dots_saveable'
  assert first._work.running() == []
  first.wait(5)
  assert first.costs_view.value == shown
  # The new one is live.
  second.policy.value = 'dots_saveable'
  second.wait(120)
  assert 'compiled under dots_saveable' in second.costs_view.value


SCRIPT_ENDING_MID_COMPILE = '''
import remat_explorer as rx
from remat_explorer import examples
f, args = examples.transformer(num_layers=2, d_model=32, num_heads=4, seq_len=8, batch=2, seed=4)
explorer = rx.Explorer(f, *args)
explorer.block.value = explorer.block.options[1]
explorer.policy.value = 'dots_saveable'   # a compile starts on a worker
explorer.stop()
print('last line')
'''


def test_a_script_that_ends_while_a_compile_runs_exits_cleanly(tmp_path):
  """A script whose last line leaves a compile under way: the process
  waits for it and exits with 0 (XLA aborted it with SIGABRT when the
  interpreter was torn down under the compile)."""
  import subprocess
  import sys
  from pathlib import Path
  script = tmp_path / 'script.py'
  script.write_text(SCRIPT_ENDING_MID_COMPILE)
  env = {'PATH': '/usr/bin:/bin', 'JAX_PLATFORMS': 'cpu', 'MPLBACKEND': 'Agg',
         'PYTHONPATH': str(Path(__file__).resolve().parents[1])}
  done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=300, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'last line' in done.stdout
