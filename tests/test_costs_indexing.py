"""Gather/scatter/index/cat costs: bytes equal the touched operand sizes, computed here by hand
from the tensors (and the op's real output), independent of the formulas."""

from __future__ import annotations

import pytest
import torch

from dtensor_rules.costs import estimate

aten = torch.ops.aten


def size(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@pytest.fixture
def data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(6, 5, generator=g),
        "idx": torch.randint(0, 6, (4, 5), generator=g),
        "src": torch.randn(4, 5, generator=g).to(torch.bfloat16).float(),
        "ints": torch.randint(0, 100, (6, 5), generator=g),
    }


def test_gather_reads_index_and_gathered_elements(data: dict) -> None:
    x, idx = data["x"], data["idx"]
    out = torch.gather(x, 0, idx)
    cost = estimate(aten.gather.default, x, 0, idx)
    assert cost.bytes_read == size(idx) + out.numel() * x.element_size()
    assert cost.bytes_written == size(out)
    assert cost.flops == 0


@pytest.mark.parametrize("op,extra", [(aten.scatter_add.default, ()), (aten.scatter_reduce.two, ("sum",))])
def test_scatter_add_out_of_place(data: dict, op, extra) -> None:
    x, idx, src = data["x"], data["idx"], data["src"]
    cost = estimate(op, x, 0, idx, src, *extra)
    k = idx.numel()
    # copy of self, index, the src elements used, and a read-modify-write of k destinations
    assert cost.bytes_read == size(x) + size(idx) + k * src.element_size() + k * x.element_size()
    assert cost.bytes_written == size(x) + k * x.element_size()
    assert cost.flops == k


def test_scatter_add_inplace_skips_the_copy(data: dict) -> None:
    x, idx, src = data["x"], data["idx"], data["src"]
    k = idx.numel()
    cost = estimate(aten.scatter_add_.default, x.clone(), 0, idx, src)
    assert cost.bytes_read == size(idx) + k * (src.element_size() + x.element_size())
    assert cost.bytes_written == k * x.element_size()


def test_scatter_src_larger_than_index_reads_only_used_src(data: dict) -> None:
    x, idx = data["x"], data["idx"][:2, :3]
    src = torch.randn(6, 5)
    cost = estimate(aten.scatter.src, x, 0, idx, src)
    assert cost.bytes_read == size(x) + size(idx) + idx.numel() * src.element_size()
    assert cost.flops == 0


def test_scatter_value_reads_no_src(data: dict) -> None:
    x, idx = data["x"], data["idx"]
    cost = estimate(aten.scatter.value, x, 0, idx, 1.5)
    assert cost.bytes_read == size(x) + size(idx)


def test_index_with_integer_indices(data: dict) -> None:
    x = data["x"]
    i = torch.tensor([0, 2, 2, 5])
    out = x[i]
    cost = estimate(aten.index.Tensor, x, [i])
    assert cost.bytes_read == size(i) + size(out) and cost.bytes_written == size(out)


def test_index_with_broadcast_indices_and_none(data: dict) -> None:
    x = torch.randn(3, 4, 5, 6)
    i, j = torch.tensor([[0], [2]]), torch.tensor([1, 3, 4])
    out = aten.index.Tensor(x, [None, i, j])
    cost = estimate(aten.index.Tensor, x, [None, i, j])
    assert cost.bytes_written == size(out)
    assert cost.bytes_read == size(i) + size(j) + size(out)


def test_index_with_bool_mask_counts_true_elements(data: dict) -> None:
    x = data["x"]
    mask = x > 0
    out = x[mask]
    cost = estimate(aten.index.Tensor, x, [mask])
    coords = size(torch.nonzero(mask))  # nonzero writes (k, 2) int64 coordinates, the gather reads them
    assert coords == out.numel() * 2 * 8
    assert cost.exact and cost.bytes_written == size(out) + coords
    assert cost.bytes_read == size(mask) + coords + size(out)


def test_index_with_meta_mask_is_an_upper_bound_and_says_so(data: dict) -> None:
    x = data["x"].to("meta")
    mask = torch.empty(6, 5, dtype=torch.bool, device="meta")
    cost = estimate(aten.index.Tensor, x, [mask])
    assert not cost.exact and "upper bound" in cost.note
    assert cost.bytes_written == 30 * 4 + 30 * 2 * 8


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(data: dict, accumulate: bool) -> None:
    x = data["x"]
    i = torch.tensor([1, 4])
    values = torch.randn(2, 5)
    out = torch.index_put(x, (i,), values, accumulate)
    touched = out[i]
    cost = estimate(aten.index_put.default, x, [i], values, accumulate)
    rmw = size(touched) if accumulate else 0
    assert cost.bytes_read == size(x) + size(i) + size(values) + rmw
    assert cost.bytes_written == size(out) + size(touched)
    assert cost.flops == (touched.numel() if accumulate else 0)


def test_index_put_inplace_with_scalar_value_and_mask(data: dict) -> None:
    x = data["x"].clone()
    mask = x > 0
    value = torch.tensor(0.0)
    n_true = int(mask.sum())
    cost = estimate(aten.index_put_.default, x, [mask], value)
    coords = n_true * mask.dim() * 8
    assert cost.bytes_read == size(mask) + coords + size(value)
    assert cost.bytes_written == n_true * x.element_size() + coords


def test_slice_scatter(data: dict) -> None:
    x = data["x"]
    src = torch.randn(6, 2)
    cost = estimate(aten.slice_scatter.default, x, src, 1, 1, 5, 2)
    assert cost.bytes_read == size(x) + size(src)
    assert cost.bytes_written == size(x) + size(src)


def test_cat_promotes_and_skips_legacy_empty(data: dict) -> None:
    a, b = torch.randn(2, 3), torch.randn(4, 3, dtype=torch.float64)
    empty = torch.empty(0)
    out = torch.cat([a, empty, b])
    cost = estimate(aten.cat.default, [a, empty, b])
    assert cost.bytes_read == size(a) + size(b)
    assert cost.bytes_written == size(out)


def test_broadcast_operand_counted_once() -> None:
    x = torch.randn(5, 1).expand(5, 1000)
    idx = torch.zeros(5, 3, dtype=torch.int64)
    cost = estimate(aten.scatter.value, x, 1, idx, 0.0)
    assert cost.bytes_read == 5 * 4 + size(idx)  # stride-0 dim counted once


@pytest.mark.parametrize(
    "call",
    [
        lambda t: (aten.cumsum.default, (t["ints"] > 50, 0)),
        lambda t: (aten.sort.default, (t["ints"],)),
        lambda t: (aten.bincount.default, (t["ints"].flatten(),)),
        lambda t: (aten.scatter_add.default, (t["ints"], 0, t["idx"], t["ints"][:4])),
        lambda t: (aten.index.Tensor, (t["ints"], [t["ints"] > 50])),
        lambda t: (aten.gather.default, (t["ints"] > 3, 1, t["idx"][:, :2])),
    ],
)
def test_int64_and_bool_ops_have_bytes(data: dict, call) -> None:
    op, args = call(data)
    cost = estimate(op, *args)
    assert cost.bytes_read > 0 and cost.bytes_written > 0


def test_family_follows_access_granularity() -> None:
    x = torch.randn(64, 32)
    rows, elems = torch.tensor([3, 1, 7]), torch.tensor([[3, 1], [7, 2]])
    assert estimate(aten.index.Tensor, x, [rows]).family == "index"  # 32 contiguous floats per position
    assert estimate(aten.index.Tensor, x, [rows, rows]).family == "gather"  # single elements
    assert estimate(aten.index_put.default, x, [rows], torch.randn(3, 32), True).family == "index"
    assert estimate(aten.index_put.default, x, [elems, elems], torch.randn(2, 2), True).family == "scatter"
    assert estimate(aten.gather.default, x, 0, elems).family == "gather"
    assert estimate(aten.bincount.default, torch.tensor([0, 3, 3])).family == "scatter"
