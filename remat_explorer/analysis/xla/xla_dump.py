"""XLA's buffer assignment of an accelerator's program, from a dump.

On the CPU, ``memory_analysis()`` carries the compiled program's buffer
assignment (``serialized_buffer_assignment_proto``); for TPUs and GPUs,
compile-only ones included, it is empty. XLA writes the same assignment
when asked to dump the module as a proto: the ``HloProto`` of the
optimized module holds the module and its buffer assignment together
(``*after_optimizations.hlo.pb``). So a compile for an accelerator dumps
into a temporary directory, and the reader takes the two from there.

JAX leaves the dump options out of its compilation cache's key; an
executable loaded from that cache is not compiled, and writes no dump.
Then the buffer assignment is unknown, and the timeline says so.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import weakref

from remat_explorer.analysis.xla import protowire as wire, xla_protos as pb


class XlaDump:
  """A directory XLA dumps one compile into, read once and removed."""

  def __init__(self):
    self.directory = tempfile.mkdtemp(prefix='remat_explorer_xla_')
    # Removed with this object, or at exit, where no read removed it (an
    # interrupted compile, a compile whose result nobody read).
    self._remove = weakref.finalize(self, shutil.rmtree, self.directory, True)

  def compiler_options(self) -> dict:
    return {'xla_dump_to': self.directory, 'xla_dump_hlo_as_proto': True}

  def read(self) -> tuple[bytes, bytes] | None:
    """(HloModuleProto, BufferAssignmentProto) of the optimized module, or
    None where XLA wrote none (a cached executable, a failed compile); the
    directory is removed either way."""
    try:
      found = [p for p in glob.glob(os.path.join(self.directory, '*after_optimizations.hlo.pb'))]
      if len(found) != 1:
        return None
      with open(found[0], 'rb') as f:
        data = f.read()
      parts = dict(wire.fields(data, wire.whole(data),
                               (pb.HloProto.HLO_MODULE, pb.HloProto.BUFFER_ASSIGNMENT)))
      if pb.HloProto.HLO_MODULE not in parts or pb.HloProto.BUFFER_ASSIGNMENT not in parts:
        return None
      module, assignment = parts[pb.HloProto.HLO_MODULE], parts[pb.HloProto.BUFFER_ASSIGNMENT]
      return data[module[0]:module[1]], data[assignment[0]:assignment[1]]
    finally:
      self.remove()

  def remove(self) -> None:
    self._remove()
