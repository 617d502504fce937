"""Dispatch's strategy choice vs upstream's own search on the same rule rows.

Oracle: upstream's ``_dijkstra_expand_single_dim_strategy_to_mesh`` (through
``dtensor_rules._upstream.dijkstra_single_dim_rule``) run on the rows our installed rule serves.
Both choices are priced by DTensor's ``redistribute_cost`` from the inputs' current layouts (what
dispatch's min-cost selection compares). On calls whose inputs must move, dispatch's choice is
never costlier, and is equal except where upstream's search prices a path DTensor's redistribute
does not take (``PRICES_ANOTHER_PATH``, docs/dispatch.md "Upstream's search").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

import dtensor_rules
from dtensor_rules._upstream import (
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    SingleDimStrategyInfo,
    clear_sharding_caches,
    compute_local_shape_and_global_offset,
    dijkstra_single_dim_rule,
    output_tensor_meta,
    propagate,
    redistribute_cost,
    registry,
    select_min_cost_strategy,
    unwrap_to_op_info,
)
from dtensor_rules.dispatch.greedy import flat_inputs
from dtensor_rules.dispatch.single_dim import SingleDimStrategy
from dtensor_rules.testing import fake_world

aten = torch.ops.aten
S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()


def _dt(mesh: DeviceMesh, shape: tuple[int, ...], placements: list[Placement], dtype: torch.dtype = torch.float32) -> DTensor:
    """A DTensor on meta storage: sharding propagation only, no data."""
    local, _ = compute_local_shape_and_global_offset(shape, mesh.shape, [0] * mesh.ndim, placements)
    return DTensor.from_local(torch.empty(local, dtype=dtype, device="meta"), mesh, placements, run_check=False,
                              shape=torch.Size(shape), stride=torch.empty(shape, device="meta").stride())


Call = Callable[[DeviceMesh], tuple[Any, tuple[Any, ...], dict[str, Any]]]
# calls on a 2x2 mesh whose inputs no row takes as they are (each needs a move)
CALLS: dict[str, Call] = {
    "cumsum over a dim sharded twice": lambda m: (aten.cumsum.default, (_dt(m, (16, 8), [S0, S0]), 0), {}),
    "cumsum of a Partial": lambda m: (aten.cumsum.default, (_dt(m, (16, 8), [S1, P]), 1), {}),
    "gather on the sharded dim": lambda m: (aten.gather.default,
                                            (_dt(m, (16, 8), [S1, S0]), 1, _dt(m, (16, 4), [S1, R], torch.int64)), {}),
    "scatter_add": lambda m: (aten.scatter_add.default, (_dt(m, (8, 8), [S0, R]), 0, _dt(m, (16, 8), [S1, S0], torch.int64),
                                                         _dt(m, (16, 8), [S1, S0])), {}),
    "softmax backward, crossed layouts": lambda m: (aten._softmax_backward_data.default,
                                                    (_dt(m, (16, 8), [S1, S0]), _dt(m, (16, 8), [S0, S1]), 1, torch.float32), {}),
    "topk on the sharded dim": lambda m: (aten.topk.default, (_dt(m, (16, 8), [S1, S0]), 2, 1), {}),
}
# upstream's search prices the steps it walks, one mesh dim at a time, through free Replicate ->
# Shard steps: (S0, S0) -> (S0, R) -> (S0, S1) -> (R, S1) costs it what (S0, S0) -> (R, R) does, and
# the tie goes to the state pushed first. DTensor's redistribute plans the net move (S0, S0) ->
# (R, S1) as an all-to-all and an all-gather, and redistribute_cost prices an all-to-all as an
# all-gather plus 1.0; dispatch prices each net move by DTensor's plan, so it takes (R, R)
PRICES_ANOTHER_PATH = {"cumsum over a dim sharded twice", "softmax backward, crossed layouts"}


def _choices(call: Call) -> tuple[float, float]:
    """(dispatch's choice, upstream's search's choice), each priced by DTensor's redistribute_cost."""
    mesh = init_device_mesh("cpu", (2, 2))
    op, args, kwargs = call(mesh)
    info = unwrap_to_op_info(op, args, kwargs)
    funcs = registry("op_strategy_funcs")
    ours = funcs[op]
    assert isinstance(ours, SingleDimStrategy), f"{op} is not served by a single-dim rule of ours"
    seen: list[OpSchema] = []
    funcs[op] = lambda s: (seen.append(s), ours(s))[1]
    try:
        clear_sharding_caches()
        propagate(info)  # the strategy schema DTensor hands the rule
    finally:
        funcs[op] = ours
        clear_sharding_caches()
    schema = seen[-1]
    info_rows = SingleDimStrategyInfo(func=ours.rows, allow_uneven_sharding=ours.allow_uneven_sharding,
                                      allow_unbacked_sharding=False)
    upstream = dijkstra_single_dim_rule(mesh, schema, info_rows, output_tensor_meta(info.schema))
    assert upstream is not None, "upstream's search declined a call of plain positional tensors"
    return _price(ours(schema), schema), _price(upstream, schema)


def _price(strategy: OpStrategy, schema: OpSchema) -> float:
    picked = select_min_cost_strategy(strategy, schema)
    currents = [s.strategies[0].output_spec for s in flat_inputs(schema)]
    return sum(redistribute_cost(c, DTensorSpec(c.mesh, tuple(t.placements), tensor_meta=c.tensor_meta))
               for c, t in zip(currents, picked.input_specs))


@pytest.mark.parametrize("name", sorted(CALLS))
def test_dispatch_chooses_as_cheap_as_upstreams_search(name: str) -> None:
    dtensor_rules.install()
    with fake_world(4):
        ours, upstream = _choices(CALLS[name])
    assert ours > 0  # the call needs a move: both searches had to choose one
    if name in PRICES_ANOTHER_PATH:
        assert ours < upstream
    else:
        assert ours == pytest.approx(upstream, rel=1e-9)


def test_upstreams_search_declines_a_list_of_tensors() -> None:
    """cat's inputs come as one list (a TupleStrategy): upstream's search returns None and its
    caller would price every row product, which is why dispatch keeps its own search for cat."""
    dtensor_rules.install()
    with fake_world(4):
        mesh = init_device_mesh("cpu", (2, 2))
        xs = [_dt(mesh, (8, 4), [S0, R]) for _ in range(3)]
        info = unwrap_to_op_info(aten.cat.default, (xs, 1), {})
        funcs = registry("op_strategy_funcs")
        ours = funcs[aten.cat.default]
        seen: list[OpSchema] = []
        funcs[aten.cat.default] = lambda s: (seen.append(s), ours(s))[1]
        try:
            clear_sharding_caches()
            propagate(info)
        finally:
            funcs[aten.cat.default] = ours
            clear_sharding_caches()
        rows = SingleDimStrategyInfo(func=lambda op, a, k: [[S0, S0, S0, S0]], allow_uneven_sharding=True)
        assert dijkstra_single_dim_rule(mesh, seen[-1], rows, output_tensor_meta(info.schema)) is None


def test_upstreams_search_moves_the_tensor_an_inplace_op_writes() -> None:
    """Upstream's search knows no tensor that is written into: for ``cumsum_`` of a tensor sharded
    on the scanned dim it returns a strategy that redistributes ``self``, so the op would write a
    copy; dispatch refuses the call (upstream's own in-place error), as DTensor's expansion does."""
    dtensor_rules.install()
    with fake_world(4):
        mesh = init_device_mesh("cpu", (2, 2))
        x = _dt(mesh, (16, 8), [S0, R])
        info = unwrap_to_op_info(aten.cumsum_.default, (x, 0), {})
        ours = registry("op_strategy_funcs")[aten.cumsum_.default]
        s = info.schema
        schema = OpSchema(s.op, (OpStrategy([OpSpec(s.args_schema[0])]), *s.args_schema[1:]), s.kwargs_schema,
                          schema_info=s.schema_info)
        rows = SingleDimStrategyInfo(func=ours.rows, allow_uneven_sharding=True)
        upstream = dijkstra_single_dim_rule(mesh, schema, rows, output_tensor_meta(s))
        assert upstream is not None and tuple(upstream.strategies[0].input_specs[0].placements) != (S0, R)
        with pytest.raises(RuntimeError, match="in-place operations that require placement changes"):
            ours(schema)
