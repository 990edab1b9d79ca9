"""The README's quick start runs as a user pastes it: the same code as the
documentation site's front page, run in a fresh process from top to bottom."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start(page: Path) -> str:
  """The Python block under a page's "Quick start" heading."""
  found = re.search(r'^## Quick start\n\n```python\n(.*?)^```', page.read_text(), re.S | re.M)
  assert found, f'{page.name} has no quick start'
  return found.group(1)


def test_the_quick_start_runs_as_written(tmp_path):
  code = _quick_start(ROOT / 'README.md')
  assert code == _quick_start(ROOT / 'docs' / 'pages' / 'index.md')
  assert 'target_mesh("v5e:16x16"' in code  # a pod, as the README promises
  script = tmp_path / 'quick_start.py'
  script.write_text(code + "print('ran to the end')\n")
  done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.rstrip().endswith('ran to the end'), done.stdout[-2000:]
  assert 'Traceback' not in done.stderr, done.stderr[-3000:]
