"""Our own remat: a drop-in ``jax.checkpoint`` built on the ``checkpoint`` primitive.

Modules, in the order a reader might take them:

* ``policies``   - which values a checkpointed block may save.
* ``split``      - the known/staged split of a block under a policy.
* ``refs``       - mutable refs in blocks: private ones, and ``ref_effects``.
* ``primitive``  - the ``checkpoint`` primitive and its transformation rules.
* ``observe``    - what differentiation did to each block, recorded for the
  analysis while ``observe_splits()`` is active.
* ``lowering``   - how a differentiated block is protected from XLA.
* ``api``        - ``checkpoint`` / ``remat`` / ``checkpoint_name``.
* ``signatures`` - what a user's function takes by keyword, read before tracing.
* ``residuals``  - ``saved_residuals``: what the forward pass keeps, in words.
* ``scan_plans`` - schedules for long scans, and what each should cost.
* ``revolve``    - Griewank's binomial (revolve) rules as a state machine.
* ``revolve_scan`` - the binomial schedule as one loop with its own VJP.
* ``scan``       - ``checkpointed_scan``: ``lax.scan`` under such a schedule.
* ``devices``    - compile-only devices: accelerators the machine lacks, and
  where the partitioner's propagation places a program's results on them.
* ``introspect`` - what readers of the engine's programs need: JAX's remat
  and call primitives, checkpoint names, the scopes the engine writes into
  name stacks and their parsers.
* ``_jax_internals`` - the only module that imports JAX's private API.
"""

from remat_explorer.engine.api import checkpoint, checkpoint_name, remat
from remat_explorer.engine.introspect import (
    CHECKPOINT_LOWERING_SCOPE, RECOMPUTE_GUARD_SCOPE, ENGINE_SCOPES, is_engine_scope,
    branch_runs, branch_runs_scope, RECOMPUTE_SCOPE, ScanScope, closed_call_p,
    debug_info_of, hlo_text_flops, in_backward_pass, in_recompute, recomputes_primal,
    jax_checkpoint_p, TRANSPOSE_SCOPE,
    name_of_named_value, parse_scan_scope,
    reduce_precision_p, scan_consts_and_carries, scan_scope)
from remat_explorer.engine.devices import (
    compile_only_cuda_devices, compile_only_tpu_devices, cuda_plugin_installed,
    gpu_target_config_of, initialize_backends_quietly, is_compile_only,
    no_persistent_cache_writes, propagated_result_shardings, tpu_support_installed)
from remat_explorer.engine.lowering import (DEFAULT_STRATEGY, STRATEGIES, check_strategy,
                                            current_strategy, enclosing_strategy,
                                            lowering_strategy)
from remat_explorer.engine.policies import (
    DotsSaveable, OffloadDotWithNoBatchDims, Offloadable, Recompute, SaveAndOffloadOnlyTheseNames,
    SaveAnyNamesButThese, SaveAnythingExceptTheseNames, Saveable, SaveFromBothPolicies,
    SaveOnlyTheseNames, checkpoint_policies)
from remat_explorer.engine.refs import DEFAULT_REF_EFFECTS
from remat_explorer.engine.observe import SplitRecord, observe_splits
from remat_explorer.engine.primitive import checkpoint_p
from remat_explorer.engine.residuals import (ResidualOrigin, print_saved_residuals,
                                             residual_origins, rounded_residuals,
                                             saved_residuals)
from remat_explorer.engine.scan import checkpointed_scan
from remat_explorer.engine.signatures import keyword_parameters
from remat_explorer.engine.scan_plans import ScanScheduleCosts, scan_schedule_costs
from remat_explorer.engine.split import Split, split_jaxpr

__all__ = [
    'checkpoint', 'remat', 'checkpoint_name', 'checkpoint_policies',
    'saved_residuals', 'print_saved_residuals', 'checkpoint_p',
    'split_jaxpr', 'Split', 'lowering_strategy', 'Saveable', 'Recompute', 'Offloadable',
    'observe_splits', 'SplitRecord', 'residual_origins', 'ResidualOrigin', 'rounded_residuals',
    'checkpointed_scan', 'scan_schedule_costs', 'ScanScheduleCosts',
    # Read by the analysis: lowering strategies, ref effects, policy classes.
    'STRATEGIES', 'DEFAULT_STRATEGY', 'check_strategy', 'current_strategy',
    'enclosing_strategy', 'DEFAULT_REF_EFFECTS', 'DotsSaveable', 'SaveOnlyTheseNames',
    'SaveAnyNamesButThese', 'SaveAnythingExceptTheseNames', 'SaveFromBothPolicies',
    'SaveAndOffloadOnlyTheseNames', 'OffloadDotWithNoBatchDims',
    # introspect
    'jax_checkpoint_p', 'closed_call_p', 'reduce_precision_p', 'name_of_named_value',
    'scan_consts_and_carries', 'debug_info_of', 'RECOMPUTE_SCOPE', 'CHECKPOINT_LOWERING_SCOPE', 'RECOMPUTE_GUARD_SCOPE',
    'ENGINE_SCOPES', 'is_engine_scope', 'branch_runs', 'branch_runs_scope',
    'in_recompute', 'in_backward_pass', 'TRANSPOSE_SCOPE', 'recomputes_primal', 'hlo_text_flops', 'ScanScope', 'scan_scope',
    'parse_scan_scope',
    # devices
    'compile_only_tpu_devices', 'compile_only_cuda_devices', 'cuda_plugin_installed',
    'tpu_support_installed', 'gpu_target_config_of', 'initialize_backends_quietly',
    'is_compile_only', 'no_persistent_cache_writes', 'propagated_result_shardings',
    # signatures
    'keyword_parameters',
]
