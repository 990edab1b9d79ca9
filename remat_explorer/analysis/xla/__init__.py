"""XLA's compiled program: what the device really runs and holds.

Above ``split``. ``hlo`` (with ``protowire``) is the one reader of XLA's
output; every other module here consumes what it reads.

* ``compiled``: ``compile_costs``, the training step compiled and measured.
* ``hlo``: the optimized module, its buffer assignment and its op metadata,
  read into typed objects; ``protowire`` decodes XLA's protos.
* ``hlo_provenance``: where a buffer's value was computed (the Python stack
  XLA keeps per instruction, looked through loops, fusions and copies).
* ``executed_flops``: the FLOPs executed, each loop body once per trip.
* ``liveness`` and ``timeline``: memory along the schedule.
* ``peak``: what is alive at the peak, in the user's terms.
* ``collectives``: the collectives of an SPMD program, and which remat
  re-runs.
"""
