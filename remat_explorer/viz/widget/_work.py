"""Background computations whose results reach widgets on the main thread.

Widgets are changed only on the thread that runs the kernel's event loop
(the one that handles the front end's messages and runs cells), never from
a worker: two threads changing the same widget race, and a change made from
a worker runs its observers there too (a selected policy would re-render
every view from the worker). So a worker only computes (compiles, renders
figures, builds HTML); what it produces is queued and applied on the main
thread, by the kernel's IOLoop (``add_callback`` is safe from any thread)
or, when the main thread waits (``Work.wait``) or there is no kernel (a
script, a test), by the waiting thread itself.

Work started by applied results (a search selects its policy, which starts
a compile) is counted before the work that started it is counted done, so
``wait`` returns only once nothing is left.

Superseded work is not done. Work of a *group* (the costs view's compile,
the comparison) runs one at a time: while one runs, a newer request waits,
and a still newer one replaces it, so that a user stepping through five
policies compiles the first and the last, not five. A request equal to the
running or waiting one (its *key*: a double click) joins it instead of
queueing a copy. A compile under way cannot be interrupted (XLA offers no
way); ``stop`` drops what waits and the results of what runs. A process
that ends (a script's last line) first lets the compiles under way finish:
XLA aborts the process when the interpreter is torn down under one.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable


_workers: 'weakref.WeakSet[threading.Thread]' = weakref.WeakSet()
"""Every worker thread still alive (daemons: the kernel may stop any time)."""


@atexit.register
def _let_compiles_finish() -> None:
  for thread in list(_workers):
    thread.join()


@dataclass
class Task:
  """What one piece of background work says about itself."""
  label: str
  done: int | None = None
  total: int | None = None
  """Steps done and in all, where they are known up front; else None."""
  step: str = ''
  """What it is doing now, e.g. the policy it compiles."""
  waiting: bool = False
  """Queued behind its group's running task."""


def _kernel_loop():
  """The running kernel's IOLoop, when there is one and this is its thread."""
  try:
    from IPython import get_ipython
  except ImportError:
    return None
  kernel = getattr(get_ipython(), 'kernel', None)
  loop = getattr(kernel, 'io_loop', None)
  return loop if threading.current_thread() is threading.main_thread() else None


class Work:
  """Runs `compute` on worker threads and `apply` on the main thread.

  `on_tasks(tasks)` (main thread) hears whenever the running tasks change;
  `on_error(exception)` (main thread) whatever a computation or an apply
  raised. `context()` is entered around each computation (the caller's
  mesh and lowering settings).
  """

  def __init__(self, *, on_tasks: Callable[[list[Task]], None],
               on_error: Callable[[Exception], None],
               context: Callable[[], Any] = contextlib.nullcontext):
    self._on_tasks, self._on_error, self._context = on_tasks, on_error, context
    self._loop = _kernel_loop()
    self._main = threading.current_thread()
    self._queue: collections.deque[Callable[[], None]] = collections.deque()
    self._changed = threading.Condition()
    self.tasks: dict[int, Task] = {}
    """Running and waiting tasks by id; changed on the main thread only."""
    self._groups: dict[str, _Group] = {}
    self._stopped = False

  def start(self, label: str, compute: Callable[[Callable], Any],
            apply: Callable[[Any], None],
            failed: Callable[[Exception], None] | None = None, *,
            group: str | None = None, key: Hashable = None) -> None:
    """Start `compute(progress)` on a worker; `apply(result)` follows on the
    main thread, or `failed(exception)` (default: `on_error`) if it raised.
    `progress(done, total, step)` updates the task's status (total None
    where the number of steps is not known). With a `group`, it waits for
    the group's running task and replaces the group's waiting one; a `key`
    equal to theirs joins that task (its result goes to this `apply`)."""
    if self._stopped:
      return
    job = _Job(label, compute, apply, failed or self._on_error, key)
    if group is None:
      self._launch(job)
      return
    queue = self._groups.setdefault(group, _Group())
    for same in (queue.running, queue.waiting):
      if same is not None and key is not None and same.key == key:
        same.apply, same.failed = job.apply, job.failed
        return
    if queue.running is None:
      queue.running = job
      self._launch(job, group)
      return
    if queue.waiting is not None:  # superseded before it ever ran
      self._drop(queue.waiting.id)
    queue.waiting = job
    with self._changed:
      self.tasks[job.id] = Task(label, waiting=True)
    self._on_tasks(self.running())

  def stop(self) -> None:
    """Drop waiting work and the results of running work (their threads
    end when their compiles do); on the main thread."""
    self._stopped = True
    self._groups.clear()
    with self._changed:
      self.tasks.clear()
      self._queue.clear()
      self._changed.notify_all()
    self._on_tasks(self.running())

  def _launch(self, job: '_Job', group: str | None = None) -> None:
    with self._changed:
      self.tasks[job.id] = Task(job.label)
    self._on_tasks(self.running())

    def progress(done, total, step):
      self.post(lambda: self._set_task(job.id, Task(job.label, done, total, step)))

    def run():
      try:
        with self._context():
          result = job.compute(progress)
      except Exception as e:  # shown in the widget
        # `e` itself is unbound once the except clause ends; the callback
        # runs later, so it keeps its own reference.
        error = e
        self.post(lambda: job.failed(error))
      else:
        # The apply is read when it runs: a request that joined this job
        # has replaced it by then.
        self.post(lambda: job.apply(result))
      finally:
        self.post(lambda: self._finish(job.id, group))
    thread = threading.Thread(target=run, daemon=True, name=f'remat-explorer: {job.label}')
    _workers.add(thread)
    thread.start()

  def running(self) -> list[Task]:
    return list(self.tasks.values())

  def post(self, callback: Callable[[], None]) -> None:
    """Queue `callback` for the main thread (from any thread)."""
    with self._changed:
      if self._stopped:
        return
      self._queue.append(callback)
      self._changed.notify_all()
    if self._loop is not None:
      self._loop.add_callback(self.drain)

  def drain(self) -> None:
    """Run the queued callbacks; on the main thread only."""
    if threading.current_thread() is not self._main:
      return
    while True:
      with self._changed:
        if not self._queue:
          return
        callback = self._queue.popleft()
      try:
        callback()
      except Exception as e:
        self._on_error(e)

  def wait(self, timeout: float | None = None) -> None:
    """Block until all work is done and applied, including work that
    applied results started; `timeout` (seconds) bounds the whole wait and
    raises ``TimeoutError`` naming what still runs."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      self.drain()
      with self._changed:
        if not self.tasks and not self._queue:
          return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
          raise TimeoutError(f'still running after {timeout} s: '
                             + ', '.join(t.label for t in self.tasks.values()))
        if not self._queue:
          # A worker notifies when it queues something; the bound keeps a
          # wait from another thread than the main one (which cannot
          # drain) polling the task list.
          self._changed.wait(0.5 if left is None else min(left, 0.5))

  def _set_task(self, task_id: int, task: Task) -> None:
    if task_id in self.tasks:
      self.tasks[task_id] = task
      self._on_tasks(self.running())

  def _finish(self, task_id: int, group: str | None) -> None:
    queue = self._groups.get(group)
    if queue is not None:  # the group's waiting job runs next
      queue.running, queue.waiting = queue.waiting, None
      if queue.running is not None:
        self._launch(queue.running, group)
    self._drop(task_id)

  def _drop(self, task_id: int) -> None:
    with self._changed:
      self.tasks.pop(task_id, None)
      self._changed.notify_all()
    self._on_tasks(self.running())


_job_ids = itertools.count()


@dataclass(eq=False)
class _Job:
  label: str
  compute: Callable[[Callable], Any]
  apply: Callable[[Any], None]
  failed: Callable[[Exception], None]
  key: Hashable
  id: int = field(default_factory=lambda: next(_job_ids))


@dataclass
class _Group:
  running: _Job | None = None
  waiting: _Job | None = None
