"""shard_map inside and around our checkpoint, on 4 forced host devices.

The device count must be set before JAX starts, so the program runs in its
own process."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_shard_map_inside_and_around_checkpoint_matches_jax():
  result = subprocess.run([sys.executable, str(ROOT / 'tests' / 'sharded_program.py')],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={'PYTHONPATH': str(ROOT), 'PATH': '/usr/bin:/bin', 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == 'ok'
