"""The user's program and its remat blocks, checked before anything is
compiled.

Above ``policies``; everything that traces or compiles starts here.

* ``problem``: a function, its example arguments and options, checked, with
  its program traced and its blocks found (the cache key of every result).
* ``blocks``: the remat blocks of a program found, and their policies set.
* ``keywords``: the options each entry point takes, checked before tracing.
* ``devices``: which devices and mesh the program runs on.
* ``step``: the training step (the loss and its gradient) a policy's
  figures are taken from.
"""
