"""XLA's compiled program: what the device really runs and holds.

Above ``split``. ``reader`` is the one reader of XLA's output; every other
module here consumes the ``CompiledProgram`` it returns.

* ``compiled``: ``compile_costs``, the training step compiled and measured;
  ``step_compile``: one step's compile under way, and its executable read
  into figures once XLA is done;
  ``costs``: the ``CompiledCosts`` it gives, as plain data; ``run_times``:
  the step run, timed, and the device's measured peak; ``kernel_cache``:
  the kernels a compile-only GPU's compiles share.
* ``reader``: ``read_compiled``, the one reader of an executable:
  ``hlo`` (the optimized module's text: instructions in schedule order,
  loops and their trip counts, op metadata), ``buffers`` (XLA's buffer
  assignment) and the stack table of ``hlo_provenance``, from the module's
  protos (``protowire`` decodes them, ``xla_protos`` names their fields);
  for TPUs and GPUs, whose executables carry no buffer assignment,
  ``xla_dump`` has XLA dump it with the module as it compiles, and
  ``heap_trace`` replays XLA's heap simulation from it, whose peak XLA
  reports for them.
* ``hlo_provenance``: where a buffer's value was computed (the Python stack
  XLA keeps per instruction, looked through loops, fusions and copies).
* ``executed_flops``: the FLOPs executed, each loop body once per trip.
* ``liveness`` and ``timeline``: memory along the schedule.
* ``peak``: what is alive at the peak, in the user's terms.
* ``collectives``: the collectives of an SPMD program, and which remat
  re-runs.
"""
