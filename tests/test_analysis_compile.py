"""The analysis compile: figures read from a compile that skips the backend's
optimization equal a full compile's, field by field; runs are timed on a
full compile."""

import concurrent.futures
import dataclasses
import os
import signal
import subprocess
import sys

import jax
import pytest

import remat_explorer as rx
from remat_explorer import examples
from remat_explorer.analysis import LOWERINGS, compile_costs
from remat_explorer.analysis.tradeoffs.compare import builtin_policies
from remat_explorer.analysis.xla.compiled import analysis_compiler_options
from remat_explorer.analysis.xla import kernel_cache
from remat_explorer.analysis.xla.kernel_cache import kernel_cache_options
from remat_explorer.analysis.context import compiles_run

# Small sizes: each case compiles the same step twice.
SIZES = {
    'mlp': dict(num_layers=3, width=32, batch=8),
    'transformer': dict(num_layers=2, d_model=32, num_heads=2, seq_len=16, batch=2),
    'transformer_scan': dict(num_layers=2, d_model=32, num_heads=2, seq_len=16,
                             batch=2, use_scan=True),
    'convnet': dict(num_blocks=2, channels=4, image_size=8, batch=2),
}
NAMES = {'mlp': examples.MLP_NAMES, 'transformer': examples.TRANSFORMER_NAMES,
         'transformer_scan': examples.TRANSFORMER_NAMES,
         'convnet': examples.CONVNET_NAMES}
# Everything but how long it took and how it was compiled.
_NOT_FIGURES = {'lower_seconds', 'compile_seconds', 'analysis_compile', 'notes'}


def _build(model, seed):
  builder = 'transformer' if model == 'transformer_scan' else model
  return examples.build(builder, seed=seed, **SIZES[model])


def _figures(costs):
  out = {f.name: getattr(costs, f.name) for f in dataclasses.fields(costs)
         if f.name not in _NOT_FIGURES}
  out['timeline'] = costs.timeline.to_dict()
  for buffer in out['timeline']['buffers']:
    _comparable(buffer)
  return out


def _comparable(buffer, part=False):
  """A timeline buffer without what is not a figure: the Python stack JAX
  recorded (it runs through the line that called compile_costs, another
  for each compile) and, for what a loop's body holds, the names XLA
  numbers the body's fusions by."""
  buffer.pop('frames')
  if part:
    buffer.pop('name')
  for p in buffer['parts']:
    _comparable(p, part=True)


def _cases():
  # A representative set: bench/analysis.py checks every example model x
  # built-in policy x lowering.
  yield 'mlp', 'everything_saveable', None
  yield 'transformer_scan', 'nothing_saveable', None
  yield 'transformer_scan', 'dots_saveable', 'cond'
  yield 'convnet', 'dots_with_no_batch_dims_saveable', None
  for lowering in LOWERINGS:
    yield 'transformer', 'nothing_saveable', lowering


@pytest.mark.skipif(analysis_compiler_options(jax.devices()[0].platform) is None,
                    reason='this platform compiles in full for the figures too')
@pytest.mark.parametrize('model,policy,lowering', list(_cases()),
                         ids=lambda v: str(v))
def test_analysis_compile_gives_a_full_compiles_figures(model, policy, lowering):
  loss, args = _build(model, seed=len(policy) + len(model))
  chosen = builtin_policies(NAMES[model])[policy]
  analysed = compile_costs(loss, *args, policy=chosen, lowering=lowering)
  # XLA's default level, whatever XLA_FLAGS says (the suite's sets 0).
  full = compile_costs(loss, *args, policy=chosen, lowering=lowering,
                       compiler_options={'xla_backend_optimization_level': 3})
  assert analysed.analysis_compile and not full.analysis_compile
  assert not analysed.failed and not full.failed
  assert _figures(analysed) == _figures(full)
  assert analysed.buffer_assignment_proto == full.buffer_assignment_proto
  assert analysed.memory_analysis == full.memory_analysis
  assert analysed.cost_analysis == full.cost_analysis


def test_runs_are_timed_on_a_full_compile():
  loss, args = _build('mlp', seed=3)
  figures_only = compile_costs(loss, *args, policy=None, lowering='cond')
  before = compiles_run()
  timed = compile_costs(loss, *args, policy=None, lowering='cond', repeats=2)
  # One more compile, the full one that runs; the figures stay the cached
  # analysis compile's (equal to a full compile's, as checked above).
  assert compiles_run() == before + 1
  assert timed.run_seconds is not None and timed.run_seconds > 0
  assert _figures(dataclasses.replace(timed, run_seconds=None,
                                      measured_peak_bytes=None)) == _figures(figures_only)
  # Asked with runs from the start, the only compile is a full one.
  loss2, args2 = _build('mlp', seed=4)
  before = compiles_run()
  direct = compile_costs(loss2, *args2, repeats=1)
  assert compiles_run() == before + 1
  assert not direct.analysis_compile and direct.run_seconds is not None


def test_the_options_given_are_a_copy():
  options = analysis_compiler_options('cpu')
  options['xla_backend_optimization_level'] = 3
  assert analysis_compiler_options('cpu') == {'xla_backend_optimization_level': 0}


def test_a_compile_only_gpu_reuses_its_kernels_and_gives_a_full_compiles_figures(
    monkeypatch, tmp_path):
  """On a compile-only H100 an analysis compile hands XLA this thread's
  kernel cache (``kernel_cache.py``): each policy's compile adds to it only
  the kernels the policies before did not make, and every figure equals
  that of a compile made without it."""
  # A cache of this test's own, which no earlier compile has filled.
  monkeypatch.setitem(kernel_cache._directory, os.getpid(), str(tmp_path))
  loss, args = _build('transformer_scan', seed=5)
  args = rx.on_target(args, rx.target_mesh('h100'))
  cache = kernel_cache_options()['xla_gpu_kernel_cache_file']
  assert not os.path.exists(cache)
  policies = builtin_policies(NAMES['transformer_scan'])
  grown = []
  # Two policies whose kernels differ most: one recomputes every value the
  # backward pass reads, the other saves every one.
  for policy in ('nothing_saveable', 'everything_saveable'):
    before = os.path.getsize(cache) if os.path.exists(cache) else 0
    analysed = compile_costs(loss, *args, policy=policies[policy])
    grown.append(os.path.getsize(cache) - before)
    full = compile_costs(loss, *args, policy=policies[policy], compiler_options={})
    assert analysed.analysis_compile and not full.analysis_compile
    assert not analysed.failed and not full.failed and analysed.platform == 'gpu'
    assert _figures(analysed) == _figures(full)
    assert analysed.buffer_assignment_proto == full.buffer_assignment_proto
    assert analysed.memory_analysis == full.memory_analysis
  assert 0 < grown[1] < grown[0], grown
  # XLA rewrites the file unlocked: compiles on other threads (a
  # comparison's workers) write files of their own.
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    others = {pool.submit(kernel_cache_options).result()['xla_gpu_kernel_cache_file']
              for _ in range(2)}
  assert cache not in others


# A process that makes its kernel directory, says where, and lives until its
# input ends.
_MAKES_ITS_KERNEL_DIRECTORY = """
import os, sys
from remat_explorer.analysis.xla.kernel_cache import kernel_cache_options
print(os.path.dirname(kernel_cache_options()['xla_gpu_kernel_cache_file']), flush=True)
sys.stdin.read()
"""


def test_a_kernel_directory_left_by_a_killed_process_is_removed_by_the_next(tmp_path):
  """A process killed before its exit handlers run (a notebook kernel shut
  down at once) leaves its kernel directory; the next process to make one
  removes it, and leaves that of a process still alive."""
  def start():
    return subprocess.Popen([sys.executable, '-c', _MAKES_ITS_KERNEL_DIRECTORY],
                            env={**os.environ, 'TMPDIR': str(tmp_path)}, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  killed, alive = start(), start()
  killed_directory, alive_directory = killed.stdout.readline().strip(), alive.stdout.readline().strip()
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  assert os.path.isdir(killed_directory)  # no exit handler ran
  next_one = start()
  next_directory, _ = next_one.communicate('')
  assert not os.path.exists(killed_directory)
  assert os.path.isdir(alive_directory)
  assert not os.path.exists(next_directory.strip())  # removed at its exit
  alive.communicate('')
  assert not os.listdir(tmp_path)


# A process with a persistent compilation cache of its own: the explorer's
# compile of one step for a TPU topology and for an H100, then the same
# TPU step by hand; the cache's entries are counted after each.
_COMPILES_FOR_TARGETS_WITH_A_CACHE = """
import os, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import remat_explorer as rx

def loss(w, x):
  layer = rx.checkpoint(lambda h: jnp.tanh(h @ w))
  return jnp.sum(layer(layer(x)))

cache = os.environ['JAX_COMPILATION_CACHE_DIR']
args = {}
for target in ('v5e:2x2', 'h100'):
  on = NamedSharding(rx.target_mesh(target), P())
  args[target] = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=on)
                  for shape in ((64, 64), (8, 64))]
  costs = rx.compile_costs(loss, *args[target])
  print(target, costs.platform, costs.peak_bytes > 0, len(os.listdir(cache)), flush=True)
jax.jit(jax.value_and_grad(loss)).lower(*args['v5e:2x2']).compile()
print('by hand', len(os.listdir(cache)), flush=True)
"""


def test_a_compile_for_a_compile_only_device_writes_nothing_to_jaxs_cache(tmp_path):
  """An executable compiled for a target's compile-only devices cannot be
  loaded back from JAX's persistent compilation cache (JAX warns and
  compiles again; an H100's key names its process's kernel file, so it is
  never even found): the explorer's compiles for them leave a user's cache
  as it was, where the same compile by hand writes its entry."""
  cache = tmp_path / 'cache'
  env = {**os.environ, 'JAX_COMPILATION_CACHE_DIR': str(cache),
         'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
         'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}
  done = subprocess.run([sys.executable, '-c', _COMPILES_FOR_TARGETS_WITH_A_CACHE], env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split('\n')[:3] == ['v5e:2x2 tpu True 0', 'h100 gpu True 0', 'by hand 1']
