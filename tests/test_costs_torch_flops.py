"""Ops torch's FlopCounterMode prices: our flops equal torch's count, bytes are operands + outputs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import dtensor_rules  # noqa: F401
from dtensor_rules.costs import estimate

aten = torch.ops.aten


def _m(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


CASES = {
    "mm": (aten.mm.default, (_m(4, 6), _m(6, 5)), {}),
    "addmm": (aten.addmm.default, (_m(5), _m(4, 6), _m(6, 5)), {}),
    "bmm": (aten.bmm.default, (_m(3, 4, 6), _m(3, 6, 5)), {}),
    "baddbmm": (aten.baddbmm.default, (_m(3, 4, 5), _m(3, 4, 6), _m(3, 6, 5)), {}),
    "convolution": (
        aten.convolution.default,
        (_m(2, 3, 8, 8), _m(4, 3, 3, 3), _m(4), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        {},
    ),
    "sdpa_efficient": (
        aten._scaled_dot_product_efficient_attention.default,
        (_m(2, 4, 8, 16), _m(2, 4, 8, 16), _m(2, 4, 8, 16), None, False),
        {},
    ),
    "sdpa_flash": (
        aten._scaled_dot_product_flash_attention.default,
        (_m(2, 4, 8, 16, dtype=torch.bfloat16),) * 3,
        {},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_flops_equal_flop_counter_mode(name: str) -> None:
    op, args, kwargs = CASES[name]
    with FlopCounterMode(display=False) as counter:
        op(*args, **kwargs)
    cost = estimate(op, *args, **kwargs)
    assert counter.get_total_flops() > 0
    assert cost.flops == counter.get_total_flops()
    assert (cost.unit, cost.family, cost.source) == ("tensor", "matmul", "torch_flop_counter")


def test_mm_and_addmm_bytes_are_operands_plus_output() -> None:
    mm = estimate(aten.mm.default, torch.randn(4, 6), torch.randn(6, 5))
    assert (mm.flops, mm.bytes_read, mm.bytes_written) == (2 * 4 * 6 * 5, (24 + 30) * 4, 20 * 4)
    bias = torch.randn(5).expand(4, 5)  # broadcast bias: its distinct 5 elements are read
    addmm = estimate(aten.addmm.default, bias, torch.randn(4, 6), torch.randn(6, 5))
    assert (addmm.bytes_read, addmm.bytes_written) == ((5 + 24 + 30) * 4, 20 * 4)


def test_bf16_mm_prices_at_the_tensor_core_rate() -> None:
    from dtensor_rules.costs import runtime

    a, b = _m(4096, 4096, dtype=torch.bfloat16), _m(4096, 4096, dtype=torch.bfloat16)
    cost = estimate(aten.mm.default, a, b)
    # 137 GFLOP at 989.5 TF * 0.7 efficiency: ~0.2 ms, far above the 4 us launch
    assert runtime(cost, "h100") == pytest.approx(4e-6 + 2 * 4096**3 / (989.5e12 * 0.7))
