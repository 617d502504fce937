"""estimate(): lookup order (user rule, table, generic families), tensors kinds, bad input."""

from __future__ import annotations

import pytest
import torch
from dtensor_rules._upstream import FakeTensorMode

import dtensor_rules  # noqa: F401
from dtensor_rules.costs import CostError, OpCost, estimate, estimate_call
from dtensor_rules.registry import register, unregister

aten = torch.ops.aten


@torch.library.custom_op("dtr_costs_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_user_rule_formulas_win() -> None:
    op = twice._opoverload

    @register(op, flops=lambda x: 7 * x.numel(), bytes=lambda x: (x.numel(), 2 * x.numel()))
    def rule(op, args, kwargs):
        return []

    try:
        cost = estimate(op, torch.randn(3))
        assert (cost.flops, cost.bytes_read, cost.bytes_written, cost.source) == (21, 3, 6, "rule")
    finally:
        unregister(op)
    with pytest.raises(CostError, match="no cost formula"):
        estimate(op, torch.randn(3))


def test_user_rule_total_bytes_is_documented_in_note() -> None:
    op = twice._opoverload

    @register(op, flops=lambda x: 1, bytes=lambda x: 40)
    def rule(op, args, kwargs):
        return []

    try:
        cost = estimate(op, torch.randn(3))
        assert cost.bytes == 40 and "total bytes" in cost.note and not cost.exact
    finally:
        unregister(op)


def test_op_without_formula_is_a_clear_error() -> None:
    # nonzero: no tag, a data-dependent output shape, no formula
    with pytest.raises(CostError, match=r"no cost formula for aten\.nonzero\.default.*fallback=True"):
        estimate(aten.nonzero.default, torch.randn(2, 2))


def test_fallback_is_marked_as_estimate() -> None:
    cost = estimate_call(aten.linalg_qr.default, (torch.randn(4, 3),), {}, fallback=True)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (0, 48, 48 + 36)
    assert not cost.exact and cost.source == "fallback" and "ESTIMATE" in cost.note


def test_overload_packet_is_resolved() -> None:
    x = torch.randn(3, 4)
    assert estimate(aten.sort, x, stable=True) == estimate(aten.sort.stable, x, stable=True)
    with pytest.raises(CostError, match="no overload"):
        estimate(aten.sort, "not a tensor")


def test_wrong_arguments_are_reported() -> None:
    with pytest.raises(CostError, match="no argument 'bogus'"):
        estimate(aten.cumsum.default, torch.randn(3), 0, bogus=1)


def test_generic_families() -> None:
    x = torch.randn(4, 5)
    add = estimate(aten.add.Tensor, x, torch.randn(5))
    assert (add.flops, add.bytes_read, add.bytes_written, add.source) == (20, 100, 80, "pointwise")
    s = estimate(aten.sum.dim_IntList, x, [0])
    assert (s.flops, s.bytes_read, s.bytes_written, s.source) == (20, 80, 20, "reduction")
    v = estimate(aten.transpose.int, x, 0, 1)
    assert v == OpCost(0, 0, 0, source="view", family="view")


@pytest.mark.parametrize("kind", ["real", "meta", "fake"])
def test_real_fake_and_meta_give_the_same_shape_costs(kind: str) -> None:
    def make():
        return torch.randn(4, 6), torch.randint(0, 4, (2, 6))

    if kind == "fake":
        with FakeTensorMode():
            x, i = make()
            cost = estimate(aten.scatter_add.default, x, 0, i, x)
    else:
        x, i = make()
        if kind == "meta":
            x, i = x.to("meta"), i.to("meta")
        cost = estimate(aten.scatter_add.default, x, 0, i, x)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (12, 96 + 96 + 48 + 48, 96 + 48)


@pytest.mark.parametrize(
    "op,args,kwargs,expected",
    [
        # factories read no data (self gives only metadata) and write the output; empty writes nothing
        (aten.new_zeros.default, (torch.randn(4, 5), [3, 2]), {}, (0, 0, 24, "factory")),
        (aten.new_full.default, (torch.randn(4, 5), [3], 7.0), {}, (0, 0, 12, "factory")),
        (aten.ones_like.default, (torch.randn(4, 5),), {}, (0, 0, 80, "factory")),
        (aten.empty_like.default, (torch.randn(4, 5),), {}, (0, 0, 0, "factory")),
        # copies: dtype conversion reads fp32 and writes bf16; copy_ reads only src
        (aten._to_copy.default, (torch.randn(4, 5),), {"dtype": torch.bfloat16}, (0, 80, 40, "copy")),
        (aten.copy_.default, (torch.empty(4, 5), torch.randn(5)), {}, (0, 20, 80, "copy")),
        (aten.clone.default, (torch.randn(4, 5),), {}, (0, 80, 80, "copy")),
        # a view's backward reads the gradient and writes zeros of the input's shape around it
        (aten.select_backward.default, (torch.randn(4), [4, 2], 1, 0), {}, (0, 16, 32, "copy")),
        (aten.slice_backward.default, (torch.randn(2, 5), [4, 5], 0, 1, 3, 1), {}, (0, 40, 80, "copy")),
        # tagged pointwise, any dtype
        (aten.clamp_min.default, (torch.randn(4, 5), 0.0), {}, (20, 80, 80, "pointwise")),
        (aten.silu_backward.default, (torch.randn(4, 5), torch.randn(4, 5)), {}, (20, 160, 80, "pointwise")),
        (aten.sigmoid_backward.default, (torch.randn(4, 5), torch.randn(4, 5)), {}, (20, 160, 80, "pointwise")),
        # views: free
        (aten.expand.default, (torch.randn(1, 5), [4, 5]), {}, (0, 0, 0, "view")),
        (aten.squeeze.dim, (torch.randn(4, 1), 1), {}, (0, 0, 0, "view")),
        (aten._unsafe_view.default, (torch.randn(4, 5), [20]), {}, (0, 0, 0, "view")),
        # reductions by tag
        (aten.amax.default, (torch.randn(4, 5), [1]), {}, (20, 80, 16, "reduction")),
    ],
)
def test_generic_family_costs(op, args, kwargs, expected) -> None:
    cost = estimate(op, *args, **kwargs)
    assert (cost.flops, cost.bytes_read, cost.bytes_written, cost.family) == expected
    assert cost.exact


def test_untagged_elementwise_aten_op_is_inferred_and_marked() -> None:
    assert torch.Tag.pointwise not in aten.floor_divide.default.tags
    cost = estimate(aten.floor_divide.default, torch.randint(0, 9, (4, 5)), torch.full((5,), 2))
    assert (cost.flops, cost.bytes_read, cost.bytes_written, cost.family) == (20, 160 + 40, 160, "pointwise")
    assert not cost.exact and "assumed elementwise" in cost.note


def test_device_arguments_never_allocate_real_memory() -> None:
    # 2**40 floats would be 4 TiB: pricing must stay on meta tensors
    big = torch.empty(2**20, 2**20, device="meta")
    cost = estimate(aten.new_zeros.default, big, [2**20, 2**20], device=torch.device("cpu"))
    assert cost.bytes_written == 4 * 2**40
    cost = estimate(aten._to_copy.default, big, device=torch.device("cpu"), dtype=torch.bfloat16)
    assert (cost.bytes_read, cost.bytes_written) == (4 * 2**40, 2 * 2**40)
