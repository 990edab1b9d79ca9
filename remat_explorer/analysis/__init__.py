"""Analysis: a user function plus a policy, turned into plain data.

Planned (see the project's issues): the known/staged split from the engine's
``split_jaxpr``, residual accounting, and compiled costs from XLA's AOT API.
Nothing is exported yet.
"""
