"""``compare`` and ``search_policy`` say how far they are where their user
looks, given no callback: a line of a terminal redrawn, an output of a
notebook cell updated in place, each cleared at the end; nothing where no
one would see it, nor with ``progress=False``."""

import io
import sys

import pytest

import remat_explorer as rx
from remat_explorer import examples
from remat_explorer.analysis import progress as progress_line


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def _screen(written: str) -> str:
  """What a terminal shows of `written`, a line redrawn after each \\r."""
  return written.split('\r')[-1]


def _shown_lines(written: str) -> list[str]:
  return [part.rstrip() for part in written.split('\r') if part.strip()]


@pytest.fixture
def terminal(monkeypatch):
  """A terminal as standard error, installed by the test itself: pytest sets
  its own capture when the test starts."""
  screen = _Terminal()
  monkeypatch.setattr(progress_line, 'SHOWN_AFTER_SECONDS', 0.0)
  return lambda: monkeypatch.setattr(sys, 'stderr', screen) or screen


def _mlp():
  return examples.mlp(num_layers=3, width=32, batch=8, seed=2)


def test_a_comparison_and_a_search_redraw_one_line_in_a_terminal(terminal):
  loss, args = _mlp()
  terminal = terminal()
  comparison = rx.compare(loss, *args, policies=['dots_saveable'])
  lines = _shown_lines(terminal.getvalue())
  assert len(lines) == len(comparison.rows) == 3
  # One line per row as it lands (a row found in the cache lands first).
  assert [line.split(' · ')[0] for line in lines] == ['compare: 1/3', 'compare: 2/3',
                                                      'compare: 3/3']
  assert sorted(line.split(' · ')[1] for line in lines) == sorted(
      row.label for row in comparison.rows)
  assert _screen(terminal.getvalue()) == ''  # erased at the end
  terminal.seek(0)
  terminal.truncate()
  result = rx.search_policy(loss, *args, memory_budget=0.5)
  lines = _shown_lines(terminal.getvalue())
  assert lines[0].startswith('search_policy: 0/') and 'compiling nothing_saveable' in lines[0]
  assert any(line.startswith('search_policy: verifying') for line in lines), lines
  assert _screen(terminal.getvalue()) == '' and result.fits


def test_nothing_is_written_where_no_one_sees_it_or_when_asked(terminal, monkeypatch):
  loss, args = _mlp()
  terminal = terminal()
  rx.compare(loss, *args, policies=['dots_saveable'], progress=False)
  rx.search_policy(loss, *args, memory_budget=0.5, progress=False)
  assert terminal.getvalue() == ''
  piped = io.StringIO()  # not a terminal: a log file, a test run
  monkeypatch.setattr(sys, 'stderr', piped)
  assert rx.compare(loss, *args, policies=['nothing_saveable']).rows
  assert piped.getvalue() == ''
  # A call that ends before the line is due shows nothing.
  monkeypatch.setattr(sys, 'stderr', terminal)
  monkeypatch.setattr(progress_line, 'SHOWN_AFTER_SECONDS', 3600.0)
  rx.compare(loss, *args, policies=['everything_saveable'])
  assert terminal.getvalue() == ''


def test_a_callback_given_is_called_and_nothing_else_written(terminal):
  loss, args = _mlp()
  terminal = terminal()
  calls = []
  rx.compare(loss, *args, policies=['dots_saveable'],
             progress=lambda done, total, label: calls.append((done, total, label)))
  assert [c[:2] for c in calls] == [(1, 3), (2, 3), (3, 3)]
  assert terminal.getvalue() == ''


@pytest.mark.parametrize('entry', ['compare', 'search_policy'])
def test_a_progress_that_is_not_a_function_is_refused_before_tracing(entry):
  loss, args = _mlp()
  calls = []

  def counted(*a):
    calls.append(1)
    return loss(*a)
  extra = {'memory_budget': 0.5} if entry == 'search_policy' else {}
  with pytest.raises(TypeError, match=r"progress must be a function .* got str 'yes'"):
    getattr(rx, entry)(counted, *args, progress='yes', **extra)
  assert calls == []


def test_a_notebook_cell_shows_one_output_updated_in_place_and_emptied():
  """In a kernel, as a notebook runs it: one display output, its updates
  the rows as they land, the last one empty."""
  from jupyter_client.manager import start_new_kernel
  manager, client = start_new_kernel(kernel_name='python3')
  try:
    client.execute_interactive(
        'from remat_explorer import analysis, examples\n'
        'from remat_explorer.analysis import progress\n'
        'progress.SHOWN_AFTER_SECONDS = 0.0\n'
        'loss, args = examples.mlp(num_layers=3, width=32, batch=8, seed=2)\n'
        "rows = analysis.compare(loss, *args, policies=['dots_saveable']).rows\n"
        'print([r.label for r in rows])',
        output_hook=(messages := []).append, timeout=300)
  finally:
    client.stop_channels()
    manager.shutdown_kernel(now=True)
  shown = [(m['msg_type'], m['content']['data']['text/plain'],
            m['content']['transient']['display_id'])
           for m in messages if m['msg_type'] in ('display_data', 'update_display_data')]
  assert [kind for kind, _, _ in shown] == ['display_data'] + ['update_display_data'] * 3
  assert len({display_id for _, _, display_id in shown}) == 1
  assert [text.split(' · ')[0] for _, text, _ in shown[:3]] == [
      'compare: 1/3', 'compare: 2/3', 'compare: 3/3']
  assert sorted(text.split(' · ')[1] for _, text, _ in shown[:3]) == [
      'as written', 'dots_saveable', 'no remat']
  assert shown[-1][1] == ''
  printed = ''.join(m['content']['text'] for m in messages if m['msg_type'] == 'stream')
  assert "['as written', 'no remat', 'dots_saveable']" in printed
