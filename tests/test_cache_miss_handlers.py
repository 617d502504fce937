"""The cache-miss hook: per-op handlers, arguments read by name, and the out= layout error decided
from the rule's rows and the out= tensor's placements, never from the text of upstream's errors."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

import dtensor_rules  # noqa: F401  (installs the rules and the hook)
from dtensor_rules._upstream import (
    CacheMissArguments,
    OpStrategy,
    ShardingPlaceholder,
    StridedShard,
    cache_miss_wrapped,
    clear_sharding_caches,
    propagator,
    unwrap_cache_miss,
    wrap_cache_miss,
)
from dtensor_rules.dispatch.out_layout import OutLayoutError, check_out_layouts
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor

aten = torch.ops.aten
OUR_MESSAGE = r"out= DTensor .*Shard\(dim=1\).*can be one of \[.*S\(0\).*\].*functional op"


def test_out_layout_error_does_not_depend_on_upstreams_error_text(monkeypatch) -> None:
    """Upstream's selection and expansion say something else entirely when nothing fits: the user
    still gets our error, and a layout the rule writes still runs."""
    from torch.distributed.tensor import _sharding_prop
    from torch.distributed.tensor._ops import utils as ops_utils

    reworded = "upstream reworded: nothing to choose from"
    real_select, real_expand = _sharding_prop._select_min_cost_strategy, ops_utils.expand_to_full_mesh_op_strategy

    def select(strategy: Any, *args: Any, **kwargs: Any) -> Any:
        if not strategy.strategies:
            raise ValueError(reworded)
        return real_select(strategy, *args, **kwargs)

    def expand(*args: Any, **kwargs: Any) -> Any:
        try:
            result = real_expand(*args, **kwargs)
        except RuntimeError:
            raise RuntimeError(reworded) from None
        if not result.strategies:
            raise RuntimeError(reworded)
        return result

    monkeypatch.setattr(_sharding_prop, "_select_min_cost_strategy", select)
    monkeypatch.setattr(ops_utils, "expand_to_full_mesh_op_strategy", expand)
    with pytest.raises(ValueError, match=reworded):  # the rewording is in effect
        _sharding_prop._select_min_cost_strategy(OpStrategy([]))
    x = torch.randn(6, 4)
    clear_sharding_caches()
    try:
        with simulated_mesh((2, 2)) as mesh:
            o = to_dtensor(torch.empty(6, 4), mesh, [Shard(0), Shard(1)])
            with pytest.raises(OutLayoutError, match=OUR_MESSAGE) as caught:
                torch.cumsum(to_dtensor(x, mesh, [Replicate(), Replicate()]), 1, out=o)
            assert reworded not in str(caught.value)
            o2 = to_dtensor(torch.empty(6, 4), mesh, [Shard(0), Replicate()])
            torch.cumsum(to_dtensor(x, mesh, [Replicate(), Replicate()]), 1, out=o2)
            got = full_value(o2)
    finally:
        clear_sharding_caches()  # no decision made under the reworded upstream outlives the test
    torch.testing.assert_close(got, x.cumsum(1))


_LAYOUTS = [Replicate(), Shard(0), Shard(1), Partial("sum")]


@pytest.mark.parametrize("out_placements", list(itertools.product(_LAYOUTS, repeat=2)), ids=str)
def test_cumsum_out_layouts_follow_the_scan(out_placements) -> None:
    """A result sharded along the scan dim needs a carry across ranks, which no strategy has: exactly
    those out= layouts are refused; every other one is written and holds torch's cumsum."""
    x = torch.randn(6, 4)
    with simulated_mesh((2, 2)) as mesh:
        o = to_dtensor(torch.zeros(6, 4), mesh, list(out_placements))
        call = lambda: torch.cumsum(to_dtensor(x, mesh, [Replicate(), Replicate()]), 1, out=o)  # noqa: E731
        if Shard(1) in out_placements:
            with pytest.raises(OutLayoutError, match=OUR_MESSAGE):
                call()
            return
        call()
        assert tuple(o.placements) == out_placements
        got = full_value(o)
    torch.testing.assert_close(got, x.cumsum(1))


def test_a_placeholder_row_writes_any_shard_of_its_dim() -> None:
    """Upstream fills a placeholder with the shard types the inputs hold, strided ones included
    (``_fill_single_dim_strategy_placeholders``): such an out= layout is not refused up front."""
    rows = [[ShardingPlaceholder(0), ShardingPlaceholder(0)], [Partial("sum"), Partial("sum")]]
    op = aten.cumsum.out
    for ok in [(Shard(0),), (StridedShard(0, split_factor=2),), (Partial("sum"),), (Replicate(), Shard(0))]:
        check_out_layouts(op, [(0, ok)], rows)
    for refused in [(Shard(1),), (StridedShard(1, split_factor=2),), (Partial("max"),), (Replicate(), Shard(1))]:
        with pytest.raises(OutLayoutError, match=r"can be one of \[P\(sum\), R, S\(0\)\]"):
            check_out_layouts(op, [(0, refused)], rows)


class _ReorderedDispatcher:
    """A dispatcher whose cache-miss callback takes its parameters in another order, plus one more."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def _propagate_op_sharding_dispatch_slow_path(self, op_info, op_call, *, kwargs, args, try_cache=False, extra=7):
        self.seen.append((op_info, op_call, args, kwargs, try_cache, extra))
        return "decision"


def test_the_hook_reads_the_callbacks_arguments_by_name_and_passes_them_all_on(monkeypatch) -> None:
    fake = _ReorderedDispatcher()
    monkeypatch.setattr(DTensor, "_op_dispatcher", fake)
    read: list[tuple[Any, ...]] = []

    def make(original: Any, arguments: CacheMissArguments) -> Any:
        def on_cache_miss(*args: Any, **kwargs: Any) -> Any:
            call = arguments.bind(args, kwargs)
            read.append((arguments.op_call(args, kwargs), call.op_call, call.args, call.kwargs, call.op_info))
            call.look_in_python_cache()
            return call.run(original)

        return on_cache_miss

    wrap_cache_miss(make)
    try:
        assert cache_miss_wrapped()
        got = fake._propagate_op_sharding_dispatch_slow_path("info", "op", kwargs={"k": 1}, args=(2,), extra=9)
        fake._propagate_op_sharding_dispatch_slow_path(op_info="i2", op_call="op2", args=(), kwargs={})
    finally:
        unwrap_cache_miss()
    assert not cache_miss_wrapped()
    assert got == "decision"
    assert read == [("op", "op", (2,), {"k": 1}, "info"), ("op2", "op2", (), {}, "i2")]
    assert fake.seen == [("info", "op", (2,), {"k": 1}, True, 9), ("i2", "op2", (), {}, True, 7)]


def test_a_callback_without_a_parameter_the_hook_reads_fails_at_wrap_time_naming_it(monkeypatch) -> None:
    class Dispatcher:
        def _propagate_op_sharding_dispatch_slow_path(self, op_call, args, kwargs, schema_info):
            raise AssertionError("never called")

    monkeypatch.setattr(DTensor, "_op_dispatcher", Dispatcher())
    with pytest.raises(RuntimeError, match=r"without \['op_info'\].*cache_miss_hook"):
        wrap_cache_miss(lambda original, arguments: original)
    assert not cache_miss_wrapped()


def test_torchs_callback_has_every_parameter_the_hook_reads() -> None:
    """On this torch release: the parameters by name, and ``try_cache`` (2.13, 2.14)."""
    import inspect

    from torch.distributed.tensor._dispatch import OpDispatcher

    params = list(inspect.signature(OpDispatcher._propagate_op_sharding_dispatch_slow_path).parameters)
    assert {"op_call", "args", "kwargs", "op_info", "try_cache"} <= set(params)


def test_a_finished_call_is_priced_once(monkeypatch) -> None:
    """A masked gather is finished on every call (DTensor caches no result), so its propagation
    must come from the Python sharding cache the second time: the rule is asked once."""
    gather = aten.gather.default
    real = propagator().op_strategy_funcs[gather]
    asked: list[int] = []
    monkeypatch.setitem(propagator().op_strategy_funcs, gather, lambda schema: asked.append(1) or real(schema))
    g = torch.Generator().manual_seed(0)
    x, index = torch.randn(4, 16), torch.randint(0, 16, (4, 1), generator=g)
    clear_sharding_caches()
    try:
        with simulated_mesh((2,)) as mesh:
            dx, di = distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(index, mesh, [Replicate()])
            outs = [torch.gather(dx, 1, di) for _ in range(2)]
            assert all(isinstance(o.placements[0], Partial) for o in outs)  # the masked (finished) strategy
            got = [o.full_tensor() for o in outs]
    finally:
        monkeypatch.undo()
        clear_sharding_caches()
    assert len(asked) == 1
    for out in got:
        assert torch.equal(out, torch.gather(x, 1, index))
