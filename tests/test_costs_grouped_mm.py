"""_grouped_mm flops/bytes against brute force: per-group mm counted by torch's FlopCounterMode."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import dtensor_rules  # noqa: F401  (registers the flop formulas)
from dtensor_rules.costs import estimate

GMM = torch.ops.aten._grouped_mm.default
M, K, N = 8, 16, 8
# uneven groups, an empty group in the middle, an empty group at the end, and offs[-1] < extent
GROUP_ENDS = [[3, 3, 8], [0, 5, 8], [8, 8, 8], [2, 4, 6], [1, 1, 1]]


def _per_group_flops(mats: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    with FlopCounterMode(display=False) as counter:
        for a, b in mats:
            torch.mm(a, b)
    return counter.get_total_flops()


def _bounds(ends: list[int]) -> list[tuple[int, int]]:
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def _inputs(mode: str, ends: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list]:
    G = len(ends)
    offs = torch.tensor(ends, dtype=torch.int32)
    if mode == "2d3d":
        a, b = torch.randn(M, K), torch.randn(G, K, N)
        pairs = [(a[s:e], b[g]) for g, (s, e) in enumerate(_bounds(ends))]
    elif mode == "3d2d":
        a, b = torch.randn(G, M, K), torch.randn(K, N)
        pairs = [(a[g], b[:, s:e]) for g, (s, e) in enumerate(_bounds(ends))]
    elif mode == "2d2d":
        a, b = torch.randn(M, K), torch.randn(K, N)
        ends = [e * 2 for e in ends]  # split K = 16
        offs = torch.tensor(ends, dtype=torch.int32)
        pairs = [(a[:, s:e], b[s:e]) for s, e in _bounds(ends)]
    else:
        a, b = torch.randn(G, M, K), torch.randn(G, K, N)
        offs = None
        pairs = [(a[g], b[g]) for g in range(G)]
    return a, b, offs, pairs


@pytest.mark.parametrize("mode", ["2d3d", "3d2d", "2d2d", "3d3d"])
@pytest.mark.parametrize("ends", GROUP_ENDS)
def test_flops_equal_sum_of_per_group_mm(mode: str, ends: list[int]) -> None:
    a, b, offs, pairs = _inputs(mode, ends)
    GMM(a, b, offs)  # the CPU kernel accepts these inputs
    cost = estimate(GMM, a, b, offs)
    assert cost.flops == _per_group_flops(pairs)
    assert cost.exact


@pytest.mark.parametrize("mode", ["2d3d", "3d2d", "2d2d", "3d3d"])
def test_flop_counter_mode_counts_grouped_mm(mode: str) -> None:
    a, b, offs, pairs = _inputs(mode, [2, 2, 7])
    with FlopCounterMode(display=False) as counter:
        GMM(a, b, offs)
    assert counter.get_total_flops() == _per_group_flops(pairs) > 0


def test_bytes_count_touched_operands_and_output() -> None:
    ends = [3, 3, 6]  # group 1 empty, rows 6..7 of a unused
    a, b, offs, pairs = _inputs("2d3d", ends)
    out = GMM(a, b, offs)
    cost = estimate(GMM, a, b, offs)
    touched = sum(x.numel() * x.element_size() + y.numel() * y.element_size() for x, y in pairs if x.shape[0])
    assert cost.bytes_read == touched + offs.numel() * offs.element_size()
    assert cost.bytes_written == out[:6].numel() * out.element_size()


def test_meta_offs_assumes_balanced_groups_and_says_so() -> None:
    a, b = torch.empty(8, K, device="meta"), torch.empty(4, K, N, device="meta")
    offs = torch.empty(4, dtype=torch.int32, device="meta")
    cost = estimate(GMM, a, b, offs)
    assert not cost.exact and "balanced" in cost.note
    assert cost.flops == sum(_per_group_flops([(torch.randn(2, K), torch.randn(K, N))]) for _ in range(4))


def test_fake_tensors_are_priced_like_meta() -> None:
    from dtensor_rules._upstream import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(8, K, dtype=torch.bfloat16), torch.empty(2, K, N, dtype=torch.bfloat16)
        offs = torch.tensor([4, 8], dtype=torch.int32)
        cost = estimate(GMM, a, b, offs)
    assert not cost.exact and cost.flops == 2 * 8 * K * N
    assert cost.bytes_written == 8 * N * 2  # bf16 output


INVALID = {
    "contraction 31 vs 32": lambda: (torch.randn(8, 31), torch.randn(2, 32, 8), torch.tensor([4, 8], dtype=torch.int32)),
    "int64 offs": lambda: (torch.randn(8, 32), torch.randn(2, 32, 8), torch.tensor([4, 8])),
    "2-D offs": lambda: (torch.randn(8, 32), torch.randn(2, 32, 8), torch.tensor([[4, 8]], dtype=torch.int32)),
    "no offs for 2-D x 3-D": lambda: (torch.randn(8, 32), torch.randn(2, 32, 8), None),
    "offs for 3-D x 3-D": lambda: (torch.randn(2, 8, 32), torch.randn(2, 32, 8), torch.tensor([4, 8], dtype=torch.int32)),
    "mixed dtypes": lambda: (torch.randn(8, 32), torch.randn(2, 32, 8).bfloat16(), torch.tensor([4, 8], dtype=torch.int32)),
    "misaligned stride": lambda: (torch.randn(8, 6), torch.randn(2, 6, 8), torch.tensor([4, 8], dtype=torch.int32)),
    "bias": lambda: (torch.randn(2, 8, 32), torch.randn(2, 32, 8), None, torch.randn(2, 8)),
    "out_dtype": lambda: (torch.randn(2, 8, 32).bfloat16(), torch.randn(2, 32, 8).bfloat16(), None, None, torch.float32),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_estimate_raises_what_the_op_raises(case: str) -> None:
    """An invalid call is not priced as if it ran: estimate raises the op's RuntimeError, on real and meta tensors."""
    args = INVALID[case]()
    with pytest.raises(RuntimeError):
        GMM(*args)
    with pytest.raises(RuntimeError, match="_grouped_mm"):
        estimate(GMM, *args)
    meta = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(RuntimeError, match="_grouped_mm"):
        estimate(GMM, *meta)


def test_mm_is_still_counted_by_torch() -> None:
    from torch.utils import flop_counter as fc

    assert fc.flop_registry[torch.ops.aten.mm] is fc.mm_flop
    with FlopCounterMode(display=False) as counter:
        torch.mm(torch.randn(3, 5), torch.randn(5, 7))
    assert counter.get_total_flops() == 2 * 3 * 5 * 7


def test_flop_registration_is_idempotent_and_undoable() -> None:
    from torch.utils import flop_counter as fc

    from dtensor_rules.costs.flop_counter import register_flop_formulas, unregister_flop_formulas

    packet = torch.ops.aten._grouped_mm
    first = fc.flop_registry[packet]
    assert register_flop_formulas() and fc.flop_registry[packet] is first
    before = dict(fc.flop_registry)
    try:
        unregister_flop_formulas()
        assert packet not in fc.flop_registry
        assert fc.flop_registry[torch.ops.aten.mm] is before[torch.ops.aten.mm]
    finally:
        register_flop_formulas()
    assert packet in fc.flop_registry
