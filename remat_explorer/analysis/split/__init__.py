"""The split differentiation makes: residuals, recompute and FLOPs, from
the jaxprs alone.

Above ``program``; nothing here compiles the training step (the partitioner
is asked for residual shardings only).

* ``analyze``: ``analyze(f, *args, policy=...) -> RematReport``.
* ``report``: the plain data it returns (residuals, blocks, recompute);
  ``recompute``: what the backward pass runs again for a block.
* ``flops``: FLOP counts of jaxprs, by XLA's conventions.
* ``estimate``: ``estimate_costs``, the training step's peak and FLOPs
  estimated from its jaxpr, before any compile.
* ``jaxpr_memory``: the liveness model of a jaxpr's memory it uses;
  ``operations``: the jaxpr's equations as that model reads them, calls
  inlined, in XLA's order; ``backend``: what a platform's XLA backend
  does to values that the jaxpr does not say (on the CPU: convolution
  layout copies, what its reductions do not fuse, cheap values repeated
  in their readers, every loop's state made first, values both passes
  read).
* ``graph``: the split of each block as a plain graph, for diagrams;
  ``grouping``: the group of each equation in the user's terms (module
  path, the user's functions, the library function they called);
  ``block_split``: where a block's values sit in its two jaxprs.
* ``sharding``: what each residual costs per device.
"""
