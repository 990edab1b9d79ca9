"""remat_explorer: see what ``jax.checkpoint`` saves, recomputes, and costs.

The engine (our own remat primitive, a drop-in ``jax.checkpoint``) is
re-exported here; ``remat_explorer.analysis`` and ``remat_explorer.viz``
build on it.
"""

from remat_explorer.engine import (Offloadable, Recompute, Saveable,
                                   checkpoint, checkpoint_name,
                                   checkpoint_policies, lowering_strategy,
                                   print_saved_residuals,
                                   remat, saved_residuals)

__version__ = '0.1.0'

__all__ = [
    'checkpoint', 'remat', 'checkpoint_name', 'checkpoint_policies',
    'saved_residuals', 'print_saved_residuals', 'Saveable', 'Recompute',
    'Offloadable', 'lowering_strategy',
]
