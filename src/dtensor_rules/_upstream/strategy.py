"""Strategy expansion and selection: upstream's helpers behind version-stable signatures."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._ops import single_dim_strategy as _single_dim
from torch.distributed.tensor._ops import utils as _ops_utils
from torch.distributed.tensor._sharding_prop import _select_min_cost_strategy

from dtensor_rules._upstream.types import DTensorSpec, OpSchema, OpSpec, OpStrategy

is_tensor_shardable = _ops_utils.is_tensor_shardable

StrategyFilter = Callable[[list[DTensorSpec], Any], bool]

# torch 2.13 calls the per-strategy filter ``is_valid_strategy_cb``; 2.14 renamed it
# ``full_mesh_strategy_filter``. Read the name off the signature instead of the version.
_EXPAND_PARAMS = inspect.signature(_ops_utils.expand_to_full_mesh_op_strategy).parameters
FILTER_KWARG = next(k for k in ("full_mesh_strategy_filter", "is_valid_strategy_cb") if k in _EXPAND_PARAMS)


def expand_to_mesh(
    mesh: DeviceMesh,
    op_schema: OpSchema,
    rows: Sequence[Sequence[Any]],
    *,
    strategy_filter: StrategyFilter | None = None,
    **kwargs: Any,
) -> OpStrategy:
    """Upstream's ``expand_to_full_mesh_op_strategy``: single-dim rows -> full-mesh strategies.

    ``strategy_filter(input_specs, output_spec) -> bool`` drops full-mesh strategies (called
    ``is_valid_strategy_cb`` / ``full_mesh_strategy_filter`` upstream, by version).
    Other keywords (``input_index``, ``inplace_op``, ``allow_uneven_sharding``,
    ``output_tensor_meta``, ...) pass through unchanged.
    """
    if strategy_filter is not None:
        kwargs[FILTER_KWARG] = strategy_filter
    with _empty_when_nothing_fits():
        return _ops_utils.expand_to_full_mesh_op_strategy(mesh, op_schema, list(rows), **kwargs)
    return OpStrategy([])


# torch 2.13 returns an empty OpStrategy when every full-mesh strategy is filtered out (e.g. none
# puts the output where an out= tensor is); 2.14 raises this instead. Callers here (the validator,
# our dispatch handlers with their own clearer error) expect 2.13's empty result on both.
_NOTHING_FITS = "no valid sharding strategy for the input placements"


class _empty_when_nothing_fits:  # noqa: N801 - a context manager
    """Swallow 2.14's "no valid sharding strategy" RuntimeError; the caller returns an empty strategy."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, err: BaseException | None, tb: object) -> bool:
        return kind is RuntimeError and _NOTHING_FITS in str(err)


def select_min_cost_strategy(strategy: OpStrategy, op_schema: OpSchema | None = None) -> OpSpec:
    """The strategy dispatch would pick: the one with the least input redistribution cost."""
    if op_schema is None:
        return _select_min_cost_strategy(strategy)
    return _select_min_cost_strategy(strategy, op_schema)


def num_tensor_inputs(op_schema: OpSchema) -> int:
    """How many tensors (lists flattened) an op schema's arguments hold."""
    return _single_dim._get_num_tensor_inputs(op_schema)


def expand_single_dim_rule(
    mesh: DeviceMesh, op_schema: OpSchema, info: Any, output_tensor_meta: Any
) -> Callable[[Any, Any, Any], Any]:
    """Dispatch's own expansion of a single-dim rule (``SingleDimStrategyInfo``) to ``mesh``.

    Returns ``fn(op, args_meta, kwargs_meta) -> OpStrategy``, placeholders filled with the shard
    types the inputs use, exactly as DTensor's propagator does it for a cache miss.
    """
    expand = _single_dim._expand_single_dim_strategy_to_mesh(mesh, op_schema, info, output_tensor_meta)

    def expanded(op: Any, args_meta: Any, kwargs_meta: Any) -> Any:
        with _empty_when_nothing_fits():
            return expand(op, args_meta, kwargs_meta)
        return OpStrategy([])

    return expanded


def dijkstra_single_dim_rule(mesh: DeviceMesh, op_schema: OpSchema, info: Any, output_tensor_meta: Any) -> OpStrategy | None:
    """Upstream's priority-queue search for the cheapest full-mesh strategy of a single-dim rule
    (``_dijkstra_expand_single_dim_strategy_to_mesh``, in torch 2.13 and 2.14 with the same
    signature; neither release's propagator calls it yet).

    States are the inputs' placements; a step changes one input on one mesh dim, priced by
    DTensor's per-step transition cost; the first state every mesh dim of which matches a row
    wins. Returns one strategy, or None where upstream declines: a list of tensors
    (``TupleStrategy``: ``cat``, ``index_put``), a tensor keyword (``out=``), ``_StridedShard``,
    a symbolic size, or no matching state (upstream's caller then expands every product).
    ``info``: a ``SingleDimStrategyInfo`` or the bare rows function; ``output_tensor_meta``: what
    :func:`~dtensor_rules._upstream.registries.output_tensor_meta` gives for the call (upstream
    asserts it is set for an op with outputs).
    """
    return _single_dim._dijkstra_expand_single_dim_strategy_to_mesh(mesh, op_schema, info, output_tensor_meta)


@contextlib.contextmanager
def recording_strategy_counts() -> Iterator[list[int]]:
    """Inside: each min-cost selection DTensor's propagator makes appends how many strategies it chose
    from (benchmarks report it beside the time). The module function is restored exactly on exit."""
    from torch.distributed.tensor import _sharding_prop

    counts: list[int] = []
    original = _sharding_prop._select_min_cost_strategy

    def counting(strategy: OpStrategy, *args: Any, **kwargs: Any) -> OpSpec:
        counts.append(len(strategy.strategies))
        return original(strategy, *args, **kwargs)

    _sharding_prop._select_min_cost_strategy = counting
    try:
        yield counts
    finally:
        _sharding_prop._select_min_cost_strategy = original
