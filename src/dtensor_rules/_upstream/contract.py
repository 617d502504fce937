"""Every upstream symbol, signature and attribute the adapter relies on, as data.

``tests/test_upstream_contract.py`` checks each entry on the installed torch, one test per
entry, so an upstream rename fails one readable test naming the symbol and what changed.
``params`` lists keyword parameters a callable must accept; ``any_of`` means one of them
(a renamed keyword whose name the adapter reads at import).
"""

from __future__ import annotations

from typing import NamedTuple


class Requirement(NamedTuple):
    """``module.name`` must exist (and accept ``params`` / one of ``any_of`` if callable)."""

    module: str
    name: str
    params: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()  # attributes an instance or class must have
    why: str = ""


_T = "torch.distributed.tensor"
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(f"{_T}._dtensor_spec", "DTensorSpec", attrs=("mesh", "placements", "tensor_meta", "shard_order",
                "shallow_copy_with_tensor_meta"), why="specs of every strategy"),
    Requirement(f"{_T}._dtensor_spec", "TensorMeta", attrs=("shape", "stride", "dtype")),
    Requirement(f"{_T}._dtensor_spec", "ShardOrderEntry", why="device order of a layout"),
    Requirement(f"{_T}._op_schema", "OpSchema", attrs=("op", "args_schema", "kwargs_schema", "args_strategy",
                "kwargs_strategy")),
    Requirement(f"{_T}._op_schema", "OpSpec", attrs=("output_spec", "input_specs", "redistribute_cost")),
    Requirement(f"{_T}._op_schema", "OpStrategy", attrs=("strategies",)),
    Requirement(f"{_T}._op_schema", "TupleStrategy", attrs=("children",)),
    Requirement(f"{_T}._op_schema", "RuntimeSchemaInfo", params=("static_argnum", "static_kwargkey", "needs_pytree")),
    Requirement(f"{_T}._ops.single_dim_strategy", "_ShardingPlaceholder", params=("dim",)),
    Requirement(f"{_T}._ops.single_dim_strategy", "_SingleDimStrategyInfo", params=("func", "allow_uneven_sharding")),
    Requirement(f"{_T}._ops.single_dim_strategy", "_SingleDimStrategyInfo", params=("allow_unbacked_sharding",), why="dispatch.single_dim: the fallback expansion never guards on an unbacked size"),
    Requirement(f"{_T}._ops.single_dim_strategy", "_get_num_tensor_inputs"),
    Requirement(f"{_T}._ops.single_dim_strategy", "_expand_single_dim_strategy_to_mesh",
                params=("mesh", "op_schema", "strategy_info", "output_tensor_meta")),
    Requirement(f"{_T}._ops.single_dim_strategy", "_dijkstra_expand_single_dim_strategy_to_mesh",
                params=("mesh", "op_schema", "single_dim_strategy", "output_tensor_meta"),
                why="dijkstra_single_dim_rule: dispatch's search measured and tested against upstream's"),
    Requirement(f"{_T}._ops.utils", "expand_to_full_mesh_op_strategy",
                params=("mesh", "op_schema", "input_index", "inplace_op", "allow_uneven_sharding", "allow_unbacked_sharding"),
                any_of=("full_mesh_strategy_filter", "is_valid_strategy_cb"), why="expand_to_mesh"),
    Requirement(f"{_T}._ops.utils", "is_tensor_shardable"),
    Requirement(f"{_T}._ops.utils", "redistribute_cost", why="hinted_strategy_costs: the name the strategy expansion prices with"),
    Requirement("torch.fx.experimental.symbolic_shapes", "optimization_hint", params=("a", "fallback"), why="hinted_strategy_costs"),
    Requirement(f"{_T}._sharding_prop", "_select_min_cost_strategy"),
    Requirement(f"{_T}._sharding_prop", "ShardingPropagator", attrs=("op_strategy_funcs", "op_single_dim_strategy_funcs",
                "op_to_rules", "op_to_schema_info", "op_to_schema_info_for_single_dim_strategy", "propagate",
                "_propagate_tensor_meta_non_cached", "_propagate_tensor_meta_cached"), why="registry install/uninstall"),
    Requirement(f"{_T}._dispatch", "OpDispatcher", attrs=("sharding_propagator", "_custom_op_handlers",
                "unwrap_to_op_info", "_dispatch_get_local_results_slow_path", "wrap")),
    Requirement(f"{_T}._dispatch", "OpDispatcher", attrs=("_propagate_op_sharding_dispatch_slow_path",), why="bool masks of index.Tensor on a cache miss"),
    Requirement(f"{_T}._dispatch", "OpDispatcher", attrs=("redistribute_local_args",), why="dispatch_with_local_fix"),
    Requirement(f"{_T}._op_schema", "OutputSharding", attrs=("needs_redistribute", "redistribute_schema",
                "use_val_from_redistribute_schema"), why="dispatch_with_local_fix"),
    Requirement(f"{_T}", "DTensor", attrs=("_op_dispatcher", "_spec", "_local_tensor")),
    Requirement(f"{_T}.debug", "_clear_sharding_prop_cache"),
    Requirement("torch._C", "_clear_DTensor_sharding_propagator_cache", why="clear_sharding_caches without importing debug"),
    Requirement(f"{_T}._sharding_prop", "ShardingPropagator", attrs=("propagate_op_sharding",), why="clear_sharding_caches"),
    Requirement(f"{_T}._utils", "_compute_local_shape_and_global_offset"),
    Requirement(f"{_T}._utils", "compute_local_stride"),
    Requirement(f"{_T}._decompositions", "DecompShardingStrategy"),
    Requirement(f"{_T}._collective_utils", "one_step_redistribute_cost"),
    Requirement(f"{_T}._collective_utils", "redistribute_cost", why="op-strategy rules pricing their own strategies"),
    Requirement(f"{_T}.placement_types", "_StridedShard"),
    Requirement(f"{_T}.placement_types", "_MaskPartial", params=("reduce_op", "mask_buffer", "offset_shape", "offset_dim"),
                attrs=("offset_shape", "offset_dim", "mask_buffer"), why="masked-partial gather (mask.IndexMaskPartial)"),
    Requirement(f"{_T}._op_schema", "OpInfo", attrs=("schema", "flat_args_schema", "local_args", "local_kwargs",
                "output_sharding"), why="finish_masked_gather"),
    Requirement("torch", "_assert_async", why="gather's index range check without a host sync"),
    Requirement(f"{_T}.placement_types", "Shard", attrs=("_to_replicate_tensor", "_to_new_shard_dim",
                "_replicate_to_shard", "local_shard_size_and_offset"), why="executor steps"),
    Requirement(f"{_T}.placement_types", "Partial", attrs=("_reduce_value", "_reduce_shard_value",
                "_partition_value"), why="executor steps"),
    Requirement("torch.distributed.device_mesh", "DeviceMesh", attrs=("_sym_get_coordinate",)),
    Requirement("torch.distributed.device_mesh", "DeviceMesh", attrs=("_flatten",), why="expert_parallel ep_dims: the borrowed ep group"),
    Requirement("torch.distributed.device_mesh", "_mesh_resources", attrs=("num_devices_per_host",)),
    Requirement("torch.distributed._local_tensor", "LocalTensor"),
    Requirement("torch.distributed._local_tensor", "LocalTensor", attrs=("_local_tensors",), why="testing.local_shards"),
    Requirement("torch.distributed._local_tensor", "LocalTensorMode", attrs=("rank_map",), why="per_rank_copies"),
    Requirement("torch.distributed._local_tensor", "enabled_local_tensor_mode"),
    Requirement("torch.distributed._local_tensor", "rank_map"),
    Requirement("torch.distributed._local_tensor", "maybe_run_for_local_tensor"),
    Requirement("torch.distributed._local_tensor", "maybe_disable_local_tensor_mode", why="MoE.init_weights"),
    Requirement("torch.distributed._local_tensor", "_for_each_rank_run_func",
                why="simulated_mesh's per-rank generators: LocalTensorMode's per-rank loop"),
    Requirement("torch.distributed._local_tensor", "_map_to_rank_local_val", why="simulated_mesh's per-rank generators"),
    Requirement("torch.library", "register_torch_dispatch", why="on_local_tensor_mode: the EP ops run once per simulated world"),
    Requirement("torch.distributed._functional_collectives", "all_gather_single"),
    Requirement("torch.distributed._functional_collectives", "all_to_all_single"),
    Requirement("torch.distributed._functional_collectives", "reduce_scatter_single"),
    Requirement("torch.distributed._functional_collectives", "all_reduce"),
    Requirement("torch.distributed._functional_collectives", "all_to_all_single_autograd", why="ep.local"),
    Requirement("torch.library", "get_ctx", why="meta.unbacked_size (ep.all_to_all)"),
    Requirement("torch.fx.experimental.symbolic_shapes", "_constrain_range_for_size", params=("min",),
                why="meta.unbacked_size"),
    Requirement("torch.fx.experimental.symbolic_shapes", "ShapeEnv", attrs=("create_unbacked_symint",),
                why="meta.unbacked_size"),
    Requirement("torch.distributed._functional_collectives", "wait_tensor", why="ep.local"),
    Requirement("torch.distributed.checkpoint.planner_helpers", "_create_write_items_for_dtensor", why="shard-order DCP fix"),
    Requirement("torch.distributed.checkpoint.planner_helpers", "_create_chunk_from_dtensor", why="shard-order DCP fix"),
    Requirement("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata", params=("offsets", "sizes")),
    Requirement("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    Requirement(f"{_T}._redistribute", "_gen_transform_infos_non_cached", why="planner benchmark: upstream's plan"),
    Requirement(f"{_T}._redistribute", "_gen_transform_infos", attrs=("cache_clear",), why="planner benchmark: cached lookup"),
    Requirement(f"{_T}._redistribute", "use_min_cost_redistribution_plan", params=("enabled",), why="planner benchmark"),
    Requirement(f"{_T}._redistribute", "clear_redistribute_planner_cache", why="planner benchmark"),
    Requirement(f"{_T}._redistribute", "_update_shard_order_and_placements", why="planner benchmark: walk_path"),
    Requirement(f"{_T}._redistribute", "DTensorRedistributePlanner", attrs=("_ShardOrder_to_dict", "_dict_to_ShardOrder"),
                why="planner benchmark: walk_path"),
    Requirement("torch._meta_registrations", "_create_grouped_mm_output_tensor"),
    Requirement("torch._subclasses.fake_tensor", "FakeTensorMode"),
    Requirement("torch._subclasses.fake_tensor", "FakeTensor"),
    Requirement("torch._subclasses.fake_tensor", "DynamicOutputShapeException"),
    Requirement("torch._inductor.inductor_prims", "fma", why="defines torch.ops.prims.fma"),
    Requirement(f"{_T}._ops._pointwise_ops", "register_inductor_prims", why="on_prims_fma_defined: lazy fma rule"),
    Requirement("torch.fx.experimental.proxy_tensor", "_init_proxy_trackers", params=("tracer",),
                why="tracing.keep_first_symbol_record: compiled DTensor code without a proxy cycle"),
    Requirement("torch.fx.experimental.proxy_tensor", "PythonKeyTracer", attrs=("sympy_expr_tracker",),
                why="tracing.keep_first_symbol_record"),
    Requirement("torch.fx.experimental.symbolic_shapes", "guard_scalar",
                why="static_shards.guard_global_sizes: fix a DTensor's global size while Dynamo traces"),
    Requirement("torch.fx.experimental.symbolic_shapes", "has_static_value",
                why="static_shards.guard_global_sizes: which local sizes Dynamo made static"),
)
