"""Progress of ``compare`` and ``search_policy`` where their user looks.

Each compile of a step for a TPU pod takes tens of seconds, and a
comparison compiles one per policy: minutes in which a notebook cell or a
script would otherwise say nothing. Given no ``progress`` callback, each
says how far it is on one line that it rewrites: in a notebook, an output
updated in place (``IPython.display``'s display ids); in a terminal, a
line of standard error redrawn. The line shows once a call has run
``SHOWN_AFTER_SECONDS`` (a call that ends sooner shows nothing) and is
cleared when the call ends, so that a saved notebook keeps only its
results. Where no one would see it (output piped to a file, a test run)
nothing is written. ``progress=False`` says nothing anywhere.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time

SHOWN_AFTER_SECONDS = 2.0


def check_progress(progress) -> None:
  """A callback, None (shown where seen) or False (nothing), refused early."""
  if not (progress is None or progress is False or callable(progress)):
    raise TypeError('progress must be a function progress(done, total, label), None (a '
                    'line where you see the output) or False (nothing), got '
                    f'{type(progress).__name__} {progress!r}.')


@contextlib.contextmanager
def progress_shown(caller: str, progress):
  """The callback a call of `caller` (``compare``) reports to: `progress`
  as given, or a line where the user sees output (cleared when the block
  ends), or None."""
  if progress is not None:
    yield progress or None
    return
  line = _line(caller)
  if line is None:
    yield None
    return
  try:
    yield line.update
  finally:
    line.clear()


def _line(caller: str) -> '_Line | None':
  if _in_a_notebook():
    return _Line(caller, _NotebookOutput())
  stream = sys.stderr
  if stream is not None and getattr(stream, 'isatty', lambda: False)():
    return _Line(caller, _TerminalLine(stream))
  return None


def _in_a_notebook() -> bool:
  # Only where IPython is imported already: a kernel has it, a script need not.
  ipython = sys.modules.get('IPython')
  shell = ipython.get_ipython() if ipython is not None else None
  return shell is not None and getattr(shell, 'kernel', None) is not None


class _Line:
  """What `caller` says it has done, written to `out` once the call has run
  ``SHOWN_AFTER_SECONDS``."""

  def __init__(self, caller: str, out):
    self.caller, self.out = caller, out
    self.start = time.perf_counter()

  def update(self, done: int, total: int | None, label: str) -> None:
    seconds = time.perf_counter() - self.start
    if seconds < SHOWN_AFTER_SECONDS:
      return
    count = f'{done}/{total} · ' if total is not None else ''
    self.out.write(f'{self.caller}: {count}{label} · {seconds:.0f} s')

  def clear(self) -> None:
    self.out.clear()


class _NotebookOutput:
  """One output of the running cell, replaced at each update, emptied at
  the end (plain text: a label from the user's program is not markup)."""

  def __init__(self):
    self.handle = None

  def write(self, text: str) -> None:
    from IPython.display import display
    bundle = {'text/plain': text}
    if self.handle is None:
      self.handle = display(bundle, raw=True, display_id=True)
    else:
      self.handle.update(bundle, raw=True)

  def clear(self) -> None:
    if self.handle is not None:
      self.handle.update({'text/plain': ''}, raw=True)


class _TerminalLine:
  """One line of a terminal, redrawn at each update, erased at the end."""

  def __init__(self, stream):
    self.stream, self.width = stream, 0

  def write(self, text: str) -> None:
    # Cut to the terminal's width: a line that wrapped could not be redrawn.
    text = text[:shutil.get_terminal_size().columns - 1]
    self.stream.write('\r' + text.ljust(self.width))
    self.stream.flush()
    self.width = max(self.width, len(text))

  def clear(self) -> None:
    if self.width:
      self.stream.write('\r' + ' ' * self.width + '\r')
      self.stream.flush()
