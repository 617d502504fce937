"""The one door to PyTorch's private DTensor internals.

Every private upstream symbol this package uses (``torch.distributed.tensor._*``,
``DTensor._op_dispatcher`` and the propagator's registry dicts, ``_local_tensor``,
``torch._meta_registrations``, DCP planner helpers, private methods of placements) is reached
through this package and nowhere else (``tests/test_upstream_boundary.py`` fails otherwise).
A torch release that renames something is then fixed here, in one version-keyed shim, and
``tests/test_upstream_contract.py`` names the broken symbol in one readable failure.

Modules, each with one job:

- :mod:`.version`: the running torch version and the tested range.
- :mod:`.types`: spec / schema / strategy classes and the single-dim placeholder.
- :mod:`.strategy`: expand single-dim rows to a mesh (with a strategy filter), upstream's search
  over them, min-cost choice.
- :mod:`.registries`: the propagator's registry dicts, custom handlers, cache clearing.
- :mod:`.cache_miss`: DTensor's sharding-cache-miss callback, shadowed; its arguments read by name.
- :mod:`.tensors`: a DTensor's local tensor and spec, local shapes/offsets/strides, simulated ranks.
- :mod:`.collectives`: single-mesh-dim placement transitions and their cost estimate.
- :mod:`.meta`: fake tensors and meta kernels (``_grouped_mm``'s output, ``prims.fma``).
- :mod:`.checkpoint`: DCP's planner helpers (reached at the user's import of DCP, never imported here).
- :mod:`.planner`: upstream's redistribute planner, for the side-by-side benchmark (not re-exported).
- :mod:`.mask`: upstream's masked-partial placement and ours (lookups into a sharded table).
- :mod:`.tracing`: symbolic tracing's symbol records (a proxy cycle under ``torch.compile``).
- :mod:`.static_shards`: compiled DTensor code with 0 or 1 rows on a rank (an unguarded global size,
  a size fixed in the backward).
- :mod:`.hinted_costs`: upstream's strategy pricing on size hints under symbolic shapes (compile time).
- :mod:`.measured`: ours vs upstream measured per torch release; which rule ``install()`` keeps.
- :mod:`.contract`: the list of upstream symbols and signatures all of the above rely on.
"""

from dtensor_rules._upstream.version import TESTED_TORCH, TORCH_VERSION, torch_version
from dtensor_rules._upstream.types import (
    DecompShardingStrategy,
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    RuntimeSchemaInfo,
    ShardOrderEntry,
    ShardingPlaceholder,
    SingleDimStrategyInfo,
    StridedShard,
    TensorMeta,
    TupleStrategy,
)
from dtensor_rules._upstream.strategy import (
    dijkstra_single_dim_rule,
    expand_single_dim_rule,
    expand_to_mesh,
    is_tensor_shardable,
    num_tensor_inputs,
    recording_strategy_counts,
    select_min_cost_strategy,
)
from dtensor_rules._upstream.registries import (
    HANDLERS,
    META_STEP_ATTR,
    SCHEMA_REGISTRIES,
    STRATEGY_REGISTRIES,
    clear_sharding_caches,
    custom_op_handlers,
    dispatch_propagated,
    dispatch_slow_path,
    dispatch_with_local_fix,
    input_targets,
    output_tensor_meta,
    redistribute_args_to,
    wrap_result,
    dispatcher,
    propagate,
    propagate_schema,
    propagator,
    registry,
    unwrap_to_op_info,
)
from dtensor_rules._upstream.cache_miss import (
    CacheMissArguments,
    CacheMissCall,
    cache_miss_wrapped,
    is_output_sharding,
    unwrap_cache_miss,
    wrap_cache_miss,
)
from dtensor_rules._upstream.tensors import (
    LocalTensor,
    LocalTensorMode,
    compute_local_shape_and_global_offset,
    compute_local_stride,
    enabled_local_tensor_mode,
    local_tensor,
    maybe_disable_local_tensor_mode,
    maybe_run_for_local_tensor,
    mesh_coordinate,
    num_devices_per_host,
    per_rank_copies,
    per_rank_run_hooks,
    rank_map,
    rank_tensors,
    set_spec,
    spec_of,
)
from dtensor_rules._upstream.collectives import (
    ALL_TO_ALL_SINGLE,
    SHARD_TO_PARTIAL_SUM_RUNS,
    flatten_mesh,
    funcol,
    one_step_redistribute_cost,
    partial_partition,
    partial_reduce,
    partial_reduce_scatter,
    redistribute_cost,
    shard_all_gather,
    shard_all_to_all,
    shard_from_replicate,
    swap_partial_partition,
)
from dtensor_rules._upstream.tracing import keep_first_symbol_record, restore_symbol_record
from dtensor_rules._upstream.hinted_costs import price_on_hints, price_symbolically
from dtensor_rules._upstream.mask import IndexMaskPartial, MaskPartial, assert_async
from dtensor_rules._upstream.measured import verdict as measured_verdict
from dtensor_rules._upstream.meta import (
    DynamicOutputShapeException,
    FAKE_TENSOR_LOGGER,
    META_FAILURE_MESSAGE,
    FakeTensor,
    FakeTensorMode,
    create_grouped_mm_output_tensor,
    ensure_prims_fma,
    on_prims_fma_defined,
    prims_fma_defined,
    unbacked_size,
)

__all__ = [name for name in dir() if not name.startswith("_")]
