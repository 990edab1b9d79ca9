"""Python's full collections are held off while ``compare`` works, and the
process's own thresholds are back once it is done, whatever happened."""

import gc
import threading

import jax
import jax.numpy as jnp
import pytest

import remat_explorer as rx
from remat_explorer.analysis import compare
from remat_explorer.analysis.full_collections import full_collections_held_off


@pytest.fixture(autouse=True)
def _python_s_own_thresholds():
  """These tests are about Python's own schedule of collections; the suite
  runs its collector less often (``conftest.py``)."""
  suite = gc.get_threshold()
  gc.set_threshold(700, 10, 10)
  yield
  gc.set_threshold(*suite)


def _full_collections_while(fn) -> int:
  """How many full (generation 2) collections Python starts by itself
  while `fn` runs."""
  seen = []
  def note(phase, info):
    if phase == 'start' and info['generation'] == 2:
      seen.append(info)
  gc.callbacks.append(note)
  try:
    fn()
  finally:
    gc.callbacks.remove(note)
  return len(seen)


def _allocate_survivors():
  """Containers that live long enough to reach the oldest generation (as a
  traced program's objects do), more of them than a quarter of what the
  process holds there already: Python's own condition for a full
  collection."""
  count = len(gc.get_objects(generation=2)) // 2 + 200_000
  kept = [[] for _ in range(count)]
  del kept


def test_no_full_collection_runs_while_held_off_and_thresholds_come_back():
  before = gc.get_threshold()
  # The same garbage sets off full collections outside, none inside.
  assert _full_collections_while(_allocate_survivors) > 0
  with full_collections_held_off():
    assert _full_collections_while(_allocate_survivors) == 0
    assert gc.get_threshold()[:2] == before[:2]  # young generations as before
  assert gc.get_threshold() == before


def test_overlapping_holders_on_two_threads_restore_the_thresholds_last():
  before = gc.get_threshold()
  entered, release = threading.Event(), threading.Event()

  def other():
    with full_collections_held_off():
      entered.set()
      release.wait(10)

  thread = threading.Thread(target=other)
  with full_collections_held_off():
    thread.start()
    entered.wait(10)
  # This thread's body ended first: the other still holds them off.
  assert gc.get_threshold() != before
  release.set()
  thread.join(10)
  assert gc.get_threshold() == before


def test_thresholds_a_user_sets_meanwhile_are_kept():
  before = gc.get_threshold()
  try:
    with full_collections_held_off():
      gc.set_threshold(5000, 20, 30)
    assert gc.get_threshold() == (5000, 20, 30)
  finally:
    gc.set_threshold(*before)


def _loss(w, x):
  block = rx.checkpoint(lambda w, x: jnp.sin(jnp.tanh(x @ w) @ w))
  return jnp.sum(block(w, x) ** 2)


def test_compare_holds_them_off_and_gives_them_back_even_when_it_raises():
  k1, k2 = jax.random.split(jax.random.key(7))
  args = jax.random.normal(k1, (16, 16)), jax.random.normal(k2, (4, 16))
  before = gc.get_threshold()
  during = []
  comparison = compare(_loss, *args, policies=['dots_saveable'], suggest_lowering=False,
                       progress=lambda *_: during.append(gc.get_threshold()))
  assert len(comparison.rows) == 3 and during
  assert all(t[:2] == before[:2] and t[2] > before[2] for t in during)
  assert gc.get_threshold() == before
  with pytest.raises(ValueError, match='not a policy'):
    compare(_loss, *args, policies=['dots_savable'])
  assert gc.get_threshold() == before
