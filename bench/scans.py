"""Scan benchmark: a long checkpointed loop against Equinox and diffrax.

The gradient of a neural ODE integrated by `n` Euler steps (a 16 x 64
float32 state, a 64 x 64 weight closed over by the step), under:

* ``lax.scan`` without remat, and the ``scan(jax.checkpoint(f))`` idiom;
* ``checkpointed_scan`` with ``'sqrt'`` and ``('binomial', s)``;
* Equinox's ``while_loop(kind='checkpointed', checkpoints=s)``;
* diffrax's ``diffeqsolve`` with ``RecursiveCheckpointAdjoint(checkpoints=s)``
  (the same Euler steps, as an ODE solve).

With ``--data``, the step also reads row ``i`` of a data set it closes
over, as a neural ODE over a data set is written: ``h + 0.05 tanh((h +
D[i]) W)``, `D` a concrete ``(n, 32, 128)`` float32 array (4,096 x 32 x 128
is 64 MiB), the state 32 x 128 and `i` carried beside it. The data is a
constant of the program: where the step is traced into several loops, XLA
may copy it into each.

Each row runs in its own process (so the compile's memory is its own) and
reports: compile time, the process's peak memory growth while compiling
(``ru_maxrss``), XLA's temp bytes, the step evaluations one gradient makes
(counted at run time by a callback in the step, in a second compile), the
median run time, and the gradient's largest relative error against
``lax.scan``'s. The table's last columns are ratios against Equinox's
checkpointed loop with the same `s`, measured in the same run: the targets
are compile <= 1.5x, temp <= 1.25x, evaluations <= 1x, run time <= 1.2x.

    .venv/bin/python bench/scans.py [--steps 256 1024 10000] [--checkpoints 4 8]
                                    [--repeats 5] [--json PATH] [--data]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BATCH, HIDDEN, RATE = 16, 64, 0.05

# Rows whose costs do not depend on `s` run once per n.
PLAIN = ('lax.scan (no remat)', 'scan(jax.checkpoint(f))', 'ours: sqrt')
PER_S = ('ours: binomial', 'equinox checkpointed', 'diffrax recursive checkpoint')


# -- one row, in its own process ------------------------------------------------

def _sizes(data: bool) -> tuple[int, int]:
  return (32, 128) if data else (BATCH, HIDDEN)


def _gradient_function(method: str, n: int, s: int, count=None, data=None):
  """``grad`` of the loss w.r.t. (weight, initial state) under `method`;
  `count` (a callable) is called once per step evaluation when given;
  `data` (an ``(n, batch, hidden)`` array), read a row per step."""
  import jax
  import jax.numpy as jnp
  from jax import lax

  def vector_field(h, w):
    if count is not None:
      jax.debug.callback(lambda _: count(), h[0, 0])
    return jnp.tanh(h @ w)

  def loss(w, h0):
    if data is None:
      def step(h, _):
        return h + RATE * vector_field(h, w), None
    else:  # the carry is (i, h): the step reads row i of the data it closes over
      def step(carry, _):
        i, h = carry
        return (i + 1, h + RATE * vector_field(h + data[i], w)), None
      h0 = (0, h0)

    if method == 'lax.scan (no remat)':
      h, _ = lax.scan(step, h0, length=n)
    elif method == 'scan(jax.checkpoint(f))':
      h, _ = lax.scan(jax.checkpoint(step), h0, length=n)
    elif method.startswith('ours'):
      import remat_explorer as rx
      schedule = 'sqrt' if method == 'ours: sqrt' else ('binomial', s)
      h, _ = rx.checkpointed_scan(step, h0, length=n, schedule=schedule)
    elif method == 'equinox checkpointed':
      import equinox.internal as eqxi
      _, h = eqxi.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, step(c[1], None)[0]),
                             (0, h0), max_steps=n, kind='checkpointed', checkpoints=s)
    elif method == 'diffrax recursive checkpoint' and data is not None:
      raise ValueError('the diffrax row has no --data form')
    elif method == 'diffrax recursive checkpoint':
      import diffrax
      solution = diffrax.diffeqsolve(
          diffrax.ODETerm(lambda t, y, w: RATE * vector_field(y, w)), diffrax.Euler(),
          t0=0.0, t1=float(n), dt0=1.0, y0=h0, args=w, max_steps=n,
          saveat=diffrax.SaveAt(t1=True),
          adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=s))
      h = solution.ys[-1]
    else:
      raise ValueError(method)
    h = h if data is None else h[1]
    return jnp.mean(h ** 2)

  return jax.jit(jax.grad(loss, argnums=(0, 1)))


def measure_one(method: str, n: int, s: int, repeats: int, with_data: bool = False) -> dict:
  import jax
  import numpy as np

  rng = np.random.default_rng(0)
  batch, hidden = _sizes(with_data)
  w = jax.numpy.asarray(rng.standard_normal((hidden, hidden)) / hidden ** 0.5, 'float32')
  h0 = jax.numpy.asarray(rng.standard_normal((batch, hidden)), 'float32')
  data = (jax.numpy.asarray(rng.standard_normal((n, batch, hidden)), 'float32')
          if with_data else None)
  grad = _gradient_function(method, n, s, data=data)

  lowered = grad.lower(w, h0)
  rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  start = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  compile_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
  temp = compiled.memory_analysis().temp_size_in_bytes

  result = jax.block_until_ready(compiled(w, h0))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(w, h0))
    times.append(time.perf_counter() - start)

  evaluations = [0]

  def count():
    evaluations[0] += 1

  jax.block_until_ready(_gradient_function(method, n, s, count, data)(w, h0))
  jax.effects_barrier()
  reference = _gradient_function('lax.scan (no remat)', n, s, data=data)(w, h0)
  error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))
                    / (np.max(np.abs(np.asarray(b))) or 1.0))
              for a, b in zip(result, reference))
  return dict(method=method, n=n, s=s, data=with_data, compile_s=compile_s, compile_rss_mib=compile_rss / 1024,
              temp_bytes=temp, evaluations=evaluations[0],
              run_s=statistics.median(times) if times else None, grad_error=error,
              jax=jax.__version__, device=jax.devices()[0].device_kind)


# -- the table ------------------------------------------------------------------------

def run_row(method, n, s, repeats, timeout, data=False):
  command = [sys.executable, __file__, '--one', method, '--steps', str(n),
             '--checkpoints', str(s), '--repeats', str(repeats)] + (['--data'] if data else [])
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
  except subprocess.TimeoutExpired:
    return dict(method=method, n=n, s=s, error=f'over {timeout} s')
  if done.returncode != 0:
    last = (done.stderr.strip().splitlines() or ['no output'])[-1]
    return dict(method=method, n=n, s=s, error=last[:120])
  return json.loads(done.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, nargs='+', default=[256, 1024, 10_000])
  parser.add_argument('--checkpoints', type=int, nargs='+', default=[4, 8])
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--timeout', type=int, default=600, help='seconds per row')
  parser.add_argument('--json', type=Path, help='write every row here')
  parser.add_argument('--data', action='store_true',
                      help='the step reads a row of an (n, 32, 128) data set it closes over')
  parser.add_argument('--one', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.one:
    print(json.dumps(measure_one(args.one, args.steps[0], args.checkpoints[0], args.repeats,
                                 args.data)))
    return

  import remat_explorer as rx
  results = []
  header = (f'{"row":<30} {"n":>6} {"s":>2} {"compile s":>9} {"compile MiB":>11} '
            f'{"temp MiB":>9} {"evals":>7} {"predicted":>9} {"run ms":>8} {"grad err":>8}'
            f' | {"× equinox: compile":>18} {"temp":>5} {"evals":>5} {"run":>5}')
  print(header)
  for n in args.steps:
    for s_index, s in enumerate(args.checkpoints):
      methods = (PLAIN if s_index == 0 else ()) + PER_S
      if args.data:  # diffrax's ODE term has no step counter to read the data by
        methods = tuple(m for m in methods if not m.startswith('diffrax'))
      rows = [run_row(m, n, s, args.repeats, args.timeout, args.data) for m in methods]
      equinox = next((r for r in rows if r['method'] == 'equinox checkpointed'
                      and 'error' not in r), None)
      for r in rows:
        results.append(r)
        plain = r['method'] in PLAIN
        label_s = '' if plain else str(s)
        if 'error' in r:
          print(f'{r["method"]:<30} {n:>6} {label_s:>2} failed: {r["error"]}')
          continue
        predicted = _predicted(rx, r['method'], n, s)
        ratios = ''
        if equinox is not None and not plain:
          ratios = (f' | {r["compile_s"] / equinox["compile_s"]:>18.2f} '
                    f'{r["temp_bytes"] / equinox["temp_bytes"]:>5.2f} '
                    f'{r["evaluations"] / equinox["evaluations"]:>5.2f} '
                    f'{r["run_s"] / equinox["run_s"]:>5.2f}')
        print(f'{r["method"]:<30} {n:>6} {label_s:>2} {r["compile_s"]:>9.2f} '
              f'{r["compile_rss_mib"]:>11.0f} {r["temp_bytes"] / 2**20:>9.2f} '
              f'{r["evaluations"]:>7} {predicted:>9} {r["run_s"] * 1e3:>8.1f} '
              f'{r["grad_error"]:>8.1e}{ratios}', flush=True)
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))


def _predicted(rx, method, n, s):
  """Step evaluations the closed form predicts, '' where it has none."""
  if method == 'lax.scan (no remat)':
    return n
  if method == 'scan(jax.checkpoint(f))':
    return rx.scan_schedule_costs(n, 'every').step_evaluations
  if method == 'ours: sqrt':
    return rx.scan_schedule_costs(n, 'sqrt').step_evaluations
  if method == 'ours: binomial':
    return rx.scan_schedule_costs(n, ('binomial', s)).step_evaluations
  return ''


if __name__ == '__main__':
  main()
