"""remat_explorer: see what ``jax.checkpoint`` saves, recomputes, and costs.

The engine (our own remat primitive, a drop-in ``jax.checkpoint``), the
analysis entry points and the Explorer are re-exported here;
``remat_explorer.analysis`` and ``remat_explorer.viz`` hold the rest.
"""

from remat_explorer.engine import (Offloadable, Recompute, ScanScheduleCosts,
                                   Saveable, checkpoint, checkpoint_name,
                                   checkpoint_policies, checkpointed_scan,
                                   lowering_strategy, print_saved_residuals,
                                   remat, saved_residuals, scan_schedule_costs)
from remat_explorer.analysis import (analyze, clear_caches, compare, compile_costs,
                                     estimate_costs, live_at_peak, residuals_at_peak,
                                     search_policy, target_mesh, on_target, register_gpu_target,
                                     gpu_target_config)

__version__ = '0.1.0'

__all__ = [
    'checkpoint', 'remat', 'checkpoint_name', 'checkpoint_policies',
    'saved_residuals', 'print_saved_residuals', 'Saveable', 'Recompute',
    'Offloadable', 'lowering_strategy', 'checkpointed_scan',
    'scan_schedule_costs', 'ScanScheduleCosts', 'analyze', 'compile_costs',
    'estimate_costs', 'compare', 'search_policy', 'live_at_peak', 'residuals_at_peak', 'clear_caches', 'explore',
    'target_mesh', 'on_target', 'register_gpu_target', 'gpu_target_config',
    'Explorer',
]


def __getattr__(name):
  # The Explorer pulls in matplotlib, graphviz and ipywidgets: only on use.
  if name in ('explore', 'Explorer'):
    from remat_explorer import viz
    return getattr(viz, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
