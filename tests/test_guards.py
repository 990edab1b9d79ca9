"""Results that must not be taken from the wrong place: the device's peak
from an earlier program, a report of another policy, a cache entry of an
object that is gone, readings kept past ``clear_caches``."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer.analysis.xla import run_times
from remat_explorer.analysis.source import origins

W = jnp.asarray(np.random.default_rng(5).standard_normal((6, 6)), jnp.float32)


def _loss(w):
  return jnp.sum(jnp.sin(rx.checkpoint(lambda v: jnp.tanh(v @ v) @ v)(w)))


def test_the_measured_peak_is_the_runs_own_or_unknown(monkeypatch):
  # A device's peak is the process's: JAX cannot reset it. Faked here, as
  # the CPU reports no memory statistics.
  readings = iter([5_000, 5_000, 5_000, 7_000])
  monkeypatch.setattr(run_times, 'device_peak_bytes', lambda device: next(readings))
  rx.clear_caches()
  below = rx.compile_costs(_loss, W, repeats=1)
  assert below.measured_peak_bytes is None
  assert any('measured peak unknown' in n and '5000 bytes' in n for n in below.notes)
  rx.clear_caches()
  raised = rx.compile_costs(_loss, W, repeats=1)
  assert raised.measured_peak_bytes == 7_000


def test_the_cpu_reports_no_measured_peak():
  if jax.devices()[0].memory_stats():
    pytest.skip('this device reports memory statistics')
  rx.clear_caches()
  assert rx.compile_costs(_loss, W, repeats=1).measured_peak_bytes is None


def test_live_at_peak_refuses_a_report_of_another_policy():
  saved = rx.analyze(_loss, W, policy='dots_saveable')
  costs = rx.compile_costs(_loss, W, policy='nothing_saveable')
  with pytest.raises(ValueError, match=r'report is of _loss under dots_saveable .*costs of '
                                       r'_loss under nothing_saveable'):
    rx.live_at_peak(saved, costs)
  with pytest.raises(ValueError, match='differ'):
    rx.residuals_at_peak(saved, costs)
  same = rx.analyze(_loss, W, policy='nothing_saveable')
  assert rx.live_at_peak(same, costs)


class _Config:
  """A held (not traced) argument that cannot be hashed."""
  __hash__ = None

  def __init__(self, layers):
    self.layers = layers


def _stacked(w, config):
  for _ in range(config.layers):
    w = jnp.sin(w @ w)
  return jnp.sum(w)


def test_a_cached_unhashable_held_value_stays_the_one_it_was():
  config = _Config(2)
  two = rx.analyze(_stacked, W, config, whole_function=True)
  alive = weakref.ref(config)
  del config
  gc.collect()
  # The cache key keeps the object, so its id cannot name another one.
  assert alive() is not None
  three = rx.analyze(_stacked, W, _Config(3), whole_function=True)
  assert three.forward_flops > two.forward_flops


def test_clear_caches_forgets_paths_read_from_programs(tmp_path, monkeypatch):
  report = rx.analyze(_loss, W)
  site = next(r.source for r in report.residuals if r.source)
  assert site.startswith('tests/test_guards.py:')
  assert origins._frames.cache_info().currsize > 0
  script = tmp_path / 'script.py'  # a file no import names
  assert origins.relative_path(str(script)) == str(script)
  monkeypatch.chdir(tmp_path)
  rx.clear_caches()
  assert origins._frames.cache_info().currsize == 0
  # Seen from its own folder, the file is named relative to it: the path
  # shown before was forgotten.
  assert origins.relative_path(str(script)) == 'script.py'
  # A module's line is named as its import names it, from anywhere.
  moved = next(r.source for r in rx.analyze(_loss, W).residuals if r.source)
  assert moved.startswith('tests/test_guards.py:')
