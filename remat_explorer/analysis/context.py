"""Per-thread state of the analysis: the settings that change what a
program traces to, carried across threads, and the XLA compiles a thread ran.

JAX keeps the mesh set with ``jax.set_mesh`` per thread, and so does
``lowering_strategy``. Work that the analysis moves to another thread
(``compare``'s analyses, the Explorer's compiles) must see the settings of
the code that asked for it, or a sharded program fails to trace there, or a
block is lowered with another strategy.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import jax

from remat_explorer.engine import enclosing_strategy, lowering_strategy


@dataclass(frozen=True)
class TraceSettings:
  mesh: jax.sharding.Mesh | None
  lowering: str | None

  @classmethod
  def current(cls) -> 'TraceSettings':
    """The settings in effect on the calling thread."""
    mesh = jax.sharding.get_mesh()
    return cls(None if mesh.empty else mesh, enclosing_strategy())

  @contextlib.contextmanager
  def entered(self):
    """Run the body under these settings, on whatever thread."""
    with contextlib.ExitStack() as stack:
      if self.mesh is not None:
        stack.enter_context(jax.set_mesh(self.mesh))
      if self.lowering is not None:
        stack.enter_context(lowering_strategy(self.lowering))
      yield

  def wrap(self, fn):
    """`fn`, to be called under these settings."""
    def under_settings(*args, **kwargs):
      with self.entered():
        return fn(*args, **kwargs)
    return under_settings


_compiles = threading.local()


def note_compile() -> None:
  """Count one XLA compile run by the calling thread."""
  _compiles.count = compiles_run() + 1


def compiles_run() -> int:
  """XLA compiles the calling thread has run (failed ones too): the
  difference over a stretch of work is what that work really compiled,
  cached results costing nothing, and work on other threads not counted."""
  return getattr(_compiles, 'count', 0)
