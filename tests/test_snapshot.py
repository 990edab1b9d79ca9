"""The Explorer's static snapshot (``viz.html.snapshot``): what a notebook
shows where widgets do not run, checked against the analysis and XLA's
figures of the same program, and for what the program's names can hold."""

import base64
import html
import re
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import pytest

import remat_explorer as rx
from remat_explorer.analysis import NO_REMAT, analyze, compile_costs
from remat_explorer.viz.diagram.render import render_diagram
from remat_explorer.viz.diagram.split_graph import split_graph
from remat_explorer.viz.html.snapshot import NOT_COMPILED, SNAPSHOT_NOTE, snapshot_html
from remat_explorer.viz.text import format_bytes, html_text

NAME = '<b>x</b>'
"""A ``checkpoint_name`` with markup in it: a name is any string."""


def _named_program():
  def block(w, x):
    h = rx.checkpoint_name(jnp.tanh(x @ w), NAME)
    return jnp.sin(h) @ w
  f = rx.checkpoint(block, policy=rx.checkpoint_policies.save_only_these_names(NAME))

  def loss(w, x):
    return jnp.sum(f(w, f(w, x)) ** 2)
  k1, k2 = jax.random.split(jax.random.key(7))
  return loss, (jax.random.normal(k1, (16, 16)), jax.random.normal(k2, (8, 16)))


@pytest.fixture(scope='module')
def named():
  loss, args = _named_program()
  report = analyze(loss, *args)
  return report, compile_costs(loss, *args), compile_costs(loss, *args, policy=NO_REMAT)


def _cells(html_text_, table_class):
  table = re.search(rf'<table class="{table_class}">(.*?)</table>', html_text_, re.S).group(1)
  return {html.unescape(k): html.unescape(v) for k, v in
          re.findall(r'<tr><td>(.*?)</td><td>(.*?)</td></tr>', table)}


def _images(page: str) -> dict[str, list[str]]:
  """Each ``<img>``'s class and the SVG its data URI holds."""
  found: dict[str, list[str]] = {}
  for cls, data in re.findall(r'<img class="([^"]+)"[^>]*?src="data:image/svg\+xml;base64,'
                              r'([^"]+)"', page):
    found.setdefault(cls, []).append(base64.b64decode(data).decode('utf-8'))
  return found


def test_the_snapshot_shows_xla_figures_the_timeline_and_the_split(named):
  report, costs, baseline = named
  page = snapshot_html(report, costs, baseline=baseline)
  # It says first what it is and how to get the live widget.
  first = re.search(r'<p[^>]*>(.*?)</p>', page).group(1)
  assert first == SNAPSHOT_NOTE and 'trusted' in first and 'remat_explorer[lab]' in first
  assert f'under {html_text(report.policy)} · lowering {report.lowering}' in page

  cells = _cells(page, 'remat-costs-table')
  for row, value in [('peak bytes', costs.peak_bytes), ('temp bytes', costs.temp_bytes),
                     ('argument bytes', costs.argument_bytes),
                     ('output bytes', costs.output_bytes),
                     ('no-remat peak bytes', baseline.peak_bytes),
                     ('FLOPs executed (loops counted)', int(costs.executed_flops))]:
    assert cells[row].startswith(f'{value:,} ('), (row, cells[row], value)
  assert cells['device'] == costs.device_kind

  # Nothing a sanitizer drops: no script, style or inline SVG; every
  # figure an image of SVG data.
  assert not re.search(r'<(svg|script|style)\b', page)
  images = _images(page)
  (timeline,) = images['remat-timeline-img']
  chart = ET.fromstring(timeline)  # a standalone document an <img> can load
  assert chart.get('width') and chart.get('height')
  assert f'peak {html_text(format_bytes(costs.timeline.peak_bytes))}' in timeline
  # The diagram twice: fitted to the cell, and at full size in a fold, as
  # an image (its legend names expand=, a click on it opening nothing).
  drawn = render_diagram(split_graph(report, opens_on_click=False)).svg
  assert images['remat-snapshot-diagram'] == [drawn] and images['diagram'] == [drawn]
  assert re.search(r'<img class="remat-snapshot-diagram" style="max-width:100%', page)
  assert re.search(r'<details class="remat-full-size"><summary>[^<]+</summary>'
                   r'<div class="remat-split-img"[^>]*><img class="diagram"[^>]*'
                   r'max-width:none', page)
  # The residual table, the user's name in it as text.
  assert 'remat-residual-table' in page
  assert html_text(NAME) in page and NAME not in page
  assert html_text(NAME) in drawn and NAME not in drawn


def test_a_snapshot_without_costs_says_they_were_not_compiled(named):
  report, _, _ = named
  page = snapshot_html(report)
  assert html_text(NOT_COMPILED) in page and 'remat-costs-table' not in page
  assert 'remat-residual-table' in page and 'remat-snapshot-diagram' in page


def test_a_snapshot_of_a_failed_analysis_shows_the_error_escaped():
  page = snapshot_html(error=f'ValueError: no residual named {NAME}', policy=NAME,
                       lowering='cond')
  assert re.search(r'<p class="error"[^>]*>ValueError: no residual named '
                   + re.escape(html_text(NAME)) + '</p>', page)
  assert NAME not in page and f'under {html_text(NAME)} · lowering cond' in page
  assert SNAPSHOT_NOTE in page


def test_the_explorer_of_a_program_it_cannot_analyze_shows_the_error_in_its_snapshot():
  def training_step(w, x):  # differentiates itself: refused, naming the loss
    return jax.grad(lambda w: jnp.sum(jnp.sin(x @ w)))(w)
  w, x = jax.random.normal(jax.random.key(3), (2, 4, 4))
  e = rx.explore(training_step, w, x)
  e.wait(120)
  page = e._repr_mimebundle_()['text/html']
  assert SNAPSHOT_NOTE in page
  message = html.unescape(re.search(r'<p class="error"[^>]*>(.*?)</p>', page).group(1))
  # The widget's own error line, word for word.
  assert message == html.unescape(re.search(r'<p class="error"[^>]*>(.*?)</p>',
                                            e.error.value).group(1))
  assert message.startswith('Could not analyze the program') and 'training_step' in message
  assert 'remat-residual-table' not in page


class _Notebook:
  """What a notebook receives from a kernel: each output displayed, and
  the updates of those displayed with a display id."""

  def __init__(self):
    self.shown, self.updates = [], []

  def display(self, bundle, display_id=False):
    self.shown.append(bundle)
    return self if display_id else None

  def update(self, bundle, raw=False):
    self.updates.append(bundle)


def test_the_snapshot_is_an_output_of_its_own_that_follows_the_explorer(monkeypatch):
  """Shown in a notebook, the Explorer is two outputs: the widget's view,
  never sent again (a front end would build it anew under the user), and
  the snapshot, which follows what the Explorer shows: the policy on
  screen, its compiled costs, the last comparison and search. It hides
  itself where its widget is on the page."""
  from remat_explorer.viz.widget import notebook_output
  notebook = _Notebook()
  monkeypatch.setattr(notebook_output, '_display', notebook.display)
  loss, args = _named_program()
  e = rx.explore(loss, *args)
  e._ipython_display_()
  view, first = notebook.shown
  assert view['application/vnd.jupyter.widget-view+json']['model_id'] == e.widget.model_id
  assert 'text/html' not in view and 'snapshot' in view['text/plain']
  assert set(first) == {'text/html'} and SNAPSHOT_NOTE in first['text/html']
  e.wait(300)
  # The compiled costs landed in the snapshot's output.
  page = notebook.updates[-1]['text/html']
  costs = compile_costs(loss, *args)
  assert _cells(page, 'remat-costs-table')['peak bytes'].startswith(f'{costs.peak_bytes:,} (')
  assert e._repr_mimebundle_()['text/html'] == page
  # Where a view of its widget is on the page, it hides itself.
  mark = f'remat-explorer-of-{e.widget.model_id}'
  assert mark in e.widget._dom_classes
  assert re.search(rf'<style>\.jp-Notebook:has\(\.{mark}\) [^<]*display: none', page)
  # Its diagram is an image: worded for one, where the live diagram opens a
  # group on a click.
  image = _images(page)['remat-snapshot-diagram'][0]
  assert 'opens with expand=' in image and 'click to open' not in image
  assert 'click to open' in e.diagram.svg
  # Another policy, a comparison and a search: all of them in the output.
  e.policy.value = 'everything_saveable'
  e.compare_button.click()
  e.wait(300)
  page = notebook.updates[-1]['text/html']
  everything = compile_costs(loss, *args, policy=rx.checkpoint_policies.everything_saveable)
  assert 'under policy everything_saveable' in page
  assert _cells(page, 'remat-costs-table')['peak bytes'].startswith(
      f'{everything.peak_bytes:,} (')
  compared = page[page.index('The last comparison'):].replace('<wbr>', '')
  assert 'remat-comparison-table' in compared and 'everything_saveable' in compared
  e.budget.value = 0.3
  e.search_button.click()
  e.wait(600)
  page = notebook.updates[-1]['text/html']
  searched = page[page.index('The last search'):].replace('<wbr>', '')
  assert html_text(e.search_result.label) in searched
  assert f'under policy {html_text(e.search_result.label)}' in page
  assert len(notebook.shown) == 2  # the widget's view was sent once
  # Waiting sends the snapshot again, sent or not: an executor that saves
  # the notebook records only what arrives while a cell runs.
  sent = len(notebook.updates)
  e.wait(60)
  assert len(notebook.updates) == sent + 1 and notebook.updates[-1] == notebook.updates[-2]


def test_a_compile_that_raises_is_said_in_the_snapshot(monkeypatch):
  from remat_explorer.viz.widget import explorer as explorer_module

  def compile_that_raises(*args, **kwargs):
    raise RuntimeError(f'out of memory compiling {NAME}')
  monkeypatch.setattr(explorer_module, 'compile_costs', compile_that_raises)
  loss, args = _named_program()
  e = rx.explore(loss, *args)
  e.wait(300)
  page = e._repr_mimebundle_()['text/html']
  assert (f'Compile failed: RuntimeError: out of memory compiling {html_text(NAME)}'
          in page)
  assert html_text(NOT_COMPILED) in page and 'remat-residual-table' in page
