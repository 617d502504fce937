"""Sort/topk/cumsum/histc/bincount/softmax-backward/fma formulas against hand-derived counts."""

from __future__ import annotations

import math

import pytest
import torch

import dtensor_rules  # noqa: F401
from dtensor_rules.costs import estimate

aten = torch.ops.aten


@pytest.mark.parametrize(
    "op,args,kwargs",
    [
        (aten.sort.default, (), {"dim": 1}),
        (aten.sort.stable, (), {"stable": True, "dim": 1, "descending": True}),
        (aten.argsort.default, (1,), {}),
        (aten.argsort.stable, (), {"stable": True, "dim": 1}),
    ],
)
def test_sort_is_n_log_n_comparisons_per_row(op, args, kwargs) -> None:
    x = torch.randn(3, 10)
    cost = estimate(op, x, *args, **kwargs)
    assert cost.flops == 3 * 10 * math.ceil(math.log2(10))
    values, indices = torch.sort(x, dim=1)
    assert cost.bytes_read == x.numel() * 4
    assert cost.bytes_written == values.numel() * 4 + indices.numel() * 8


def test_topk() -> None:
    x = torch.randn(4, 32)
    values, indices = torch.topk(x, 5)
    cost = estimate(aten.topk.default, x, 5)
    assert cost.flops == 4 * (32 + 5 * 3)  # select over 32, then sort 5 (ceil(log2 5) = 3)
    assert cost.bytes_written == values.numel() * 4 + indices.numel() * 8
    assert estimate(aten.topk.default, x, 5, sorted=False).flops == 4 * 32


@pytest.mark.parametrize(
    "x,dtype,out_itemsize",
    [
        (torch.ones(4, 6, dtype=torch.int32), None, 8),  # ints promote to int64
        (torch.ones(4, 6, dtype=torch.bool), None, 8),
        (torch.ones(4, 6), None, 4),
        (torch.ones(4, 6), torch.float64, 8),
    ],
)
def test_cumsum_output_dtype(x, dtype, out_itemsize) -> None:
    out = torch.cumsum(x, 0, dtype=dtype)
    assert out.element_size() == out_itemsize
    cost = estimate(aten.cumsum.default, x, 0, dtype=dtype)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (24, 24 * x.element_size(), 24 * out_itemsize)


def test_histc_range_from_data_costs_an_extra_pass() -> None:
    x = torch.randn(100)
    given = estimate(aten.histc.default, x, 10, -1.0, 1.0)
    found = estimate(aten.histc.default, x, 10)
    assert given.bytes_written == torch.histc(x, 10).numel() * 4
    assert (given.flops, found.flops) == (500, 700)
    assert found.bytes_read == 2 * given.bytes_read == 800


@pytest.mark.parametrize("weights_dtype", [None, torch.float32, torch.bfloat16])
def test_bincount_length_and_dtype_from_data(weights_dtype) -> None:
    x = torch.tensor([0, 3, 3, 9])
    w = None if weights_dtype is None else torch.ones(4, dtype=weights_dtype)
    out = torch.bincount(x, w, minlength=5)
    cost = estimate(aten.bincount.default, x, w, 5)
    assert cost.exact and cost.bytes_written == out.numel() * out.element_size()
    assert cost.flops == 8


def test_bincount_on_meta_is_marked_estimate() -> None:
    cost = estimate(aten.bincount.default, torch.empty(10, dtype=torch.int64, device="meta"), None, 7)
    assert not cost.exact and cost.bytes_written == 7 * 8


def test_fma_broadcasts_and_promotes() -> None:
    from dtensor_rules.op_rules.fma import fma  # defines prims.fma (dtensor_rules does not import inductor)

    a, b, c = torch.randn(4, 1), torch.randn(1, 6, dtype=torch.float64), torch.randn(6)
    cost = estimate(fma, a, b, c)
    assert cost.flops == 2 * 24
    assert cost.bytes_read == 4 * 4 + 6 * 8 + 6 * 4 and cost.bytes_written == 24 * 8


def test_softmax_backward_out_dtype() -> None:
    g = torch.randn(3, 8, dtype=torch.bfloat16)
    cost = estimate(aten._softmax_backward_data.default, g, g, 1, torch.float32)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (4 * 24, 2 * 24 * 2, 24 * 4)


def test_rule_formulas_still_work_from_the_ops_modules() -> None:
    from dtensor_rules.op_rules.fma import fma
    from dtensor_rules.registry import get_rule

    a = torch.randn(2, 3)
    cost = get_rule(fma).cost(fma, (a, a, a), {})
    assert cost.flops == 12 and cost.bytes == 4 * 24 and cost == estimate(fma, a, a, a)
    sbd = aten._softmax_backward_data.default
    assert get_rule(sbd).cost(sbd, (a, a, 1, torch.float32), {}).flops == 24


def test_stride_zero_input_read_once() -> None:
    x = torch.randn(8, 1).expand(8, 64)
    assert estimate(aten.sort.default, x).bytes_read == 8 * 4
